package server_test

import (
	"context"
	"strings"
	"testing"

	"github.com/drover/drover/internal/server"
	"github.com/drover/drover/internal/server/servertest"
)

func TestProbeURL(t *testing.T) {
	for _, tc := range []struct{ listen, httpListen, want string }{
		{":8443", "", "https://127.0.0.1:8443/healthz"},
		{"0.0.0.0:443", ":80", "https://127.0.0.1:443/healthz"},
		{"[::]:8443", "", "https://[::1]:8443/healthz"},
		{"10.0.0.5:8443", "", "https://10.0.0.5:8443/healthz"},
		{"", "127.0.0.2:8080", "http://127.0.0.2:8080/healthz"},
	} {
		cfg := server.DefaultConfig()
		cfg.Listen, cfg.HTTPListen = tc.listen, tc.httpListen
		if got, err := server.ProbeURL(cfg, "/healthz"); err != nil || got != tc.want {
			t.Errorf("listen %q, http %q: %q %v, want %q", tc.listen, tc.httpListen, got, err, tc.want)
		}
	}
	cfg := server.DefaultConfig()
	cfg.Listen = "8443"
	if _, err := server.ProbeURL(cfg, "/healthz"); err == nil {
		t.Error("an address without a port gave a URL")
	}
}

func TestProbe(t *testing.T) {
	s := servertest.Start(t, servertest.Options{})
	ctx := context.Background()
	for _, path := range []string{"/healthz", "/readyz"} {
		if err := server.Probe(ctx, s.URL+path); err != nil {
			t.Errorf("%s: %v", path, err)
		}
	}
	if err := server.Probe(ctx, s.URL+"/nothing"); err == nil || !strings.Contains(err.Error(), "404") {
		t.Errorf("probe of a missing path: %v", err)
	}
	url := s.URL + "/healthz"
	s.Stop()
	if err := server.Probe(ctx, url); err == nil {
		t.Error("probe of a stopped server succeeded")
	}
}
