package agent

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/internal/server"
	"github.com/drover/drover/internal/server/servertest"
)

// Under the approve policy the agent waits (202), keeps the device key it
// was given, and registers with it once an operator approved.
func TestGoAgentPendingApproval(t *testing.T) {
	t.Parallel()
	s := servertest.Start(t, servertest.Options{Configure: func(c *server.Config) { c.Admission = "approve" }})
	srv := &realServer{t: t, s: s, caFile: filepath.Join(s.Config.DataDir, "agent-ca.pem")}
	if err := os.WriteFile(srv.caFile, s.CACertPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cfg := DefaultConfig()
	cfg.Server, cfg.EnrollSecret, cfg.StateDir = s.URL, s.EnrollmentSecret, filepath.Join(dir, "state")
	cfg.TLS.CACert = srv.caFile
	cfg.Once, cfg.CPUWindow, cfg.RequestTimeout = true, 10*time.Millisecond, 5*time.Second
	run := func() error {
		a, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close()
		return a.Run(context.Background())
	}
	if err := run(); !errors.Is(err, ErrPending) {
		t.Fatalf("first run: %v, want ErrPending", err)
	}
	st, _ := loadState(cfg.StateDir)
	if st.DeviceKey == "" || st.Token != "" || st.DeviceID != "1" {
		t.Fatalf("state while pending: %+v", st)
	}
	if err := run(); !errors.Is(err, ErrPending) {
		t.Fatalf("second run: %v, want ErrPending", err)
	}
	if code := srv.call("POST", "/api/v1/devices/1/approve", s.AdminToken, nil, nil); code != 200 {
		t.Fatalf("approve: %d", code)
	}
	if err := run(); err != nil {
		t.Fatalf("after approval: %v", err)
	}
	if d := srv.device("1"); d.Seq == 0 {
		t.Fatalf("no push after approval: %+v", d)
	}
	// Without the enrollment secret the device key is enough to register again.
	st, _ = loadState(cfg.StateDir)
	st.Token = ""
	if err := saveState(cfg.StateDir, &st); err != nil {
		t.Fatal(err)
	}
	cfg.EnrollSecret = ""
	if err := run(); err != nil {
		t.Fatalf("with the device key only: %v", err)
	}
}

// An operator's enrollment token registers the agent without the fleet
// secret, once; afterwards the device key carries it.
func TestGoAgentEnrollmentToken(t *testing.T) {
	t.Parallel()
	s := servertest.Start(t, servertest.Options{Configure: func(c *server.Config) { c.Admission = "preauthorized" }})
	srv := &realServer{t: t, s: s, caFile: filepath.Join(s.Config.DataDir, "agent-ca.pem")}
	if err := os.WriteFile(srv.caFile, s.CACertPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	var et struct {
		Token string `json:"token"`
	}
	req, _ := http.NewRequest("POST", s.URL+"/api/v1/enrollment-tokens", strings.NewReader(`{"ttl":"1h"}`))
	req.Header.Set("Authorization", "Bearer "+s.AdminToken)
	resp, err := s.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	json.NewDecoder(resp.Body).Decode(&et)
	resp.Body.Close()
	if resp.StatusCode != 201 || et.Token == "" {
		t.Fatalf("create token: %d %+v", resp.StatusCode, et)
	}
	cfg := DefaultConfig()
	cfg.Server, cfg.EnrollToken, cfg.StateDir = s.URL, et.Token, filepath.Join(t.TempDir(), "state")
	cfg.TLS.CACert = srv.caFile
	cfg.Once, cfg.CPUWindow, cfg.RequestTimeout = true, 10*time.Millisecond, 5*time.Second
	run := func() error {
		a, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close()
		return a.Run(context.Background())
	}
	if err := run(); err != nil {
		t.Fatalf("with an enrollment token: %v", err)
	}
	st, _ := loadState(cfg.StateDir)
	st.Token = ""
	if err := saveState(cfg.StateDir, &st); err != nil {
		t.Fatal(err)
	}
	if err := run(); err != nil { // the token is used up: the key registers it again
		t.Fatalf("again with the device key: %v", err)
	}
}
