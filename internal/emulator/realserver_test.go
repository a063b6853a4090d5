package emulator

import (
	"context"
	"encoding/json"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/internal/emulator/results"
	"github.com/drover/drover/internal/server"
	"github.com/drover/drover/internal/server/servertest"
)

// The emulator's accepted count must equal the server's for the same run,
// in every load model and connection mode, registrations too.
func TestAcceptedCountsMatchTheRealServer(t *testing.T) {
	t.Parallel()
	srv := servertest.Start(t, servertest.Options{HTTP: true})
	base := DefaultConfig()
	base.EnrollmentSecret, base.CACertPEM, base.Seed, base.Devices = srv.EnrollmentSecret, srv.CACertPEM, "real", 60
	base.Workers, base.Loops, base.Timeout = 6, 3, 20*time.Second
	var accepted, registered int64
	check := func(name string, cfg Config) *results.Summary {
		t.Helper()
		sum, err := Run(context.Background(), cfg, nil)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		push, reg := sum.Op(results.OpPush), sum.Op(results.OpRegister)
		accepted += push.Accepted
		registered += reg.New
		if push.Errors() != 0 || reg.Errors() != 0 {
			t.Fatalf("%s: push %+v register %+v", name, push.Counts, reg.Counts)
		}
		if got := int64(srv.Metric("drover_pushes_total", map[string]string{"outcome": "accepted"})); got != accepted {
			t.Fatalf("%s: emulator counted %d accepted pushes, the server %d", name, accepted, got)
		}
		if got := int64(srv.Metric("drover_registrations_total", map[string]string{"outcome": "new"})); got != registered {
			t.Fatalf("%s: emulator counted %d new registrations, the server %d", name, registered, got)
		}
		return sum
	}

	cfg := base
	cfg.Target, cfg.Mode, cfg.Conn = srv.URL, ModeBenchmark, ConnKeepAlive
	if sum := check("https keepalive", cfg); sum.Op(results.OpPush).Accepted != 180 || sum.Op(results.OpRegister).New != 60 {
		t.Fatalf("https keepalive: %+v", sum.Op(results.OpPush).Counts)
	}
	cfg.Conn, cfg.Seed = ConnResume, "real-resume"
	if sum := check("https resume", cfg); sum.Conns.TLSResumed == 0 {
		t.Fatalf("no TLS session was resumed: %+v", sum.Conns)
	}
	cfg.Conn, cfg.Seed, cfg.Loops = ConnNew, "real-new", 1
	check("https new", cfg)
	cfg.Target, cfg.Conn, cfg.Seed = srv.HTTPURL, ConnKeepAlive, "real-http"
	check("http keepalive", cfg)

	cfg = base
	cfg.Target, cfg.Mode, cfg.Seed, cfg.Devices = srv.URL, ModeFleet, "real-fleet", 30
	cfg.Interval, cfg.Duration = time.Second, 2*time.Second
	if sum := check("fleet", cfg); sum.Op(results.OpPush).Accepted != 60 {
		t.Fatalf("fleet: %+v", sum.Op(results.OpPush).Counts)
	}
}

