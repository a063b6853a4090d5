package agent

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/drover/drover/internal/protocol"
	"github.com/drover/drover/internal/server"
	"github.com/drover/drover/internal/server/servertest"
	"github.com/drover/drover/internal/tunnel"
)

// TestEndToEndCommands: the Go agent runs commands of every kind it allows
// against a real server, refuses the others, passes arguments as argv and
// reports output, exit codes and timeouts.
func TestEndToEndCommands(t *testing.T) {
	t.Parallel()
	srv := startServer(t, "", "")
	dir := t.TempDir()
	logFile := filepath.Join(dir, "messages")
	os.WriteFile(logFile, []byte(strings.Repeat("old line\n", 2000)+"last\tline\x01\n"), 0o644)
	hook := filepath.Join(dir, "hook.sh")
	argsFile := filepath.Join(dir, "args")
	os.WriteFile(hook, []byte("#!/bin/sh\nfor a in \"$@\"; do echo \"[$a]\"; done > "+argsFile+"\ncat "+argsFile+"\n[ \"$2\" = fail ] && exit 3\n[ \"$2\" = sleep ] && sleep 30\nexit 0\n"), 0o755)
	id := startAgent(t, srv, dir, func(cfg *Config) {
		cfg.CommandHook, cfg.Logs = hook, map[string]string{"messages": logFile}
	})
	send, wait := commandAPI(t, srv, id)
	r := wait(send(map[string]any{"kind": "set-config", "args": []string{"wan.mtu", "1400; touch /tmp/pwned $(id)"}}))
	if r.State != "succeeded" || strings.Join(r.Output, "|") != "[set-config]|[wan.mtu]|[1400; touch /tmp/pwned $(id)]" {
		t.Fatalf("set-config: %+v", r)
	}
	r = wait(send(map[string]any{"kind": "hook", "args": []string{"fail"}}))
	if r.State != "failed" || r.ExitCode != 3 {
		t.Fatalf("hook failing: %+v", r)
	}
	r = wait(send(map[string]any{"kind": "hook", "args": []string{"sleep"}, "timeout": 1}))
	if r.State != "failed" || !strings.Contains(r.Error, "timed out") {
		t.Fatalf("hook timing out: %+v", r)
	}
	r = wait(send(map[string]any{"kind": "read-log", "args": []string{"messages"}}))
	total := 0
	for _, l := range r.Output {
		total += len(l)
	}
	if r.State != "succeeded" || r.Output[len(r.Output)-1] != "last line" || total > protocol.MaxResultOutputBytes {
		t.Fatalf("read-log: %s %d lines, %d bytes, last %q", r.State, len(r.Output), total, r.Output[len(r.Output)-1])
	}
	r = wait(send(map[string]any{"kind": "read-log", "args": []string{"shadow"}}))
	if r.State != "failed" || !strings.Contains(r.Error, "no log named shadow") {
		t.Fatalf("read-log of an unconfigured log: %+v", r)
	}
	r = wait(send(map[string]any{"kind": "reboot"}))
	if r.State != "failed" || !strings.Contains(r.Error, "not allowed") {
		t.Fatalf("reboot not enabled: %+v", r)
	}
}

func TestOutputLines(t *testing.T) {
	got := outputLines([]byte("a\tb\r\nc\x1b[0m\xff\n\n"))
	if strings.Join(got, "|") != "a b|c[0m?" {
		t.Fatalf("%q", got)
	}
	big := outputLines([]byte(strings.Repeat("x", 3*protocol.MaxResultOutputBytes)))
	if len(big) != 1 || len(big[0]) != protocol.MaxResultOutputBytes {
		t.Fatalf("one long line: %d", len(big[0]))
	}
	r := protocol.CommandResult{ID: 1, Output: outputLines([]byte(strings.Repeat("line\n", 5000)))}
	if err := (&protocol.PushRequest{Results: []protocol.CommandResult{r}}).Validate(); err != nil {
		t.Fatal(err)
	}
}

