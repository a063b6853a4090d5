package server_test

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/drover/drover/internal/server/servertest"
)

type client struct {
	t   *testing.T
	s   *servertest.Server
	url string
}

func (c *client) do(method, path, token string, body any) (int, http.Header, map[string]any) {
	c.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	case []byte:
		rd = bytes.NewReader(b)
	default:
		j, _ := json.Marshal(b)
		rd = bytes.NewReader(j)
	}
	req, _ := http.NewRequest(method, c.url+path, rd)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.s.Client().Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var out map[string]any
	if err := json.Unmarshal(raw, &out); err != nil {
		c.t.Fatalf("%s %s: answer is not JSON: %q", method, path, raw)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		c.t.Fatalf("%s %s: content type %q", method, path, ct)
	}
	return resp.StatusCode, resp.Header, out
}

func (c *client) register(machine string) (id, token string) {
	c.t.Helper()
	st, _, out := c.do("POST", "/api/v1/register", "", map[string]string{
		"machine_id": machine, "device_type": "ICR-3241", "firmware": "6.3.5", "enrollment_secret": c.s.EnrollmentSecret,
	})
	if st != 200 {
		c.t.Fatalf("register: %d %v", st, out)
	}
	return out["device_id"].(string), out["token"].(string)
}

const state = `{"seq":%d,"config_version":%d,"state":{"uptime":100,"cpu":5,"temperature":41.5,"interfaces":[{"name":"wwan0","rx_bytes":10,"tx_bytes":20}],"signal":{"rssi":-70,"technology":"LTE"}}}`

func TestBadInputGetsJSON4xxAndIsCounted(t *testing.T) {
	s := servertest.Start(t, servertest.Options{})
	c := &client{t: t, s: s, url: s.URL}
	_, token := c.register("m-1")
	big := `{"seq":1,"state":{"extra":{"a":"` + strings.Repeat("x", 70000) + `"}}}`
	cases := []struct {
		name, path, token, body string
		status                  int
		code                    string
	}{
		{"malformed", "/api/v1/push", token, `{"seq":`, 400, "malformed_json"},
		{"wrong type", "/api/v1/push", token, `{"seq":1,"state":{"cpu":"hot"}}`, 400, "invalid_field"},
		{"oversize", "/api/v1/push", token, big, 413, "body_too_large"},
		{"no auth", "/api/v1/push", "", fmt.Sprintf(state, 1, 0), 401, "unauthorized"},
		{"wrong token", "/api/v1/push", token + "x", fmt.Sprintf(state, 1, 0), 401, "unauthorized"},
		{"unknown device", "/api/v1/push", "999.abcdef", fmt.Sprintf(state, 1, 0), 401, "unauthorized"},
		{"register wrong secret", "/api/v1/register", "", `{"machine_id":"x","device_type":"t","firmware":"f","enrollment_secret":"nope"}`, 403, "wrong_enrollment_secret"},
		{"register missing field", "/api/v1/register", "", `{"machine_id":"x","enrollment_secret":"nope"}`, 400, "invalid_field"},
		{"admin without token", "/api/v1/devices", "", "", 401, "unauthorized"},
		{"unknown endpoint", "/api/v2/nothing", "", "", 404, "not_found"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			method := "POST"
			if strings.HasPrefix(tc.path, "/api/v1/devices") || tc.path == "/api/v2/nothing" {
				method = "GET"
			}
			c.t = t
			st, _, out := c.do(method, tc.path, tc.token, tc.body)
			e, _ := out["error"].(map[string]any)
			if st != tc.status || e == nil || e["code"] != tc.code || e["message"] == "" {
				t.Fatalf("got %d %v, want %d %s", st, out, tc.status, tc.code)
			}
		})
	}
	c.t = t
	if v := s.Metric("drover_pushes_total", map[string]string{"outcome": "invalid"}); v != 3 {
		t.Errorf("invalid pushes counted %v, want 3", v)
	}
	if v := s.Metric("drover_pushes_total", map[string]string{"outcome": "unauthorized"}); v != 3 {
		t.Errorf("unauthorized pushes counted %v, want 3", v)
	}
	if v := s.Metric("drover_request_errors_total", map[string]string{"endpoint": "push", "status": "413", "code": "body_too_large"}); v != 1 {
		t.Errorf("413 counted %v", v)
	}
	// Nothing stored was damaged: the device still pushes.
	if st, _, out := c.do("POST", "/api/v1/push", token, fmt.Sprintf(state, 2, 0)); st != 200 {
		t.Fatalf("push after bad input: %d %v", st, out)
	}
}

