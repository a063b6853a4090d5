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

// Every paged list takes limit and cursor and answers next_cursor (the
// older names after and before stay as aliases): walking the devices and
// the alerts lists one item at a time visits each once.
func TestOnePaginationStyle(t *testing.T) {
	s := servertest.Start(t, servertest.Options{})
	c := &client{t: t, s: s, url: s.URL}
	for _, m := range []string{"m-1", "m-2", "m-3"} {
		c.register(m)
	}
	walk := func(path, list string) int {
		t.Helper()
		seen, cur := 0, ""
		for range 10 {
			p := path + "?limit=1"
			if cur != "" {
				p += "&cursor=" + cur
			}
			st, _, out := c.do("GET", p, s.AdminToken, nil)
			if st != 200 {
				t.Fatalf("GET %s: %d %v", p, st, out)
			}
			seen += len(out[list].([]any))
			next, _ := out["next_cursor"].(string)
			if next == "" {
				return seen
			}
			cur = next
		}
		t.Fatalf("%s: no end", path)
		return 0
	}
	if n := walk("/api/v1/devices", "devices"); n != 3 {
		t.Errorf("devices walked: %d, want 3", n)
	}
	for _, id := range []string{"1", "2"} {
		if st, _, out := c.do("POST", "/api/v1/devices/"+id+"/block", s.AdminToken, nil); st != 200 {
			t.Fatalf("block: %d %v", st, out)
		}
	}
	if n := walk("/api/v1/audit", "entries"); n != 2 {
		t.Errorf("audit walked: %d entries, want 2", n)
	}
	for _, path := range []string{"/api/v1/alerts?cursor=5&before=5", "/api/v1/commands/1/devices?cursor=1&after=1"} {
		if st, _, out := c.do("GET", path, s.AdminToken, nil); st != 400 {
			t.Errorf("GET %s: %d %v, want 400 (the same thing twice)", path, st, out)
		}
	}
}
