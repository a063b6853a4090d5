package agent

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/drover/drover/internal/agent/shelltest"
	"github.com/drover/drover/internal/protocol"
)

// The shell agent is tested under dash and under busybox sh with only
// busybox applets and curl on PATH, as on an OpenWrt router. A missing
// shell skips the test locally and fails it in CI (CI=true).

func shellScript(t *testing.T) string {
	t.Helper()
	p, err := filepath.Abs("../../agent/drover-agent.sh")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatal(err)
	}
	return p
}

func need(t *testing.T, tool string) string {
	t.Helper()
	p, err := exec.LookPath(tool)
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s is not installed; CI must install it (Debian package %s)", tool, tool)
		}
		t.Skipf("%s is not installed (apt-get install %s); CI fails instead of skipping", tool, tool)
	}
	return p
}

// shellEnv describes how to run the script under one shell.
type shellEnv struct {
	name string
	argv []string // shell command, the script follows
	env  []string
}

// shells are named constructors: subtest names must not contain '#' (the
// SQLite store does not escape its path).
func shells(t *testing.T) map[string]func(t *testing.T) shellEnv {
	return map[string]func(t *testing.T) shellEnv{
		"dash": func(t *testing.T) shellEnv {
			dash := need(t, "dash")
			need(t, "curl")
			return shellEnv{name: "dash", argv: []string{dash}, env: os.Environ()}
		},
		"busybox": func(t *testing.T) shellEnv {
			bb := need(t, "busybox")
			curl := need(t, "curl")
			return shellEnv{name: "busybox", argv: []string{bb, "sh"}, env: busyboxEnv(t, bb, curl)}
		},
	}
}

// busyboxEnv makes a PATH of busybox applets plus curl, nothing else.
func busyboxEnv(t *testing.T, bb, curl string) []string { return shelltest.BusyboxEnv(t, bb, curl) }

// shellAgent is a running drover-agent.sh.
type shellAgent struct {
	t        *testing.T
	cmd      *exec.Cmd
	stateDir string
	mu       sync.Mutex
	log      bytes.Buffer
	done     chan error
}

func startShellAgent(t *testing.T, sh shellEnv, stateDir string, args ...string) *shellAgent {
	t.Helper()
	argv := append(append(append([]string{}, sh.argv...), shellScript(t), "--state-dir", stateDir), args...)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(slices.Clip(sh.env), "TMPDIR="+t.TempDir())
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	a := &shellAgent{t: t, cmd: cmd, stateDir: stateDir, done: make(chan error, 1)}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			a.mu.Lock()
			a.log.WriteString(sc.Text() + "\n")
			a.mu.Unlock()
		}
		a.done <- cmd.Wait()
	}()
	t.Cleanup(func() {
		a.stop()
		if t.Failed() {
			t.Logf("%s agent log:\n%s", sh.name, a.logText())
		}
	})
	return a
}

func (a *shellAgent) logText() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.log.String()
}

// stop sends SIGTERM and checks that the agent ends at once, even while it
// sleeps.
func (a *shellAgent) stop() {
	if a.cmd.ProcessState != nil || a.done == nil {
		return
	}
	a.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-a.done:
		a.done = nil
		if err != nil {
			a.t.Errorf("agent exited with %v after SIGTERM", err)
		}
	case <-time.After(5 * time.Second):
		a.cmd.Process.Kill()
		a.t.Errorf("agent did not stop within 5 s of SIGTERM")
	}
}

// shellState reads the agent's state file.
func (a *shellAgent) state() map[string]string {
	b, _ := os.ReadFile(filepath.Join(a.stateDir, "state"))
	out := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			out[k] = strings.Trim(v, "'")
		}
	}
	return out
}

// TestShellAgent runs every scenario under every shell at once: they mostly
// wait for pushes, and concurrent t.Run calls are not bound by -parallel.
func TestShellAgent(t *testing.T) {
	t.Parallel()
	scenarios := map[string]func(*testing.T, shellEnv){
		"EndToEnd": testShellAgentEndToEnd, "ProtocolDetails": testShellAgentProtocolDetails, "OnceAndErrors": testShellAgentOnceAndErrors,
		"QuotaRetryAfter": testShellAgentQuota, "Commands": testShellAgentCommands, "Firmware": testShellAgentFirmware,
		"CommandChecks": testShellAgentCommandChecks,
	}
	var wg sync.WaitGroup
	for shell, mk := range shells(t) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t.Run(shell, func(t *testing.T) {
				sh := mk(t)
				var inner sync.WaitGroup
				for name, fn := range scenarios {
					inner.Add(1)
					go func() {
						defer inner.Done()
						t.Run(name, func(t *testing.T) { fn(t, sh) })
					}()
				}
				inner.Wait()
			})
		}()
	}
	wg.Wait()
}