// A device the server no longer knows (its token is refused) registers
// again; Drover renews it under the same device ID.
func TestRealServerReregistration(t *testing.T) {
	t.Parallel()
	srv := servertest.Start(t, servertest.Options{})
	cfg := DefaultConfig()
	cfg.Target, cfg.EnrollmentSecret, cfg.CACertPEM, cfg.Seed, cfg.Devices = srv.URL, srv.EnrollmentSecret, srv.CACertPEM, "rereg", 5
	cfg.Mode, cfg.Workers, cfg.Loops, cfg.CredentialsFile = ModeBenchmark, 5, 1, t.TempDir()+"/creds.jsonl"
	if _, err := Run(context.Background(), cfg, nil); err != nil {
		t.Fatal(err)
	}
	// Same fleet, other server: every saved token is unknown there.
	srv2 := servertest.Start(t, servertest.Options{})
	cfg.Target, cfg.EnrollmentSecret, cfg.CACertPEM = srv2.URL, srv2.EnrollmentSecret, srv2.CACertPEM
	sum, err := Run(context.Background(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	push := sum.Op(results.OpPush)
	if push.Reregistered != 5 || push.Accepted != 5 || push.Errors() != 0 {
		t.Fatalf("push %+v", push.Counts)
	}
	if got := srv2.Metric("drover_pushes_total", map[string]string{"outcome": "unauthorized"}); got != 5 {
		t.Fatalf("server counted %v unauthorized pushes", got)
	}
}

// Answers name their node (X-Drover-Node): the emulator counts accepted
// operations by node, and --acks lists every accepted push with its
// device, sequence number and node, matching what the server stored.
func TestAcceptedByNodeAndAcks(t *testing.T) {
	t.Parallel()
	srv := servertest.Start(t, servertest.Options{Configure: func(c *server.Config) { c.NodeName = "node-1" }})
	cfg := DefaultConfig()
	cfg.Target, cfg.EnrollmentSecret, cfg.CACertPEM, cfg.Seed, cfg.Devices = srv.URL, srv.EnrollmentSecret, srv.CACertPEM, "acks", 20
	cfg.Mode, cfg.Workers, cfg.Loops, cfg.Conn = ModeBenchmark, 4, 3, ConnNew
	cfg.AcksFile = filepath.Join(t.TempDir(), "acks.jsonl")
	sum, err := Run(context.Background(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	push, reg := sum.Op(results.OpPush), sum.Op(results.OpRegister)
	if push.Accepted != 60 || !maps.Equal(push.AcceptedByNode, map[string]int64{"node-1": 60}) ||
		!maps.Equal(reg.AcceptedByNode, map[string]int64{"node-1": 20}) {
		t.Fatalf("push %+v register %+v", push.Counts, reg.Counts)
	}
	b, err := os.ReadFile(cfg.AcksFile)
	if err != nil {
		t.Fatal(err)
	}
	last := map[string]uint64{}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	for _, l := range lines {
		var a struct {
			DeviceID string `json:"device_id"`
			Seq      uint64 `json:"seq"`
			Node     string `json:"node"`
			AtMS     int64  `json:"at_ms"`
		}
		if err := json.Unmarshal([]byte(l), &a); err != nil || a.Node != "node-1" || a.AtMS < sum.Started.UnixMilli() {
			t.Fatalf("ack line %q: %v", l, err)
		}
		if a.Seq <= last[a.DeviceID] {
			t.Fatalf("device %s: seq %d acknowledged after %d", a.DeviceID, a.Seq, last[a.DeviceID])
		}
		last[a.DeviceID] = a.Seq
	}
	if len(lines) != 60 || len(last) != 20 {
		t.Fatalf("%d ack lines for %d devices", len(lines), len(last))
	}
	for id, seq := range last {
		resp, err := srv.Client().Do(adminGet(t, srv, "/api/v1/devices/"+id))
		if err != nil {
			t.Fatal(err)
		}
		var d struct {
			Seq uint64 `json:"seq"`
		}
		json.NewDecoder(resp.Body).Decode(&d)
		resp.Body.Close()
		if d.Seq != seq {
			t.Errorf("device %s: stored seq %d, last acknowledged %d", id, d.Seq, seq)
		}
	}
}

func adminGet(t *testing.T, srv *servertest.Server, path string) *http.Request {
	req, err := http.NewRequest("GET", srv.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+srv.AdminToken)
	return req
}

// TestConnectModeDeliversCommands: in connect mode every device holds its
// persistent connection and the commands sent through the operator API
// reach the devices over it (op "command"), each followed by a push.
func TestConnectModeDeliversCommands(t *testing.T) {
	t.Parallel()
	srv := servertest.Start(t, servertest.Options{})
	cfg := DefaultConfig()
	cfg.Target, cfg.EnrollmentSecret, cfg.CACertPEM, cfg.Seed, cfg.Devices = srv.URL, srv.EnrollmentSecret, srv.CACertPEM, "connect", 10
	cfg.Mode, cfg.Workers, cfg.Duration, cfg.CommandRate, cfg.AdminToken = ModeConnect, 4, 4*time.Second, 10, srv.AdminToken
	sum, err := Run(context.Background(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	conn, cmd, push := sum.Op(results.OpConnect), sum.Op(results.OpCommand), sum.Op(results.OpPush)
	if conn.Accepted != 10 || len(conn.Rejected)+len(conn.Dropped) != 0 {
		t.Fatalf("connect %+v", conn.Counts)
	}
	if cmd.Accepted < 5 || len(cmd.Rejected)+len(cmd.Dropped) != 0 || push.Accepted < cmd.Accepted {
		t.Fatalf("command %+v push %+v", cmd.Counts, push.Counts)
	}
	if cmd.Latency == nil || cmd.Latency.Count() != cmd.Accepted {
		t.Fatalf("command latency %+v", cmd.Latency)
	}
	cfg.AdminToken = "wrong"
	cfg.Seed = "connect-bad"
	sum, err = Run(context.Background(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if cmd := sum.Op(results.OpCommand); cmd.Accepted != 0 || cmd.Rejected["401"] == 0 {
		t.Fatalf("commands with a wrong token: %+v", cmd.Counts)
	}
}