// TestPersistentConnection: with Connect, a command reaches an agent whose
// push interval is an hour (the server asks it to push over the
// WebSocket), and so does a new configuration.
func TestPersistentConnection(t *testing.T) {
	t.Parallel()
	s := servertest.Start(t, servertest.Options{Configure: func(c *server.Config) { c.PushInterval = 3600 }})
	ca := filepath.Join(t.TempDir(), "ca.pem")
	os.WriteFile(ca, s.CACertPEM, 0o644)
	srv := &realServer{t: t, s: s, caFile: ca}
	dir := t.TempDir()
	hook := filepath.Join(dir, "hook.sh")
	os.WriteFile(hook, []byte("#!/bin/sh\necho ran \"$@\"\n"), 0o755)
	id := startAgent(t, srv, dir, func(cfg *Config) {
		cfg.CommandHook, cfg.Connect, cfg.Hook = hook, true, "cat > "+filepath.Join(dir, "applied")
	})
	waitFor(t, 20*time.Second, "first push", func() bool { return srv.device(id).Seq >= 1 })
	waitFor(t, 20*time.Second, "the connection", func() bool {
		return srv.s.Metric("drover_device_connections", nil) == 1
	})
	if st := srv.call("POST", "/api/v1/commands", srv.s.AdminToken, map[string]any{"kind": "hook", "args": []string{"now"}, "device_id": id}, nil); st != 201 {
		t.Fatalf("send: %d", st)
	}
	waitFor(t, 20*time.Second, "the command's result without waiting for the interval", func() bool {
		var out struct {
			Commands []struct{ State string }
		}
		srv.call("GET", "/api/v1/devices/"+id+"/commands", srv.s.AdminToken, nil, &out)
		return len(out.Commands) == 1 && out.Commands[0].State == "succeeded"
	})
	d := srv.device(id)
	srv.setConfig(d.ProfileID, `{"apn":"now"}`)
	waitFor(t, 20*time.Second, "the configuration without waiting for the interval", func() bool {
		return srv.device(id).SyncState == "synchronized" && srv.device(id).AppliedVersion > 0
	})
}

// startAgent runs an agent against srv with its state in dir, changed by
// set, until the test ends, and returns its device ID once registered.
func startAgent(t *testing.T, srv *realServer, dir string, set func(*Config)) string {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Server, cfg.EnrollSecret, cfg.StateDir = srv.s.URL, srv.s.EnrollmentSecret, filepath.Join(dir, "state")
	cfg.TLS.CACert = srv.caFile
	cfg.CPUWindow = 10 * time.Millisecond
	cfg.MinBackoff, cfg.MaxBackoff = 200*time.Millisecond, time.Second
	set(&cfg)
	runAgent(t, cfg)
	var id string
	waitFor(t, 20*time.Second, "registration", func() bool {
		st, _ := loadState(cfg.StateDir)
		id = st.DeviceID
		return id != ""
	})
	return id
}

// runAgent runs an agent with cfg until the test ends.
func runAgent(t *testing.T, cfg Config) {
	t.Helper()
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
		a.Close()
	})
}

// cmdResult is a command's result as the operator API shows it.
type cmdResult struct {
	JobID    string   `json:"job_id"`
	State    string   `json:"state"`
	ExitCode int      `json:"exit_code"`
	Error    string   `json:"error"`
	Output   []string `json:"output"`
}

// commandAPI sends commands to device id (send returns the job ID) and
// waits for a job's result.
func commandAPI(t *testing.T, srv *realServer, id string) (send func(map[string]any) string, wait func(string) cmdResult) {
	send = func(body map[string]any) string {
		t.Helper()
		body["device_id"] = id
		if st := srv.call("POST", "/api/v1/commands", srv.s.AdminToken, body, nil); st != 201 {
			t.Fatalf("send %v: %d", body, st)
		}
		var list struct {
			Jobs []struct {
				ID string `json:"id"`
			} `json:"jobs"`
		}
		srv.call("GET", "/api/v1/commands", srv.s.AdminToken, nil, &list)
		return list.Jobs[0].ID
	}
	wait = func(job string) cmdResult {
		t.Helper()
		var r cmdResult
		waitFor(t, 30*time.Second, "result of command "+job, func() bool {
			var out struct{ Commands []cmdResult }
			srv.call("GET", "/api/v1/commands/"+job+"/devices", srv.s.AdminToken, nil, &out)
			if len(out.Commands) == 1 {
				r = out.Commands[0]
			}
			return r.State == "succeeded" || r.State == "failed"
		})
		return r
	}
	return send, wait
}

