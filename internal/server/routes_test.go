package server_test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/internal/fleet"
	"github.com/drover/drover/internal/server"
	"github.com/drover/drover/internal/server/servertest"
)

// A path of the table asked with another method gets 405 with Allow and the
// JSON error body; an unknown path 404.
func TestWrongMethodAnswers405WithAllow(t *testing.T) {
	s := servertest.Start(t, servertest.Options{})
	c := &client{t: t, s: s, url: s.URL}
	for _, tc := range []struct{ method, path, token, allow string }{
		{"GET", "/api/v1/push", "", "POST"},
		{"DELETE", "/api/v1/register", "", "POST"},
		{"POST", "/api/v1/devices", s.AdminToken, "GET, HEAD"},
		{"POST", "/api/v1/devices/7", s.AdminToken, "GET, HEAD, DELETE"},
		{"POST", "/api/v1/profiles/1", s.AdminToken, "GET, HEAD, PUT, PATCH, DELETE"},
		{"PATCH", "/api/v1/alerts/rules/3", s.AdminToken, "GET, HEAD, PUT, DELETE"},
		{"POST", "/healthz", "", "GET, HEAD"},
		{"POST", "/metrics", "", "GET, HEAD"},
	} {
		st, h, out := c.do(tc.method, tc.path, tc.token, nil)
		e, _ := out["error"].(map[string]any)
		if st != http.StatusMethodNotAllowed || h.Get("Allow") != tc.allow || e == nil || e["code"] != "method_not_allowed" {
			t.Errorf("%s %s: %d Allow %q %v, want 405 Allow %q", tc.method, tc.path, st, h.Get("Allow"), out, tc.allow)
		}
	}
	if st, h, out := c.do("GET", "/api/v1/devices/7/nothing", s.AdminToken, nil); st != 404 || h.Get("Allow") != "" {
		t.Errorf("unknown path: %d %v", st, out)
	}
	if v := s.Metric("drover_request_errors_total", map[string]string{"endpoint": "other", "status": "405", "code": "method_not_allowed"}); v != 8 {
		t.Errorf("405 counted %v, want 8", v)
	}
}

// The debug (pprof) server serves while the server runs and is shut down,
// listener and open connections, when Serve returns.
func TestDebugServerShutDownWithServe(t *testing.T) {
	s := servertest.Start(t, servertest.Options{Configure: func(c *server.Config) { c.DebugListen = "127.0.0.1:0" }})
	addr := s.Srv.DebugAddr()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rd := bufio.NewReader(conn)
	get := func() (*http.Response, error) {
		conn.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := conn.Write([]byte("GET /debug/pprof/cmdline HTTP/1.1\r\nHost: x\r\n\r\n")); err != nil {
			return nil, err
		}
		resp, err := http.ReadResponse(rd, nil)
		if err == nil {
			_, err = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		return resp, err
	}
	if resp, err := get(); err != nil || resp.StatusCode != 200 {
		t.Fatalf("pprof: %v %v", resp, err)
	}
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	if resp, err := get(); err == nil {
		t.Fatalf("debug server still answers on an open connection after Serve returned: %d", resp.StatusCode)
	}
	if c, err := net.Dial("tcp", addr); err == nil {
		c.Close()
		t.Fatalf("debug listener %s still accepts connections after Serve returned", addr)
	}
}

// The operator API applies the fleet's rules with the fleet's messages, as
// the dashboard does.
func TestOperatorInputRules(t *testing.T) {
	s := servertest.Start(t, servertest.Options{})
	c := &client{t: t, s: s, url: s.URL}
	c.register("m-1")
	big := `{"a":"` + strings.Repeat("x", fleet.MaxConfigBytes) + `"}` // under the 64 KiB body limit
	_, bigErr := fleet.NormalizeConfig([]byte(big))
	_, filterErr := s.Srv.Fleet().ParseFilter(url.Values{"sync_state": {"bogus"}})
	for _, tc := range []struct {
		method, path string
		body         any
		want         string
	}{
		{"PUT", "/api/v1/profiles/1", `{"config":` + big + `}`, bigErr.Error()},
		{"PATCH", "/api/v1/profiles/1", `{"push_interval":0}`, fleet.CheckPushInterval(0).Error()},
		{"PUT", "/api/v1/profiles/1", `{"push_interval":604801}`, fleet.CheckPushInterval(604801).Error()},
		{"GET", "/api/v1/devices?sync_state=bogus", nil, filterErr.Error()},
		{"GET", "/api/v1/devices?cursor=x", nil, "cursor must be a next_cursor value"},
		{"POST", "/api/v1/labels/assign", `{"label":"north","filter":{"sync_state":"bogus"}}`, filterErr.Error()},
	} {
		st, _, out := c.do(tc.method, tc.path, s.AdminToken, tc.body)
		e, _ := out["error"].(map[string]any)
		if st != 400 || e == nil || e["code"] != "invalid_field" || e["message"] != tc.want {
			t.Errorf("%s %s: %d %v, want 400 invalid_field %q", tc.method, tc.path, st, out, tc.want)
		}
	}
	if _, _, p := c.do("GET", "/api/v1/profiles/1", s.AdminToken, nil); p["version"] != 0.0 || p["push_interval"] != 200.0 {
		t.Fatalf("refused updates changed the profile: %v", p)
	}
}
