package server_test

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/drover/drover/internal/server/servertest"
)

// stagedServer is a server with two devices that pushed once, a viewer's
// and an operator's token.
func stagedServer(t *testing.T) (s *servertest.Server, c *client, tokens []string, view, op string) {
	s = servertest.Start(t, servertest.Options{})
	c = &client{t: t, s: s, url: s.URL}
	for i, m := range []string{"m-1", "m-2"} {
		_, tok := c.register(m)
		tokens = append(tokens, tok)
		c.do("POST", "/api/v1/push", tok, fmt.Sprintf(state, i+1, 0))
	}
	return s, c, tokens, userToken(c, "vera", "viewer"), userToken(c, "otto", "operator")
}

// A label's new values staged as a rollout through the API: refused
// requests change nothing, the canary's push answer carries the new
// values and the other device's does not, the layer refuses other
// changes meanwhile, the canary's failed apply pauses the rollout, abort
// gives the previous values back; every change has its audit row.
func TestConfigRolloutAPI(t *testing.T) {
	s, c, tokens, view, op := stagedServer(t)
	if st, _, out := c.do("POST", "/api/v1/labels/assign", op, `{"label":"g","filter":{}}`); st != 200 {
		t.Fatalf("assign: %d %v", st, out)
	}
	if st, _, out := c.do("PUT", "/api/v1/labels/g/config", op, `{"values":{"x":1}}`); st != 200 {
		t.Fatalf("values: %d %v", st, out)
	}
	path := "/api/v1/labels/g/config/rollout"
	for _, tc := range []struct {
		path, token, body string
		want              int
	}{
		{path, view, `{"values":{"x":2}}`, 403},
		{path, op, `{"waves":["1"]}`, 400},
		{path, op, `{"values":[2]}`, 400},
		{path, op, `{"values":{"x":2},"firmware_id":"1"}`, 400},
		{path, op, `{"values":{"x":2},"waves":["0"]}`, 400},
		{"/api/v1/labels/nobody/config/rollout", op, `{"values":{"x":2}}`, 404},
		{path, op, `{"values":{"x":2},"filter":"q=nobody"}`, 409},
	} {
		if st, _, out := c.do("POST", tc.path, tc.token, tc.body); st != tc.want {
			t.Fatalf("%s %s: %d %v, want %d", tc.path, tc.body, st, out, tc.want)
		}
	}
	if _, _, out := c.do("GET", "/api/v1/rollouts", view, nil); len(out["rollouts"].([]any)) != 0 {
		t.Fatalf("a refused rollout was kept: %v", out)
	}
	st, _, ro := c.do("POST", path, op, `{"values":{"x":2},"waves":["1","100%"],"max_failure_pct":10}`)
	if cfg, _ := ro["config"].(map[string]any); st != 201 || ro["kind"] != "config" || ro["total"] != 2.0 || cfg["from_rev"] != 1.0 || cfg["to_rev"] != 2.0 {
		t.Fatalf("create: %d %v", st, ro)
	}
	if st, _, out := c.do("PUT", "/api/v1/labels/g/config", op, `{"values":{"x":3}}`); st != 409 {
		t.Fatalf("values changed while staged: %d %v", st, out)
	}
	if err := s.Srv.Fleet().RolloutStep(t.Context()); err != nil {
		t.Fatal(err)
	}
	_, _, page := c.do("GET", "/api/v1/rollouts/1/devices", view, nil)
	ds := page["devices"].([]any)
	canary := ds[0].(map[string]any)["device_id"].(string)
	x := func(ans map[string]any) string {
		conf, _ := ans["config"].(map[string]any)
		b, _ := json.Marshal(conf["data"])
		return string(b)
	}
	var canaryVersion float64
	for i, tok := range tokens {
		_, _, ans := c.do("POST", "/api/v1/push", tok, fmt.Sprintf(state, 10, 0))
		want := `{"x":1}`
		if fmt.Sprint(i+1) == canary {
			want = `{"x":2}`
			canaryVersion = ans["config"].(map[string]any)["version"].(float64)
		}
		if x(ans) != want {
			t.Fatalf("device %d in wave 1: %v, want %s", i+1, ans, want)
		}
	}
	// The canary fails to apply: paused at the next step.
	for i, tok := range tokens {
		if fmt.Sprint(i+1) == canary {
			c.do("POST", "/api/v1/push", tok, fmt.Sprintf(`{"seq":11,"config_version":0,"config_error":"x must be odd","state":{"firmware":"6.3.5"}}`))
		}
	}
	if err := s.Srv.Fleet().RolloutStep(t.Context()); err != nil {
		t.Fatal(err)
	}
	st, _, ro = c.do("GET", "/api/v1/rollouts/1", view, nil)
	if counts, _ := ro["counts"].(map[string]any); st != 200 || ro["state"] != "paused" || counts["failed"] != 1.0 || ro["wave"] != 1.0 {
		t.Fatalf("after the failed apply: %d %v", st, ro)
	}
	if st, _, out := c.do("POST", "/api/v1/rollouts/1/abort", op, nil); st != 200 || out["state"] != "aborted" {
		t.Fatalf("abort: %d %v", st, out)
	}
	for i, tok := range tokens {
		_, _, ans := c.do("POST", "/api/v1/push", tok, fmt.Sprintf(state, 20, int64(canaryVersion)))
		if got := x(ans); got != `{"x":1}` {
			t.Fatalf("device %d after abort: %v", i+1, ans)
		}
	}
	st, _, out := c.do("GET", "/api/v1/labels/g/config", view, nil)
	if st != 200 || out["rev"] != 3.0 || out["note"] != "rollout 1 aborted: back to revision 1" {
		t.Fatalf("layer after abort: %d %v", st, out)
	}
	st, _, audit := c.do("GET", "/api/v1/audit?actor=otto", s.AdminToken, nil)
	actions := map[string]bool{}
	for _, e := range audit["entries"].([]any) {
		actions[e.(map[string]any)["action"].(string)] = true
	}
	if st != 200 || !actions["POST /api/v1/labels/{name}/config/rollout"] || !actions["POST /api/v1/rollouts/{id}/abort"] {
		t.Fatalf("audit: %d %v", st, audit)
	}
}