func testShellAgentEndToEnd(t *testing.T, sh shellEnv) {
	srv := startServer(t, "", "")
	dir := t.TempDir()
	applied := filepath.Join(dir, "applied.json")
	root, _ := filepath.Abs("testdata/root")
	a := startShellAgent(t, sh, filepath.Join(dir, "state"), "--server", srv.s.URL, "--enroll-secret", srv.s.EnrollmentSecret,
		"--ca-cert", srv.caFile, "--root", root, "--hook", hookScript(applied), "--hook-retry", "0",
		"--collector", `printf 'rssi=-71\noperator=Example "Mobile"\ntechnology=LTE\nband=B20\n'`,
		"--min-backoff", "1", "--max-backoff", "2", "--timeout", "5", "--log-level", "debug")

	var id string
	waitFor(t, 30*time.Second, "registration", func() bool {
		id = a.state()["DEVICE_ID"]
		return id != ""
	})
	var d deviceView
	waitFor(t, 30*time.Second, "two pushes", func() bool {
		d = srv.device(id)
		return d.Seq >= 2
	})
	var st protocol.State
	if err := json.Unmarshal(d.State, &st); err != nil {
		t.Fatal(err)
	}
	if st.Uptime == nil || *st.Uptime != 12345 || *st.Load1 != 0.42 || *st.MemTotal != 256000*1024 || *st.MemUsed != 156000*1024 ||
		*st.Temperature != 52.3 || st.Firmware != "OpenWrt 23.05.3 r23809-234f1a2efa" || st.DiskTotal == nil || st.CPU != nil {
		t.Fatalf("state from the fake /proc: %s", d.State)
	}
	if len(st.Interfaces) != 3 || st.Interfaces[0] != (protocol.Interface{Name: "eth0", RxBytes: 123456789, RxPackets: 1000, TxBytes: 987654321, TxPackets: 2000}) {
		t.Fatalf("interfaces: %+v", st.Interfaces)
	}
	if st.Signal == nil || *st.Signal.RSSI != -71 || st.Signal.Operator != `Example "Mobile"` || st.Extra["band"] != "B20" ||
		st.Extra["kernel"] != "5.15.150" || st.Extra["hostname"] != "router-1" {
		t.Fatalf("signal and extra: %s", d.State)
	}
	// The Go agent reads the same tree the same way.
	goSt := testSystem(root).collect(context.Background())
	for _, c := range []struct {
		name        string
		shell, goes any
	}{
		{"uptime", *st.Uptime, *goSt.Uptime}, {"load1", *st.Load1, *goSt.Load1}, {"mem_used", *st.MemUsed, *goSt.MemUsed},
		{"temperature", *st.Temperature, *goSt.Temperature}, {"interfaces", st.Interfaces, goSt.Interfaces},
		{"disk_total", *st.DiskTotal, *goSt.DiskTotal},
	} {
		if !reflect.DeepEqual(c.shell, c.goes) {
			t.Errorf("%s: shell agent %v, Go agent %v", c.name, c.shell, c.goes)
		}
	}

	// Configuration: applied, refused, applied again.
	srv.setConfig(d.ProfileID, `{"apn":"internet","nested":{"s":"}}\"x","push_interval":3}}`)
	waitFor(t, 30*time.Second, "synchronized at version 1", func() bool {
		d = srv.device(id)
		return d.SyncState == "synchronized" && d.AppliedVersion == 1
	})
	if b, _ := os.ReadFile(applied); strings.TrimSpace(string(b)) != `{"apn":"internet","nested":{"s":"}}\"x","push_interval":3}}` {
		t.Fatalf("hook applied %q", b)
	}
	if b, _ := os.ReadFile(filepath.Join(a.stateDir, "config.json")); !bytes.Contains(b, []byte(`"apn":"internet"`)) {
		t.Fatalf("config.json = %q", b)
	}
	srv.setConfig(d.ProfileID, `{"apn":"fail"}`)
	waitFor(t, 30*time.Second, "sync_error", func() bool {
		d = srv.device(id)
		return d.SyncState == "sync_error"
	})
	if d.ConfigError != "modem refused the APN" || d.AppliedVersion != 1 {
		t.Fatalf("after a failing hook: %+v", d)
	}
	if n := strings.Count(a.logText(), "applying configuration version 2"); n != 1 {
		t.Fatalf("failed version applied %d times with --hook-retry 0", n)
	}
	srv.setConfig(d.ProfileID, `{"apn":"internet2"}`)
	waitFor(t, 30*time.Second, "synchronized at version 3", func() bool {
		d = srv.device(id)
		return d.SyncState == "synchronized" && d.AppliedVersion == 3 && d.ConfigError == ""
	})

	// 401: another registration of the machine ID replaces the token.
	machineID, _ := os.ReadFile(filepath.Join(a.stateDir, "machine-id"))
	oldToken, key := a.state()["TOKEN"], a.state()["DEVICE_KEY"]
	if key == "" {
		t.Fatal("the agent kept no device key")
	}
	stolen := srv.register(strings.TrimSpace(string(machineID)), "openwrt", st.Firmware, key)
	if stolen.DeviceID != id {
		t.Fatalf("re-registration gave device %s, want %s", stolen.DeviceID, id)
	}
	seqBefore := srv.device(id).Seq
	waitFor(t, 30*time.Second, "agent to register again after 401", func() bool {
		s := a.state()
		return s["TOKEN"] != oldToken && s["TOKEN"] != stolen.Token && s["DEVICE_ID"] == id && srv.device(id).Seq > seqBefore
	})

	// Outage and restart of the server.
	addr, dataDir := srv.s.Srv.HTTPSAddr(), srv.s.Config.DataDir
	if err := srv.s.Stop(); err != nil {
		t.Fatal(err)
	}
	seqBefore = d.Seq
	stop := countingListener(t, addr)
	// The outage's length is what the attempts are counted over: a wait
	// for a condition would not bound them.
	time.Sleep(4 * time.Second)
	attempts := stop()
	// Delays of at least 1, 1, 1 … s (min 1, max 2, half of it at least).
	if attempts < 1 || attempts > 5 {
		t.Fatalf("%d connection attempts in 4 s of outage", attempts)
	}
	srv2 := startServer(t, dataDir, addr)
	waitFor(t, 30*time.Second, "pushes to the restarted server", func() bool {
		d = srv2.device(id)
		return d.Seq > seqBefore && d.LastSeen != nil && time.Since(*d.LastSeen) < 2*time.Second
	})
	t.Logf("%s: outage of 4 s: %d connection attempts", sh.name, attempts)
}

