package server_test

import (
	"fmt"
	"strings"
	"testing"
)

// Rollout policies through the API: refused writes change nothing, a
// dry run stores nothing, PUT creates then replaces; rollouts of both
// kinds start by naming one (not together with an inline plan), keep the
// plan they started with when the policy changes or goes; every change
// has its audit row.
func TestRolloutPoliciesAPI(t *testing.T) {
	s, c, _, view, op := stagedServer(t)
	path := "/api/v1/rollout-policies/slow"
	for _, tc := range []struct {
		method, path, token, body string
		want                      int
	}{
		{"PUT", path, view, `{"waves":["1"]}`, 403},
		{"PUT", path, op, `{"waves":["0"]}`, 400},
		{"PUT", path, op, `{"stall_timeout":5}`, 400},
		{"PUT", path, op, `{"name":"fast"}`, 400},
		{"PUT", path, op, `{"filter":"label=x"}`, 400},
		{"PUT", "/api/v1/rollout-policies/Bad%20Name", op, `{}`, 400},
		{"PUT", path + "?dry_run=1", op, `{"waves":["1","100%"]}`, 200},
		{"DELETE", path, op, ``, 404},
		{"GET", path, view, ``, 404},
	} {
		var body any
		if tc.body != "" {
			body = tc.body
		}
		if st, _, out := c.do(tc.method, tc.path, tc.token, body); st != tc.want {
			t.Fatalf("%s %s %s: %d %v, want %d", tc.method, tc.path, tc.body, st, out, tc.want)
		}
	}
	if _, _, out := c.do("GET", "/api/v1/rollout-policies", view, nil); len(out["policies"].([]any)) != 0 {
		t.Fatalf("a refused or dry-run policy was kept: %v", out)
	}
	st, _, p := c.do("PUT", path, op, `{"waves":["1","100%"],"max_failure_pct":5,"window":{"start":"22:00","end":"04:00"}}`)
	if st != 201 || p["name"] != "slow" || p["max_failure_pct"] != 5.0 || p["stall_timeout"] != 3600.0 || p["by"] == "" {
		t.Fatalf("create: %d %v", st, p)
	}
	if st, _, p := c.do("PUT", path, op, `{"name":"slow","waves":["1","50%"],"max_failure_pct":5}`); st != 200 || fmt.Sprint(p["waves"]) != "[1 50%]" {
		t.Fatalf("replace: %d %v", st, p)
	}
	if st, _, p := c.do("GET", path, view, nil); st != 200 || fmt.Sprint(p["waves"]) != "[1 50%]" || p["window"] != nil {
		t.Fatalf("get: %d %v", st, p)
	}

	// A firmware to roll out, and a label for a configuration rollout.
	ref := `{"device_type":"ICR-3241","version":"9.9.9","sha256":"` + strings.Repeat("a", 64) + `","size":10,"url":"https://cdn.example/fw.bin"}`
	if resp, b := c.raw("POST", "/api/v1/firmware", s.AdminToken, []byte(ref), map[string]string{"Content-Type": "application/json"}); resp.StatusCode != 201 {
		t.Fatalf("firmware: %d %s", resp.StatusCode, b)
	}
	if st, _, out := c.do("POST", "/api/v1/labels/assign", op, `{"label":"g","filter":{}}`); st != 200 {
		t.Fatalf("assign: %d %v", st, out)
	}
	for _, tc := range []struct{ path, body, want string }{
		{"/api/v1/rollouts", `{"firmware_id":"1","policy":"slow","waves":["100%"]}`, "not both"},
		{"/api/v1/rollouts", `{"firmware_id":"1","policy":"slow","max_downloads":3}`, "not both"},
		{"/api/v1/rollouts", `{"firmware_id":"1","policy":"nothing"}`, "no rollout policy"},
		{"/api/v1/labels/g/config/rollout", `{"values":{"x":1},"policy":"slow","stall_timeout":600}`, "not both"},
		{"/api/v1/labels/g/config/rollout", `{"values":{"x":1},"policy":"nothing"}`, "no rollout policy"},
	} {
		if st, _, out := c.do("POST", tc.path, op, tc.body); st != 400 || !strings.Contains(fmt.Sprint(out), tc.want) {
			t.Fatalf("%s %s: %d %v, want 400 %q", tc.path, tc.body, st, out, tc.want)
		}
	}
	if _, _, out := c.do("GET", "/api/v1/rollouts", view, nil); len(out["rollouts"].([]any)) != 0 {
		t.Fatalf("a refused rollout was kept: %v", out)
	}
	st, _, fw := c.do("POST", "/api/v1/rollouts", op, `{"firmware_id":"1","policy":"slow"}`)
	if st != 201 || fw["policy"] != "slow" || fmt.Sprint(fw["waves"]) != "[1 50%]" || fw["max_failure_pct"] != 5.0 {
		t.Fatalf("firmware rollout by policy: %d %v", st, fw)
	}
	st, _, cr := c.do("POST", "/api/v1/labels/g/config/rollout", op, `{"values":{"x":1},"policy":"slow","filter":"liveness=online"}`)
	if st != 201 || cr["policy"] != "slow" || fmt.Sprint(cr["waves"]) != "[1 50%]" || cr["kind"] != "config" {
		t.Fatalf("configuration rollout by policy: %d %v", st, cr)
	}

	// A later change, then the deletion, leave the rollouts' plans as
	// they were.
	if st, _, p := c.do("PUT", path, op, `{"waves":["100%"],"max_failure_pct":50}`); st != 200 {
		t.Fatalf("change: %d %v", st, p)
	}
	if st, _, out := c.do("DELETE", path+"?dry_run=1", op, nil); st != 200 {
		t.Fatalf("delete dry run: %d %v", st, out)
	}
	if st, _, out := c.do("DELETE", path, op, nil); st != 200 || out["deleted"] != "slow" {
		t.Fatalf("delete: %d %v", st, out)
	}
	if st, _, out := c.do("GET", path, view, nil); st != 404 {
		t.Fatalf("deleted policy: %d %v", st, out)
	}
	for _, id := range []any{fw["id"], cr["id"]} {
		if st, _, ro := c.do("GET", fmt.Sprint("/api/v1/rollouts/", id), view, nil); st != 200 || ro["policy"] != "slow" || fmt.Sprint(ro["waves"]) != "[1 50%]" || ro["max_failure_pct"] != 5.0 {
			t.Fatalf("rollout %v after the policy changed: %d %v", id, st, ro)
		}
	}
	st, _, audit := c.do("GET", "/api/v1/audit?actor=otto", s.AdminToken, nil)
	actions := map[string]int{}
	for _, e := range audit["entries"].([]any) {
		actions[e.(map[string]any)["action"].(string)]++
	}
	if st != 200 || actions["PUT /api/v1/rollout-policies/{name}"] != 3 || actions["DELETE /api/v1/rollout-policies/{name}"] != 1 {
		t.Fatalf("audit: %d %v", st, actions)
	}
}