// A profile's new configuration staged as a rollout through the API: the
// canary's push answer carries it, the other device's nothing; the
// profile's configuration takes no other change meanwhile.
func TestProfileRolloutAPI(t *testing.T) {
	s, c, tokens, view, op := stagedServer(t)
	path := "/api/v1/profiles/1/rollout"
	for _, tc := range []struct {
		path, token, body string
		want              int
	}{
		{path, view, `{"config":{"a":1}}`, 403},
		{path, op, `{"waves":["1"]}`, 400},
		{path, op, `{"config":{"a":1},"values":{}}`, 400},
		{"/api/v1/profiles/99/rollout", op, `{"config":{"a":1}}`, 404},
	} {
		if st, _, out := c.do("POST", tc.path, tc.token, tc.body); st != tc.want {
			t.Fatalf("%s %s: %d %v, want %d", tc.path, tc.body, st, out, tc.want)
		}
	}
	st, _, ro := c.do("POST", path, op, `{"config":{"a":1},"waves":["1","100%"]}`)
	if cfg, _ := ro["config"].(map[string]any); st != 201 || ro["kind"] != "config" || cfg["profile_id"] != "1" || ro["total"] != 2.0 {
		t.Fatalf("create: %d %v", st, ro)
	}
	if st, _, out := c.do("PATCH", "/api/v1/profiles/1", op, `{"config":{"a":2}}`); st != 409 {
		t.Fatalf("profile changed while staged: %d %v", st, out)
	}
	if err := s.Srv.Fleet().RolloutStep(t.Context()); err != nil {
		t.Fatal(err)
	}
	_, _, page := c.do("GET", "/api/v1/rollouts/1/devices", view, nil)
	canary := page["devices"].([]any)[0].(map[string]any)["device_id"].(string)
	for i, tok := range tokens {
		_, _, ans := c.do("POST", "/api/v1/push", tok, fmt.Sprintf(state, 10, 0))
		conf, _ := ans["config"].(map[string]any)
		data, _ := json.Marshal(conf["data"])
		if fmt.Sprint(i+1) == canary {
			if string(data) != `{"a":1}` {
				t.Fatalf("canary: %v", ans)
			}
		} else if conf != nil {
			t.Fatalf("device %d not released got %v", i+1, ans)
		}
	}
	if st, _, out := c.do("POST", "/api/v1/rollouts/1/abort", op, nil); st != 200 || out["state"] != "aborted" {
		t.Fatalf("abort: %d %v", st, out)
	}
	if st, _, out := c.do("PATCH", "/api/v1/profiles/1", op, `{"config":{"a":2}}`); st != 200 {
		t.Fatalf("profile change after the rollout: %d %v", st, out)
	}
}