func testShellAgentProtocolDetails(t *testing.T, sh shellEnv) {
	f := newFakeServer(t)
	var mu sync.Mutex
	var times []time.Time
	f.onPush = func(n int, p protocol.PushRequest) *answer {
		mu.Lock()
		times = append(times, time.Now())
		mu.Unlock()
		switch n {
		case 1:
			return &answer{status: 503, retryAfter: "2"}
		case 2:
			return &answer{status: 200, body: map[string]any{"push_interval": 1, "config": map[string]any{"version": 4, "data": map[string]any{"push_interval": 99, "k": "v"}}}}
		}
		return &answer{status: 200, body: protocol.PushResponse{PushInterval: 1}}
	}
	dir := t.TempDir()
	out := filepath.Join(dir, "hook.out")
	a := startShellAgent(t, sh, filepath.Join(dir, "state"), "--server", f.srv.URL, "--enroll-secret", "s3cret",
		"--pin-pubkey", pinOf(t, f.caFile), "--root", "testdata/root", "--interfaces", "wwan*,lo",
		"--hook", `cat > `+out+`; echo "$DROVER_CONFIG_VERSION" >> `+out, "--device-type", "ICR-3241")
	waitFor(t, 30*time.Second, "five pushes", func() bool {
		_, pushes := f.snapshot()
		return len(pushes) >= 5
	})
	a.stop()
	regs, pushes := f.snapshot()
	if len(regs) != 1 || regs[0].DeviceType != "ICR-3241" || regs[0].EnrollmentSecret != "s3cret" || len(regs[0].MachineID) != 32 {
		t.Fatalf("registration: %+v", regs)
	}
	mu.Lock()
	if gap := times[1].Sub(times[0]); gap < 2*time.Second {
		t.Errorf("retried %v after 503 with Retry-After: 2", gap)
	}
	mu.Unlock()
	if p := pushes[2].req; p.ConfigVersion != 4 || p.ConfigError != "" {
		t.Fatalf("push after the hook: %+v", p)
	}
	if b, _ := os.ReadFile(out); string(b) != "{\"k\":\"v\",\"push_interval\":99}\n4\n" {
		t.Fatalf("hook got %q", b)
	}
	for i, p := range pushes {
		if p.req.Seq != uint64(i+1) || p.token != "7.token-1" {
			t.Fatalf("push %d: seq %d token %q", i, p.req.Seq, p.token)
		}
		var names []string
		for _, i := range p.req.State.Interfaces {
			names = append(names, i.Name)
		}
		if strings.Join(names, ",") != "lo,wwan0" {
			t.Fatalf("--interfaces wwan*,lo: %v", names)
		}
	}
}