// TestCommandChainResultsAtOnce: a command that arrives in the answer to
// the push carrying an earlier command's result has its own result pushed
// at once too, however long the chain; every result says when its command
// started and finished, whichever way it ended.
func TestCommandChainResultsAtOnce(t *testing.T) {
	t.Parallel()
	f := newFakeServer(t)
	cfg := testConfig(t, f)
	dir := t.TempDir()
	hook := filepath.Join(dir, "hook")
	os.WriteFile(hook, []byte("#!/bin/sh\necho \"$@\"\n"), 0o755)
	logFile := filepath.Join(dir, "messages")
	os.WriteFile(logFile, []byte("a line\n"), 0o644)
	cfg.CommandHook, cfg.Logs = hook, map[string]string{"messages": logFile}
	chain := []protocol.Command{
		{ID: 1, Kind: protocol.KindSetConfig, Args: []string{"a", "1"}, Timeout: 10},
		{ID: 2, Kind: protocol.KindReadLog, Args: []string{"messages"}, Timeout: 10},
		{ID: 3, Kind: protocol.KindSetConfig, Args: []string{"b", "2"}, Timeout: 10},
		{ID: 4, Kind: protocol.KindReboot, Timeout: 10}, // not allowed: a failed result
		{ID: 5, Kind: protocol.KindHook, Args: []string{"x"}, Timeout: 10},
	}
	var mu sync.Mutex
	var at []time.Time // when each push arrived
	f.onPush = func(n int, p protocol.PushRequest) *answer {
		mu.Lock()
		at = append(at, time.Now())
		mu.Unlock()
		// The first push gets the first command; each push carrying a
		// result gets the next one.
		next := 0
		for _, r := range p.Results {
			next = max(next, int(r.ID))
		}
		if n > 1 && len(p.Results) == 0 || next >= len(chain) {
			return nil
		}
		return &answer{status: 200, body: protocol.PushResponse{PushInterval: 60, Commands: chain[next : next+1]}}
	}
	runAgent(t, cfg)
	results := map[uint64]protocol.CommandResult{}
	waitFor(t, 10*time.Second, "every result of the chain (the interval is 60 s)", func() bool {
		_, pushes := f.snapshot()
		for _, p := range pushes {
			for _, r := range p.req.Results {
				results[r.ID] = r
			}
		}
		return len(results) == len(chain)
	})
	_, pushes := f.snapshot()
	mu.Lock()
	defer mu.Unlock()
	for i := 1; i < len(pushes); i++ {
		if len(pushes[i].req.Results) == 0 {
			continue
		}
		if d := at[i].Sub(at[i-1]); d > 2*time.Second {
			t.Errorf("push %d with result %d came %v after the answer carrying its command", i+1, pushes[i].req.Results[0].ID, d)
		}
	}
	for _, c := range chain {
		r := results[c.ID]
		if r.StartedAt == 0 || r.FinishedAt == 0 || r.FinishedAt < r.StartedAt || time.Since(time.Unix(r.FinishedAt, 0)) > time.Minute {
			t.Errorf("command %d (%s): started_at %d, finished_at %d", c.ID, c.Kind, r.StartedAt, r.FinishedAt)
		}
	}
	if r := results[4]; r.Succeeded() || !strings.Contains(r.Error, "not allowed") {
		t.Errorf("reboot not enabled: %+v", r)
	}
}

// TestConnectOnDemand: an agent without Connect, asked in a push answer
// to connect (an operator's session waits for it), holds its persistent
// connection and serves the session's tunnel link; a tunnel through it
// carries bytes.
func TestConnectOnDemand(t *testing.T) {
	t.Parallel()
	s := servertest.Start(t, servertest.Options{Configure: func(c *server.Config) {
		c.PushInterval, c.Tunnel.Open = 1, 10*time.Second
	}})
	ca := filepath.Join(t.TempDir(), "ca.pem")
	os.WriteFile(ca, s.CACertPEM, 0o644)
	srv := &realServer{t: t, s: s, caFile: ca}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); io.Copy(c, c) }()
		}
	}()
	allow, err := tunnel.ParseAllowList(ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	id := startAgent(t, srv, t.TempDir(), func(cfg *Config) { cfg.TunnelAllow = allow })
	waitFor(t, 20*time.Second, "first push", func() bool { return srv.device(id).Seq >= 1 })
	if n := s.Metric("drover_device_connections", nil); n != 0 {
		t.Fatalf("connections before any session: %v", n)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(s.CACertPEM)
	op := &tunnel.Client{Server: s.URL, Token: s.AdminToken, TLS: &tls.Config{RootCAs: pool}}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := op.Dial(ctx, id, ln.Addr().String())
	if err != nil {
		t.Fatalf("tunnel to a device connecting on demand: %v", err)
	}
	defer c.Close()
	c.Write([]byte("on demand"))
	buf := make([]byte, 9)
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "on demand" {
		t.Fatalf("echo: %q %v", buf, err)
	}
	if n := s.Metric("drover_device_connections", nil); n != 1 {
		t.Errorf("connections while asked for: %v", n)
	}
}
