package server_test

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/internal/buildinfo"
	"github.com/drover/drover/internal/server"
	"github.com/drover/drover/internal/server/servertest"
	"github.com/drover/drover/internal/testwait"
)

// /metrics shares the port with devices: an anonymous scrape or a device's
// token is refused there; the metrics token or the admin token reads it,
// and the separate metrics listener serves it to anyone, and nothing else.
func TestMetricsAccess(t *testing.T) {
	const metricsToken = "metrics-token-0123456789"
	s := servertest.Start(t, servertest.Options{HTTP: true, Configure: func(c *server.Config) {
		c.MetricsToken = metricsToken
		c.MetricsListen = "127.0.0.1:0"
	}})
	c := &client{t: t, s: s, url: s.URL}
	_, deviceToken := c.register("m-1")

	get := func(url, token string) (int, http.Header, string) {
		t.Helper()
		req, _ := http.NewRequest("GET", url, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := s.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header, string(b)
	}
	for _, tc := range []struct {
		name, url, token string
		status           int
	}{
		{"anonymous, HTTPS device port", s.URL + "/metrics", "", 401},
		{"anonymous, plain-HTTP device port", s.HTTPURL + "/metrics", "", 401},
		{"device token", s.URL + "/metrics", deviceToken, 401},
		{"wrong token", s.URL + "/metrics", metricsToken + "x", 401},
		{"metrics token", s.URL + "/metrics", metricsToken, 200},
		{"metrics token, plain HTTP", s.HTTPURL + "/metrics", metricsToken, 200},
		{"admin token", s.URL + "/metrics", s.AdminToken, 200},
		{"anonymous, metrics listener", "http://" + s.Srv.MetricsAddr() + "/metrics", "", 200},
		{"metrics listener serves nothing else", "http://" + s.Srv.MetricsAddr() + "/api/v1/devices", s.AdminToken, 404},
		{"metrics listener has no probes", "http://" + s.Srv.MetricsAddr() + "/healthz", "", 404},
		{"metrics token is not an admin token", s.URL + "/api/v1/devices", metricsToken, 401},
	} {
		st, h, body := get(tc.url, tc.token)
		if st != tc.status {
			t.Errorf("%s: %d %q, want %d", tc.name, st, body, tc.status)
			continue
		}
		switch {
		case st == 401 && (!strings.Contains(body, `"unauthorized"`) || h.Get("WWW-Authenticate") == ""):
			t.Errorf("%s: 401 without the JSON error or WWW-Authenticate: %v %q", tc.name, h, body)
		case st == 200 && !strings.Contains(body, "drover_build_info{"):
			t.Errorf("%s: no drover_build_info in %.200q", tc.name, body)
		}
	}
	if v := s.Metric("drover_request_errors_total", map[string]string{"endpoint": "metrics", "status": "401", "code": "unauthorized"}); v != 4 {
		t.Errorf("refused scrapes counted %v, want 4", v)
	}
	bi := buildinfo.Read()
	labels := map[string]string{"version": bi.Version, "commit": bi.Commit, "goversion": bi.GoVersion}
	if v := s.Metric("drover_build_info", labels); v != 1 {
		t.Errorf("drover_build_info%v = %v, want 1", labels, v)
	}
}

// Without --metrics-listen there is no other way in, and a short or
// reused metrics token is refused at start.
func TestMetricsTokenChecked(t *testing.T) {
	for _, tc := range []struct{ token, admin, want string }{
		{"short", "", "at least 16"},
		{"same-as-admin-token-0123", "same-as-admin-token-0123", "differ"},
	} {
		cfg := server.DefaultConfig()
		cfg.DataDir, cfg.Listen, cfg.MetricsToken, cfg.AdminToken = t.TempDir(), "127.0.0.1:0", tc.token, tc.admin
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("metrics token %q, admin token %q: %v, want an error naming %q", tc.token, tc.admin, err, tc.want)
		}
	}
	s := servertest.Start(t, servertest.Options{})
	if s.Srv.MetricsAddr() != "" {
		t.Errorf("a metrics listener by default: %s", s.Srv.MetricsAddr())
	}
}

// The SQLite store's background work reaches /metrics: its checkpointer
// runs every 500 ms, each pass one observation.
func TestStoreUpkeepMetrics(t *testing.T) {
	s := servertest.Start(t, servertest.Options{})
	labels := map[string]string{"work": "checkpoint"}
	if !testwait.Until(10*time.Second, func() bool { return s.Metric("drover_store_upkeep_duration_seconds_count", labels) >= 2 }) {
		t.Fatalf("no checkpoint observed in 10 s: %v", s.Metric("drover_store_upkeep_duration_seconds_count", labels))
	}
	if v := s.Metric("drover_store_upkeep_errors_total", labels); v != 0 {
		t.Errorf("checkpoint errors %v, want 0", v)
	}
}