// ?dry_run=1 on both configuration rollout routes: a valid request
// answers 200 with the rollout it would start, an invalid one the error
// the rollout itself gets, and neither starts a rollout, changes the
// label's values or the profile, or writes an audit row; a label another
// rollout stages is refused 409 as the rollout would be.
func TestConfigRolloutDryRun(t *testing.T) {
	s, c, _, view, op := stagedServer(t)
	for _, rq := range []struct{ method, path, body string }{
		{"POST", "/api/v1/labels/assign", `{"label":"g","filter":{}}`},
		{"PUT", "/api/v1/labels/g/config", `{"values":{"x":1}}`},
		{"PUT", "/api/v1/device-types/ICR-3241/schema", `{"values":{"type":"object","properties":{"x":{"type":"integer"}}}}`},
		{"PUT", "/api/v1/rollout-policies/slow", `{"waves":["1","50%"]}`},
	} {
		if st, _, out := c.do(rq.method, rq.path, op, rq.body); st != 200 && st != 201 {
			t.Fatalf("%s %s: %d %v", rq.method, rq.path, st, out)
		}
	}
	snapshot := func() string {
		t.Helper()
		var all []any
		for _, p := range []string{"/api/v1/rollouts", "/api/v1/labels/g/config", "/api/v1/config/layers", "/api/v1/profiles/1", "/api/v1/audit"} {
			st, _, out := c.do("GET", p, s.AdminToken, nil)
			if st != 200 {
				t.Fatalf("GET %s: %d %v", p, st, out)
			}
			all = append(all, out)
		}
		b, _ := json.Marshal(all)
		return string(b)
	}
	label, profile := "/api/v1/labels/g/config/rollout", "/api/v1/profiles/1/rollout"
	before := snapshot()
	for _, tc := range []struct {
		path, body  string
		field, want string // a member of the answer and its value
	}{
		{label, `{"values":{"x":2},"waves":["1","100%"],"max_failure_pct":10}`, "waves", `["1","100%"]`},
		{label, `{"values":{"x":2}}`, "id", `"0"`},
		{label, `{"values":{"x":2}}`, "total", "2"},
		{label, `{"values":{"x":2}}`, "kind", `"config"`},
		{label, `{"values":{"x":2}}`, "config", `{"from_rev":1,"label":"g","previous":{"x":1},"values":{"x":2}}`},
		{label, `{"values":{"x":2},"policy":"slow"}`, "waves", `["1","50%"]`},
		{profile, `{"config":{"x":5}}`, "total", "2"},
		{profile, `{"config":{"x":5},"policy":"slow"}`, "waves", `["1","50%"]`},
	} {
		st, _, out := c.do("POST", tc.path+"?dry_run=1", op, tc.body)
		got, _ := json.Marshal(out[tc.field])
		if st != 200 || string(got) != tc.want {
			t.Errorf("dry run %s %s: %d, %s is %s, want 200 and %s (%v)", tc.path, tc.body, st, tc.field, got, tc.want, out)
		}
	}
	refused := []struct {
		path, token, body string
		want              int
	}{
		{label, view, `{"values":{"x":2}}`, 403},
		{label, op, `{"waves":["1"]}`, 400},
		{label, op, `{"values":{"x":2},"waves":["0"]}`, 400},
		{label, op, `{"values":{"x":2},"policy":"slow","waves":["100%"]}`, 400},
		{label, op, `{"values":{"x":2},"policy":"nothing"}`, 400},
		{label, op, `{"values":{"x":"high"}}`, 422},
		{label, op, `{"values":{"x":2},"filter":"q=nobody"}`, 409},
		{"/api/v1/labels/nobody/config/rollout", op, `{"values":{"x":2}}`, 404},
		{profile, op, `{"config":{"x":"high"}}`, 422},
		{"/api/v1/profiles/99/rollout", op, `{"config":{"x":1}}`, 404},
	}
	for _, tc := range refused {
		if st, _, out := c.do("POST", tc.path+"?dry_run=1", tc.token, tc.body); st != tc.want {
			t.Errorf("dry run %s %s: %d %v, want %d", tc.path, tc.body, st, out, tc.want)
		}
	}
	if st, _, out := c.do("POST", label+"?dry_run=maybe", op, `{"values":{"x":2}}`); st != 400 {
		t.Errorf("dry_run=maybe: %d %v", st, out)
	}
	if after := snapshot(); after != before {
		t.Fatalf("a dry run changed the server:\n%s\n%s", before, after)
	}
	// The same requests without dry_run get the same errors.
	for _, tc := range refused {
		if st, _, out := c.do("POST", tc.path, tc.token, tc.body); st != tc.want {
			t.Errorf("%s %s: %d %v, want %d", tc.path, tc.body, st, out, tc.want)
		}
	}
	// Staged: a dry run of the label is refused as a second rollout is.
	if st, _, out := c.do("POST", label, op, `{"values":{"x":2}}`); st != 201 {
		t.Fatalf("create: %d %v", st, out)
	}
	for _, q := range []string{"?dry_run=1", ""} {
		if st, _, out := c.do("POST", label+q, op, `{"values":{"x":3}}`); st != 409 {
			t.Errorf("rollout%s of a staged label: %d %v, want 409", q, st, out)
		}
	}
	if _, _, out := c.do("GET", "/api/v1/rollouts", view, nil); len(out["rollouts"].([]any)) != 1 {
		t.Fatalf("rollouts: %v", out)
	}
}
