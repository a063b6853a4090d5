package server_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/drover/drover/internal/server/servertest"
)

// A query parameter the route does not declare answers 400
// unknown_parameter naming it; declared ones are read as before.
func TestUnknownQueryParameterAnswers400(t *testing.T) {
	s := servertest.Start(t, servertest.Options{})
	c := &client{t: t, s: s, url: s.URL}
	c.register("m-1")
	c.register("m-2")
	for _, tc := range []struct{ method, path, bad string }{
		{"GET", "/api/v1/devices?livenes=online", "livenes"},        // a typo must not list the whole fleet
		{"GET", "/api/v1/devices?liveness=online&order=x", "order"}, // one wrong among right ones
		{"GET", "/api/v1/devices/1?verbose=1", "verbose"},
		{"GET", "/api/v1/devices/1/history?form=2026-01-01T00:00:00Z", "form"},
		{"GET", "/api/v1/profiles?x=", "x"},
		{"POST", "/api/v1/devices/1/block?force=true", "force"},
		{"GET", "/api/v1/alerts?device=1", "device"},
		{"GET", "/api/v1/audit?user=admin", "user"},
	} {
		st, _, out := c.do(tc.method, tc.path, s.AdminToken, nil)
		e, _ := out["error"].(map[string]any)
		msg, _ := e["message"].(string)
		if st != http.StatusBadRequest || e["code"] != "unknown_parameter" || !strings.Contains(msg, tc.bad) {
			t.Errorf("%s %s: %d %v, want 400 unknown_parameter naming %q", tc.method, tc.path, st, out, tc.bad)
		}
	}
	// Refused before anything is done: the device is still active.
	if _, _, d := c.do("GET", "/api/v1/devices/1", s.AdminToken, nil); d["admission"] != "active" {
		t.Errorf("device after a refused block: %v", d)
	}
	// Declared parameters still work.
	for _, path := range []string{"/api/v1/devices?liveness=online&limit=1", "/api/v1/devices/1/history?limit=5", "/api/v1/alerts?state=active", "/api/v1/devices?label=x&label=y"} {
		if st, _, out := c.do("GET", path, s.AdminToken, nil); st != 200 {
			t.Errorf("GET %s: %d %v", path, st, out)
		}
	}
	if st, _, out := c.do("GET", "/api/v1/devices?limit=1", s.AdminToken, nil); st != 200 || len(out["devices"].([]any)) != 1 || out["next_cursor"] == nil {
		t.Errorf("limit=1: %d %v", st, out)
	}
	// Without a valid token the answer is 401, whatever the query.
	if st, _, _ := c.do("GET", "/api/v1/devices?livenes=online", "", nil); st != http.StatusUnauthorized {
		t.Errorf("no token: %d, want 401", st)
	}
}
