package server_test

import (
	"encoding/json"
	"testing"

	"github.com/drover/drover/internal/server/servertest"
)

// ?dry_run=1 on every change that takes it: a valid request answers 200
// with what it would make, an invalid one the error the change gets, and
// neither changes the object or writes an audit row.
func TestDryRun(t *testing.T) {
	s := servertest.Start(t, servertest.Options{})
	c := &client{t: t, s: s, url: s.URL}
	id, _ := c.register("m-1")
	admin := s.AdminToken
	op := userToken(c, "otto", "operator")
	if st, _, out := c.do("PUT", "/api/v1/labels/north", op, `{"filter":"device_type = \"ICR-3241\""}`); st != 200 {
		t.Fatalf("label: %d %v", st, out)
	}
	if st, _, out := c.do("POST", "/api/v1/alerts/rules", op, `{"name":"hot","kind":"temperature_above","threshold":70}`); st != 201 {
		t.Fatalf("rule: %d %v", st, out)
	}
	// A schema the device layer below must meet.
	if st, _, out := c.do("PUT", "/api/v1/device-types/ICR-3241/schema", op, `{"values":{"type":"object","properties":{"level":{"type":"integer"}}}}`); st != 200 {
		t.Fatalf("schema: %d %v", st, out)
	}
	snapshot := func() string {
		t.Helper()
		var all []any
		for _, p := range []string{"/api/v1/profiles", "/api/v1/profiles/policy", "/api/v1/labels", "/api/v1/config/layers", "/api/v1/alerts/rules", "/api/v1/users", "/api/v1/audit"} {
			st, _, out := c.do("GET", p, admin, nil)
			if st != 200 {
				t.Fatalf("GET %s: %d %v", p, st, out)
			}
			all = append(all, out)
		}
		b, _ := json.Marshal(all)
		return string(b)
	}
	before := snapshot()
	for _, tc := range []struct {
		method, path, token, body string
		status                    int
		field, want               string // a member of the answer and its value
	}{
		{"PATCH", "/api/v1/profiles/1", op, `{"config":{"apn":"iot"},"push_interval":90}`, 200, "push_interval", "90"},
		{"PATCH", "/api/v1/profiles/1", op, `{"push_interval":0}`, 400, "", ""},
		{"PUT", "/api/v1/profiles/1", op, `{"config":{"a":1}}`, 200, "config", `{"a":1}`},
		{"PATCH", "/api/v1/profiles/99", op, `{"push_interval":60}`, 404, "", ""},
		{"PUT", "/api/v1/profiles/policy", op, `{"mode":"join"}`, 200, "mode", `"join"`},
		{"PUT", "/api/v1/profiles/policy", op, `{"mode":"sometimes"}`, 400, "", ""},
		{"PUT", "/api/v1/devices/" + id + "/config", op, `{"values":{"a":"${device.machine_id}"}}`, 200, "rev", "1"},
		{"PUT", "/api/v1/devices/" + id + "/config", op, `{"values":{"a":"${device.nope}"}}`, 400, "", ""},
		{"PUT", "/api/v1/devices/" + id + "/config", op, `{"values":{"level":"high"}}`, 422, "", ""},
		{"PUT", "/api/v1/labels/north/config", op, `{"values":{"level":"high"}}`, 422, "", ""},
		{"PATCH", "/api/v1/profiles/1", op, `{"config":{"level":"high"}}`, 422, "", ""},
		{"PUT", "/api/v1/labels/north/config", op, `{"values":{"b":2},"priority":4}`, 200, "priority", "4"},
		{"PUT", "/api/v1/labels/nobody/config", op, `{"values":{}}`, 404, "", ""},
		{"PUT", "/api/v1/device-types/test/schema", op, `{"values":{"type":"object"}}`, 200, "kind", `"schema"`},
		{"PUT", "/api/v1/device-types/test/schema", op, `{"values":{"type":12}}`, 400, "", ""},
		{"PUT", "/api/v1/labels/north", op, `{"filter":"device_type=other"}`, 200, "filter", `"device_type = \"other\""`},
		{"PUT", "/api/v1/labels/south", op, `{"filter":"state.temperature >"}`, 400, "", ""},
		{"POST", "/api/v1/alerts/rules", op, `{"name":"cold","kind":"temperature_above","threshold":-10}`, 200, "pushes", "1"},
		{"POST", "/api/v1/alerts/rules", op, `{"name":"hot","kind":"offline"}`, 409, "", ""},
		{"PUT", "/api/v1/alerts/rules/1", op, `{"name":"hot","kind":"temperature_above","threshold":80}`, 200, "threshold", "80"},
		{"PUT", "/api/v1/alerts/rules/1", op, `{"name":"hot","kind":"temperature_above","threshold":5000}`, 400, "", ""},
		{"PUT", "/api/v1/alerts/rules/77", op, `{"name":"x","kind":"offline"}`, 404, "", ""},
		{"POST", "/api/v1/users", admin, `{"name":"alice","role":"viewer"}`, 200, "role", `"viewer"`},
		{"POST", "/api/v1/users", admin, `{"name":"otto","role":"viewer"}`, 409, "", ""},
		{"POST", "/api/v1/users", op, `{"name":"alice","role":"viewer"}`, 403, "", ""},
		{"PATCH", "/api/v1/users/otto", admin, `{"role":"admin"}`, 200, "role", `"admin"`},
		{"PATCH", "/api/v1/users/nobody", admin, `{"role":"admin"}`, 404, "", ""},
	} {
		for _, q := range []string{"?dry_run=1", "?dry_run=true"} {
			st, _, out := c.do(tc.method, tc.path+q, tc.token, tc.body)
			if st != tc.status {
				t.Errorf("%s %s%s: %d %v, want %d", tc.method, tc.path, q, st, out, tc.status)
				continue
			}
			if tc.field != "" {
				got, _ := json.Marshal(out[tc.field])
				if string(got) != tc.want {
					t.Errorf("%s %s%s: %s is %s, want %s", tc.method, tc.path, q, tc.field, got, tc.want)
				}
			}
		}
	}
	if after := snapshot(); after != before {
		t.Fatalf("a dry run changed the server:\n%s\n%s", before, after)
	}
	if st, _, out := c.do("PATCH", "/api/v1/profiles/1?dry_run=maybe", op, `{"push_interval":60}`); st != 400 {
		t.Fatalf("dry_run=maybe: %d %v", st, out)
	}
	if st, _, out := c.do("DELETE", "/api/v1/labels/north?dry_run=1", op, nil); st != 400 {
		t.Fatalf("dry_run where it is not taken: %d %v", st, out)
	}
}