func testShellAgentOnceAndErrors(t *testing.T, sh shellEnv) {
	f := newFakeServer(t)
	run := func(args ...string) (string, error) {
		argv := append(append(append([]string{}, sh.argv...), shellScript(t)), args...)
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Env = append(slices.Clip(sh.env), "TMPDIR="+t.TempDir())
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		go func() { <-ctx.Done(); cmd.Process.Kill() }()
		err := cmd.Run()
		return out.String(), err
	}
	state := filepath.Join(t.TempDir(), "state")
	common := []string{"--server", f.srv.URL, "--ca-cert", f.caFile, "--root", "testdata/root", "--state-dir", state}
	if out, err := run("--help"); err != nil || !strings.Contains(out, "--enroll-secret") {
		t.Fatalf("--help: %v %s", err, out)
	}
	for _, bad := range [][]string{{"--bogus"}, {"--server"}, {"--server", "http://x"}, {"--server", "https://x", "--timeout", "soon"}} {
		if out, err := run(bad...); err == nil {
			t.Errorf("%q accepted: %s", bad, out)
		}
	}
	// Wrong CA: curl refuses the server.
	if out, err := run("--server", f.srv.URL, "--ca-cert", selfSignedFile(t), "--root", "testdata/root",
		"--state-dir", state, "--enroll-secret", "s", "--once"); err == nil {
		t.Fatalf("wrong CA accepted: %s", out)
	}
	if regs, _ := f.snapshot(); len(regs) != 0 {
		t.Fatal("registered through an unverified connection")
	}
	// Wrong enrollment secret.
	f.mu.Lock()
	f.onRegister = func(int) *answer { return &answer{status: 403} }
	f.mu.Unlock()
	out, err := run(append(common, "--enroll-secret", "wrong", "--once")...)
	if err == nil || !strings.Contains(out, "rejected the enrollment secret") {
		t.Fatalf("403: %v %s", err, out)
	}
	f.mu.Lock()
	f.onRegister = nil
	f.mu.Unlock()
	// --once twice: one registration, growing sequence numbers.
	for i := 0; i < 2; i++ {
		if out, err := run(append(common, "--enroll-secret", "s3cret", "--once")...); err != nil {
			t.Fatalf("--once: %v\n%s", err, out)
		}
	}
	regs, pushes := f.snapshot()
	if len(regs) != 2 || len(pushes) != 2 || pushes[1].req.Seq <= pushes[0].req.Seq {
		t.Fatalf("%d registrations (one refused), pushes %+v", len(regs), pushes)
	}
	// A failing hook makes --once fail.
	f.mu.Lock()
	f.onPush = func(n int, p protocol.PushRequest) *answer {
		if p.ConfigVersion < 1 {
			return &answer{status: 200, body: protocol.PushResponse{PushInterval: 60, Config: &protocol.Config{Version: 1, Data: json.RawMessage(`{}`)}}}
		}
		return nil
	}
	f.mu.Unlock()
	out, err = run(append(common, "--once", "--hook", "echo 'no such APN' >&2; exit 1")...)
	if err == nil || !strings.Contains(out, "no such APN") {
		t.Fatalf("failing hook with --once: %v %s", err, out)
	}
	_, pushes = f.snapshot()
	if p := pushes[len(pushes)-1].req; p.ConfigError != "no such APN" || p.ConfigVersion != 0 {
		t.Fatalf("last push: %+v", p)
	}
}

func TestShellAgentShellcheck(t *testing.T) {
	sc := need(t, "shellcheck")
	out, err := exec.Command(sc, "-s", "sh", "-S", "warning", shellScript(t)).CombinedOutput()
	if err != nil {
		t.Fatalf("shellcheck: %v\n%s", err, out)
	}
}
