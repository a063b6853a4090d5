package tunnel_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/internal/agent"
	"github.com/drover/drover/internal/server"
	"github.com/drover/drover/internal/server/servertest"
	"github.com/drover/drover/internal/tunnel"
)

// rig is a real server, a real Go agent holding its persistent connection
// with an allow-list, and operator and viewer tokens.
type rig struct {
	s                  *servertest.Server
	device             string
	operator, viewer   string
	tlsCfg             *tls.Config
	agentCancel        context.CancelFunc
	agentDone          chan error
	operatorC, viewerC *tunnel.Client
	adminC             *tunnel.Client
}

// startRig starts the rig; allow is the agent's --tunnel-allow.
func startRig(t testing.TB, allow string, configure func(*server.Config)) *rig {
	t.Helper()
	s := servertest.Start(t, servertest.Options{Configure: configure})
	dir := t.TempDir()
	ca := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(ca, s.CACertPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	list, err := tunnel.ParseAllowList(allow)
	if err != nil {
		t.Fatal(err)
	}
	cfg := agent.DefaultConfig()
	cfg.Server, cfg.EnrollSecret, cfg.StateDir = s.URL, s.EnrollmentSecret, filepath.Join(dir, "state")
	cfg.TLS.CACert = ca
	cfg.CPUWindow = 10 * time.Millisecond
	cfg.MinBackoff, cfg.MaxBackoff = 100*time.Millisecond, time.Second
	cfg.RequestTimeout = 10 * time.Second
	cfg.Connect = true
	cfg.TunnelAllow = list
	a, err := agent.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &rig{s: s, agentCancel: cancel, agentDone: make(chan error, 1)}
	go func() { r.agentDone <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-r.agentDone
		a.Close()
	})
	waitFor(t, 20*time.Second, "the device's persistent connection", func() bool {
		return s.Metric("drover_device_connections", nil) == 1
	})
	var list2 struct {
		Devices []struct {
			ID string `json:"id"`
		} `json:"devices"`
	}
	if st := s.Admin(t, "GET", "/api/v1/devices", nil, &list2); st != 200 || len(list2.Devices) != 1 {
		t.Fatalf("devices: %d %+v", st, list2)
	}
	r.device = list2.Devices[0].ID
	r.operator = r.user(t, "olga", "operator")
	r.viewer = r.user(t, "vera", "viewer")
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(s.CACertPEM)
	r.tlsCfg = &tls.Config{RootCAs: pool}
	r.operatorC = &tunnel.Client{Server: s.URL, Token: r.operator, TLS: r.tlsCfg}
	r.viewerC = &tunnel.Client{Server: s.URL, Token: r.viewer, TLS: r.tlsCfg}
	r.adminC = &tunnel.Client{Server: s.URL, Token: s.AdminToken, TLS: r.tlsCfg}
	return r
}

// user makes a user of role and returns an API token of it.
func (r *rig) user(t testing.TB, name, role string) string {
	t.Helper()
	if st := r.s.Admin(t, "POST", "/api/v1/users", []byte(fmt.Sprintf(`{"name":%q,"role":%q}`, name, role)), nil); st != 201 {
		t.Fatalf("user %s: %d", name, st)
	}
	var tok struct{ Token string }
	if st := r.s.Admin(t, "POST", "/api/v1/tokens", []byte(fmt.Sprintf(`{"user":%q,"name":"t"}`, name)), &tok); st != 201 || tok.Token == "" {
		t.Fatalf("token %s: %d", name, st)
	}
	return tok.Token
}

// auditEntry is a row of the audit log with a tunnel session.
type auditEntry struct {
	Actor, Action, Object string
	After                 struct {
		Session     uint64 `json:"session"`
		Destination string `json:"destination"`
		StartedAt   string `json:"started_at"`
		EndedAt     string `json:"ended_at"`
		ToDevice    int64  `json:"bytes_to_device"`
		FromDevice  int64  `json:"bytes_from_device"`
		EndReason   string `json:"end_reason"`
	}
}

// audit is the audit log's rows of action, newest first.
func (r *rig) audit(t testing.TB, action string) []auditEntry {
	t.Helper()
	var out struct{ Entries []auditEntry }
	if st := r.s.Admin(t, "GET", "/api/v1/audit?action="+strings.ReplaceAll(action, " ", "+"), nil, &out); st != 200 {
		t.Fatalf("audit: %d", st)
	}
	return out.Entries
}

func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// echoServer is a TCP echo server on loopback (the LAN host); it closes
// its write side at the client's end of input.
func echoServer(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				io.Copy(c, c)
				c.(*net.TCPConn).CloseWrite()
			}()
		}
	}()
	return ln.Addr().String()
}

// apiCode is the error code of a tunnel refusal ("" for none).
func apiCode(err error) string {
	if e, ok := err.(*tunnel.APIError); ok {
		return e.Code
	}
	if err != nil {
		return "error: " + err.Error()
	}
	return ""
}