func TestOperatorAPI(t *testing.T) {
	s := servertest.Start(t, servertest.Options{})
	c := &client{t: t, s: s, url: s.URL}
	id, token := c.register("m-1")
	c.register("m-2")
	c.do("POST", "/api/v1/push", token, fmt.Sprintf(state, 1, 0))

	st, _, out := c.do("GET", "/api/v1/devices?sync_state=arriving", s.AdminToken, nil)
	devs := out["devices"].([]any)
	if st != 200 || len(devs) != 1 || devs[0].(map[string]any)["machine_id"] != "m-2" {
		t.Fatalf("list: %d %v", st, out)
	}
	_, _, out = c.do("GET", "/api/v1/devices?limit=1", s.AdminToken, nil)
	if out["next_cursor"] != id {
		t.Fatalf("paging: %v", out)
	}
	if st, _, out := c.do("GET", "/api/v1/devices?liveness=sideways", s.AdminToken, nil); st != 400 {
		t.Fatalf("bad filter: %d %v", st, out)
	}
	_, _, dev := c.do("GET", "/api/v1/devices/"+id, s.AdminToken, nil)
	if dev["sync_state"] != "synchronized" || dev["state"].(map[string]any)["temperature"] != 41.5 {
		t.Fatalf("device: %v", dev)
	}
	_, _, hist := c.do("GET", "/api/v1/devices/"+id+"/history", s.AdminToken, nil)
	if samples := hist["samples"].([]any); len(samples) != 1 || samples[0].(map[string]any)["rx_bytes"] != 10.0 {
		t.Fatalf("history: %v", hist)
	}
	if st, _, _ := c.do("GET", "/api/v1/devices/424242", s.AdminToken, nil); st != 404 {
		t.Fatalf("unknown device: %d", st)
	}
	pid := fmt.Sprint(dev["profile_id"])
	if st, _, out := c.do("PUT", "/api/v1/profiles/"+pid, s.AdminToken, `{"config":[1,2]}`); st != 400 {
		t.Fatalf("config must be an object: %d %v", st, out)
	}
	st, _, prof := c.do("PUT", "/api/v1/profiles/"+pid, s.AdminToken, `{"config":{"apn":"iot"},"push_interval":60}`)
	if st != 200 || prof["version"] != 1.0 || prof["push_interval"] != 60.0 {
		t.Fatalf("update profile: %d %v", st, prof)
	}
	_, _, dev = c.do("GET", "/api/v1/devices/"+id, s.AdminToken, nil)
	if dev["sync_state"] != "sync_pending" {
		t.Fatalf("after profile update: %v", dev["sync_state"])
	}
	_, _, ans := c.do("POST", "/api/v1/push", token, fmt.Sprintf(state, 2, 0))
	cfg, _ := ans["config"].(map[string]any)
	if ans["push_interval"] != 60.0 || cfg == nil || cfg["version"] != 1.0 {
		t.Fatalf("push answer: %v", ans)
	}
	c.do("POST", "/api/v1/push", token, fmt.Sprintf(state, 3, 1))
	_, _, stats := c.do("GET", "/api/v1/stats", s.AdminToken, nil)
	if stats["sync"].(map[string]any)["synchronized"] != 1.0 || stats["devices"] != 2.0 {
		t.Fatalf("stats: %v", stats)
	}
	if v := s.Metric("drover_devices", map[string]string{"sync_state": "arriving"}); v != 1 {
		t.Fatalf("drover_devices arriving = %v", v)
	}
	for _, p := range []string{"/healthz", "/readyz"} {
		if st, _, _ := c.do("GET", p, "", nil); st != 200 {
			t.Fatalf("%s: %d", p, st)
		}
	}
}

func TestRestartKeepsState(t *testing.T) {
	dir := t.TempDir()
	s := servertest.Start(t, servertest.Options{DataDir: dir})
	c := &client{t: t, s: s, url: s.URL}
	id, token := c.register("m-1")
	for i := 1; i <= 3; i++ {
		if st, _, out := c.do("POST", "/api/v1/push", token, fmt.Sprintf(state, i, 0)); st != 200 {
			t.Fatalf("push: %d %v", st, out)
		}
	}
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	s2 := servertest.Start(t, servertest.Options{DataDir: dir})
	if s2.EnrollmentSecret != s.EnrollmentSecret || string(s2.CACertPEM) != string(s.CACertPEM) {
		t.Fatal("secrets or certificate changed across restart")
	}
	c = &client{t: t, s: s2, url: s2.URL}
	_, _, dev := c.do("GET", "/api/v1/devices/"+id, s2.AdminToken, nil)
	if dev["seq"] != 3.0 || dev["state"] == nil {
		t.Fatalf("after restart: %v", dev)
	}
	if st, _, _ := c.do("POST", "/api/v1/push", token, fmt.Sprintf(state, 4, 0)); st != 200 {
		t.Fatalf("token after restart: %d", st)
	}
	_, _, hist := c.do("GET", "/api/v1/devices/"+id+"/history", s2.AdminToken, nil)
	if n := len(hist["samples"].([]any)); n != 4 {
		t.Fatalf("history after restart: %d samples", n)
	}
}

func TestTLSSessionResumption(t *testing.T) {
	s := servertest.Start(t, servertest.Options{})
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(s.CACertPEM)
	cfg := &tls.Config{RootCAs: pool, ClientSessionCache: tls.NewLRUClientSessionCache(4), ServerName: "localhost"}
	addr := strings.TrimPrefix(s.URL, "https://")
	resumed := []bool{}
	for range 2 {
		conn, err := tls.Dial("tcp", addr, cfg)
		if err != nil {
			t.Fatal(err)
		}
		// A request makes the client read the TLS 1.3 session ticket.
		fmt.Fprintf(conn, "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
		io.ReadAll(conn)
		resumed = append(resumed, conn.ConnectionState().DidResume)
		conn.Close()
	}
	if resumed[0] || !resumed[1] {
		t.Fatalf("resumed = %v, want [false true]", resumed)
	}
}

func TestPlainHTTPListener(t *testing.T) {
	s := servertest.Start(t, servertest.Options{HTTP: true})
	c := &client{t: t, s: s, url: s.HTTPURL}
	_, token := c.register("m-1")
	if st, _, _ := c.do("POST", "/api/v1/push", token, fmt.Sprintf(state, 1, 0)); st != 200 {
		t.Fatalf("push over http: %d", st)
	}
}
