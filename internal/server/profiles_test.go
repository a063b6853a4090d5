package server_test

import (
	"fmt"
	"testing"

	"github.com/drover/drover/internal/server/servertest"
)

// PUT /api/v1/profiles/{id} with the configuration the profile holds,
// written in any way, changes nothing: the version stays, the profile's
// devices stay synchronized and are not sent the configuration again, and
// neither the profile history nor the audit log get a row.
func TestProfilePutUnchangedKeepsVersion(t *testing.T) {
	s := servertest.Start(t, servertest.Options{})
	c := &client{t: t, s: s, url: s.URL}
	id, token := c.register("m-1")
	st, _, p := c.do("PUT", "/api/v1/profiles/1", s.AdminToken, `{"config":{"apn":"iot","mtu":1400}}`)
	if st != 200 {
		t.Fatalf("first configuration: %d %v", st, p)
	}
	version := p["version"].(float64)
	if st, _, out := c.do("POST", "/api/v1/push", token, fmt.Sprintf(state, 1, int(version))); st != 200 || out["config"] != nil {
		t.Fatalf("push with version %v applied: %d %v", version, st, out)
	}
	counts := func() (revisions, audits int) {
		t.Helper()
		_, _, h := c.do("GET", "/api/v1/profiles/1/history", s.AdminToken, nil)
		_, _, a := c.do("GET", "/api/v1/audit?object=/api/v1/profiles/1", s.AdminToken, nil)
		revs, _ := h["revisions"].([]any)
		rows, _ := a["entries"].([]any)
		return len(revs), len(rows)
	}
	revs, audits := counts()
	interval := int(p["push_interval"].(float64))
	for i, body := range []string{
		`{"config":{"apn":"iot","mtu":1400}}`,
		`{"config":{"apn":"iot","mtu":1400}}`,
		fmt.Sprintf("{\"config\": {\n  \"mtu\": 1400,\n  \"apn\": \"\\u0069ot\"\n}, \"push_interval\": %d}", interval),
		fmt.Sprintf(`{"push_interval":%d}`, interval),
	} {
		for _, method := range []string{"PUT", "PATCH"} {
			st, _, out := c.do(method, "/api/v1/profiles/1", s.AdminToken, body)
			if st != 200 || out["version"] != version || out["updated_at"] != p["updated_at"] {
				t.Fatalf("unchanged %s %d %s: %d version %v updated_at %v, want 200 with version %v and updated_at %v",
					method, i, body, st, out["version"], out["updated_at"], version, p["updated_at"])
			}
		}
	}
	if st, _, d := c.do("GET", "/api/v1/devices/"+id, s.AdminToken, nil); st != 200 || d["sync_state"] != "synchronized" {
		t.Fatalf("device after unchanged updates: %d %v", st, d["sync_state"])
	}
	if st, _, out := c.do("POST", "/api/v1/push", token, fmt.Sprintf(state, 2, int(version))); st != 200 || out["config"] != nil {
		t.Fatalf("an unchanged update sent the configuration again: %d %v", st, out)
	}
	if r, a := counts(); r != revs || a != audits {
		t.Fatalf("unchanged updates: %d new revisions, %d new audit rows; want none", r-revs, a-audits)
	}

	// A real change still counts, with its revision and audit row.
	st, _, out := c.do("PUT", "/api/v1/profiles/1", s.AdminToken, `{"config":{"apn":"iot","mtu":1500}}`)
	if st != 200 || out["version"].(float64) <= version {
		t.Fatalf("changed configuration: %d %v", st, out)
	}
	if r, a := counts(); r != revs+1 || a != audits+1 {
		t.Fatalf("a change: %d new revisions, %d new audit rows; want 1 each", r-revs, a-audits)
	}
	if st, _, d := c.do("GET", "/api/v1/devices/"+id, s.AdminToken, nil); st != 200 || d["sync_state"] != "sync_pending" {
		t.Fatalf("device after a change: %d %v", st, d["sync_state"])
	}
}

func TestProfilePolicyAPI(t *testing.T) {
	s := servertest.Start(t, servertest.Options{Quotas: true})
	c := &client{t: t, s: s, url: s.URL}
	_, token := c.register("m-1")
	c.register("m-2")
	st, _, out := c.do("GET", "/api/v1/profiles/policy", s.AdminToken, nil)
	if st != 200 || out["mode"] != "create" || out["carry"] != "inherit" || out["create_limit"] != 10.0 {
		t.Fatalf("default policy: %d %v", st, out)
	}
	if st, _, out := c.do("PUT", "/api/v1/profiles/policy", s.AdminToken, `{"mode":"sometimes"}`); st != 400 || out["error"].(map[string]any)["code"] != "invalid_field" {
		t.Fatalf("bad mode: %d %v", st, out)
	}
	if st, _, out := c.do("PUT", "/api/v1/profiles/policy", s.AdminToken, `{"mode":"join"}`); st != 200 || out["mode"] != "join" || out["carry"] != "inherit" {
		t.Fatalf("join: %d %v", st, out)
	}
	body := `{"seq":1,"config_version":0,"state":{"firmware":"7.0.0"}}`
	if st, _, out := c.do("POST", "/api/v1/push", token, body); st != 200 {
		t.Fatalf("push: %d %v", st, out)
	}
	st, _, out = c.do("GET", "/api/v1/profiles/pending", s.AdminToken, nil)
	pend, _ := out["pending"].([]any)
	if st != 200 || len(pend) != 1 || pend[0].(map[string]any)["firmware"] != "7.0.0" || pend[0].(map[string]any)["devices"] != 1.0 {
		t.Fatalf("pending: %d %v", st, out)
	}
	if st, _, _ := c.do("POST", "/api/v1/profiles/approve", s.AdminToken, `{"device_type":"ICR-3241","firmware":"9"}`); st != 404 {
		t.Fatalf("approve unknown: %d", st)
	}
	st, _, out = c.do("POST", "/api/v1/profiles/approve", s.AdminToken, `{"device_type":"ICR-3241","firmware":"7.0.0"}`)
	if st != 201 || out["firmware"] != "7.0.0" {
		t.Fatalf("approve: %d %v", st, out)
	}
	// Profile 1 (6.3.5) is used by m-2: refused; a dry-run cleanup of
	// young profiles finds nothing.
	if st, _, out := c.do("DELETE", "/api/v1/profiles/1", s.AdminToken, nil); st != 409 {
		t.Fatalf("delete in use: %d %v", st, out)
	}
	st, _, out = c.do("POST", "/api/v1/profiles/cleanup", s.AdminToken, `{"min_age":0,"dry_run":true}`)
	if del, _ := out["deleted"].([]any); st != 200 || len(del) != 0 || out["dry_run"] != true {
		t.Fatalf("cleanup: %d %v", st, out)
	}
	if st, _, _ := c.do("DELETE", "/api/v1/profiles/77", s.AdminToken, nil); st != 404 {
		t.Fatalf("delete unknown: %d", st)
	}
	if st, _, _ := c.do("POST", "/api/v1/profiles/cleanup", s.AdminToken, `{"min_age":-1}`); st != 400 {
		t.Fatalf("negative min_age: %d", st)
	}
}
