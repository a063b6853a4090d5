package main

// Push quotas where they meet commands, persistent connections,
// configuration applies and restarts (docs/architecture.md lists the
// pairs): the real `drover serve` with its default quotas, the real Go
// agent (`drover agent --connect`) and the sh agent, a profile at a 600 s
// interval, so that a device may push 2 times per 600 s and 6 back to
// back. Every push the server asks for must go through at once, and the
// device must never be refused or listed as a quota offender.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/drover/drover/internal/testwait"
)

// quotaPrompt is how long a push the server asked for may take to arrive:
// "within a second" (docs/commands.md), with room for a loaded machine. A
// refused push waits minutes.
const quotaPrompt = 3 * time.Second

type quotaSeam struct {
	t             *testing.T
	data, base    string
	c             *http.Client
	admin, secret string
	cmdHook, hook string
	root, reboot  string // the agents' /proc, /sys and /etc; the reboot command
	deviceID      string
	profileID     string
	// The agents' logs, one after another.
	mu  sync.Mutex
	log bytes.Buffer
}

func newQuotaSeam(t *testing.T) *quotaSeam {
	t.Helper()
	s := &quotaSeam{t: t, data: t.TempDir()}
	p := startServe(t, s.data)
	s.base = "https://" + p.addr
	sec := readSecrets(t, s.data)
	s.secret, s.admin = sec.Enroll, sec.Admin
	s.c = trustingClient(t, s.data, 10*time.Second)
	dir := t.TempDir()
	s.cmdHook = filepath.Join(dir, "command-hook")
	if err := os.WriteFile(s.cmdHook, []byte("#!/bin/sh\necho \"$2 set to $3\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	s.hook = "cat >" + filepath.Join(dir, "applied.json")
	s.root = t.TempDir()
	if err := os.CopyFS(s.root, os.DirFS("../../internal/agent/testdata/root")); err != nil {
		t.Fatal(err)
	}
	// A reboot: the agent stops, and the uptime it reads starts again.
	s.reboot = filepath.Join(dir, "reboot")
	script := fmt.Sprintf("#!/bin/sh\necho '5.00 9.00' >%s\nkill -TERM $PPID\n", filepath.Join(s.root, "proc", "uptime"))
	if err := os.WriteFile(s.reboot, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("agent log:\n%s", s.agentLog())
		}
	})
	return s
}

func (s *quotaSeam) agentLog() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.log.String()
}

func (s *quotaSeam) cert() string { return filepath.Join(s.data, "tls", "cert.pem") }

// api calls the operator API; it fails the test on a status other than want.
func (s *quotaSeam) api(method, path, body string, want int, into any) {
	s.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, _ := http.NewRequest(method, s.base+path, rd)
	req.Header.Set("Authorization", "Bearer "+s.admin)
	req.Header.Set("Content-Type", "application/json")
	resp, err := s.c.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != want {
		s.t.Fatalf("%s %s: %d %s", method, path, resp.StatusCode, b)
	}
	if into != nil {
		if err := json.Unmarshal(b, into); err != nil {
			s.t.Fatalf("%s %s: %v", method, path, err)
		}
	}
}

// within polls cond until it holds, for at most d.
func (s *quotaSeam) within(d time.Duration, what string, cond func() bool) {
	s.t.Helper()
	if !testwait.Until(d, cond) {
		s.t.Fatalf("%s: not within %v", what, d)
	}
}

type seamDevice struct {
	ID        string `json:"id"`
	ProfileID string `json:"profile_id"`
	Seq       uint64 `json:"seq"`
	SyncState string `json:"sync_state"`
	State     struct {
		Uptime int64 `json:"uptime"`
	} `json:"state"`
}

func (s *quotaSeam) device() seamDevice {
	s.t.Helper()
	var d seamDevice
	s.api("GET", "/api/v1/devices/"+s.deviceID, "", 200, &d)
	return d
}

// registered waits for the agent's first push and slows its profile to
// the 600 s interval.
func (s *quotaSeam) registered() {
	s.t.Helper()
	s.within(30*time.Second, "the agent's first push", func() bool {
		var l struct{ Devices []seamDevice }
		s.api("GET", "/api/v1/devices", "", 200, &l)
		if len(l.Devices) == 1 && l.Devices[0].Seq > 0 {
			s.deviceID, s.profileID = l.Devices[0].ID, l.Devices[0].ProfileID
		}
		return s.deviceID != ""
	})
	s.api("PATCH", "/api/v1/profiles/"+s.profileID, `{"push_interval":600}`, 200, nil)
}

// command sends the device a command; it returns the job's ID.
func (s *quotaSeam) command(kind string, args ...string) string {
	s.t.Helper()
	body, _ := json.Marshal(map[string]any{"device_id": s.deviceID, "kind": kind, "args": args})
	var job struct{ ID string }
	s.api("POST", "/api/v1/commands", string(body), 201, &job)
	return job.ID
}

// commandReached polls until the job's copy is in state want (delivered:
// delivered or succeeded) for at most d.
func (s *quotaSeam) commandReached(id, want string, d time.Duration) {
	s.t.Helper()
	s.within(d, "command "+id+" "+want, func() bool {
		var j struct{ Counts map[string]int }
		s.api("GET", "/api/v1/commands/"+id, "", 200, &j)
		if j.Counts["failed"] > 0 || j.Counts["expired"] > 0 {
			s.t.Fatalf("command %s: %v", id, j.Counts)
		}
		if want == "delivered" {
			return j.Counts["delivered"]+j.Counts["succeeded"] == 1
		}
		return j.Counts[want] == 1
	})
}

// configure changes the profile's configuration and waits until the
// device reports it applied.
func (s *quotaSeam) configure(value string) {
	s.t.Helper()
	var p struct{ Version int64 }
	s.api("PATCH", "/api/v1/profiles/"+s.profileID, fmt.Sprintf(`{"config":{"apn":%q}}`, value), 200, &p)
	s.within(quotaPrompt, "configuration "+value+" applied", func() bool { return s.device().SyncState == "synchronized" })
}

// noQuotaHits checks that no push was refused and the device is no offender.
func (s *quotaSeam) noQuotaHits(logs ...string) {
	s.t.Helper()
	var q struct {
		Hits    map[string]uint64
		Devices []json.RawMessage
	}
	s.api("GET", "/api/v1/quotas", "", 200, &q)
	if q.Hits["push_rate"] != 0 || len(q.Devices) != 0 {
		s.t.Errorf("pushes refused with 429: %v; quota offenders: %s", q.Hits, q.Devices)
	}
	for _, l := range logs {
		if strings.Contains(l, "quota_exceeded") || strings.Contains(l, "more often than its profile allows") {
			s.t.Errorf("an agent was refused:\n%s", l)
		}
	}
}

// agent runs an agent, its output appended to the seam's log.
func (s *quotaSeam) agent(env []string, argv ...string) *proc {
	s.t.Helper()
	a := &proc{cmd: exec.Command(argv[0], argv[1:]...), exited: make(chan error, 1)}
	a.cmd.Env = env
	a.cmd.Stderr = lockedWriter{&s.mu, &s.log}
	a.cmd.Stdout = a.cmd.Stderr
	if err := a.cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		a.exited <- a.cmd.Wait()
		close(done)
	}()
	s.t.Cleanup(func() {
		// SIGTERM: the agent ends its children too, before its files go.
		select {
		case <-done:
			return
		default:
		}
		a.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			a.cmd.Process.Kill()
			<-done
		}
	})
	return a
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// goAgent starts `drover agent --connect` and waits for its connection
// (the n-th "persistent connection up" in the log).
func (s *quotaSeam) goAgent(state string, n int) *proc {
	s.t.Helper()
	a := s.agent(os.Environ(), droverBin, "agent", "--server", s.base, "--enroll-secret", s.secret,
		"--ca-cert", s.cert(), "--state-dir", state, "--root", s.root, "--connect", "--commands", "set-config,reboot",
		"--reboot-command", s.reboot, "--command-hook", s.cmdHook, "--hook", s.hook, "--log-level", "debug")
	s.within(30*time.Second, "the agent's persistent connection", func() bool {
		return strings.Count(s.agentLog(), "persistent connection up") >= n
	})
	return a
}

// Commands one after another to a Go agent holding a persistent
// connection, then a configuration change: each command is delivered at
// once, each result accepted, never a 429.
func TestSeamQuotaCommandsOverConnection(t *testing.T) {
	t.Parallel()
	s := newQuotaSeam(t)
	s.goAgent(t.TempDir(), 1)
	s.registered()
	var prev string
	for i := range 10 {
		id := s.command("set-config", "apn", fmt.Sprint(i))
		s.commandReached(id, "delivered", quotaPrompt)
		if prev != "" {
			s.commandReached(prev, "succeeded", quotaPrompt)
		}
		prev = id
	}
	// The configuration change nudges the device; its answer to that push
	// carries the last result, the push after the apply reports it.
	s.configure("last")
	s.commandReached(prev, "succeeded", quotaPrompt)
	s.noQuotaHits(s.agentLog())
}

// A Go agent restarted twice, sent a new configuration and a command, all
// within a minute, three times over, then rebooted by a command: never a
// 429, never an offender.
func TestSeamQuotaRestartsAppliesAndResults(t *testing.T) {
	t.Parallel()
	s := newQuotaSeam(t)
	state := t.TempDir()
	a := s.goAgent(state, 1)
	s.registered()
	ups := 1
	for round := range 3 {
		for range 2 {
			seq := s.device().Seq
			a.stop(t)
			ups++
			a = s.goAgent(state, ups)
			s.within(quotaPrompt, "the push after a restart", func() bool { return s.device().Seq > seq })
		}
		s.configure(fmt.Sprint("round ", round))
		id := s.command("set-config", "apn", fmt.Sprint(round))
		s.commandReached(id, "succeeded", quotaPrompt)
	}
	// A reboot command: its result, then the device reboots (the agent
	// stops, its uptime starts again) and pushes at once when it is back.
	s.commandReached(s.command("reboot"), "succeeded", quotaPrompt)
	select {
	case err := <-a.exited:
		if err != nil {
			t.Fatalf("the agent's reboot: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the reboot command did not stop the agent")
	}
	seq := s.device().Seq
	s.goAgent(state, ups+1)
	s.within(quotaPrompt, "the push after the reboot", func() bool { d := s.device(); return d.Seq > seq && d.State.Uptime == 5 })
	s.noQuotaHits(s.agentLog())
}

// The sh agent under busybox, restarted for each round: its first push
// gets a new configuration and a command, it applies one, runs the other
// and reports both at once. Four rounds, nine pushes: never a 429.
func TestSeamQuotaShellAgent(t *testing.T) {
	t.Parallel()
	bb, err := exec.LookPath("busybox")
	if err == nil {
		_, err = exec.LookPath("curl")
	}
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("busybox and curl must be installed in CI: %v", err)
		}
		t.Skipf("busybox or curl missing: %v", err)
	}
	script, err := filepath.Abs("../../agent/drover-agent.sh")
	if err != nil {
		t.Fatal(err)
	}
	s := newQuotaSeam(t)
	state := t.TempDir()
	env := append(os.Environ(), "TMPDIR="+t.TempDir())
	run := func() *proc {
		return s.agent(env, bb, "sh", script, "--server", s.base, "--enroll-secret", s.secret,
			"--ca-cert", s.cert(), "--state-dir", state, "--root", s.root,
			"--commands", "set-config", "--command-hook", s.cmdHook, "--hook", s.hook, "--log-level", "debug")
	}
	a := run()
	s.registered()
	for round := range 4 {
		a.stop(t)
		var p struct{ Version int64 }
		s.api("PATCH", "/api/v1/profiles/"+s.profileID, fmt.Sprintf(`{"config":{"apn":"round %d"}}`, round), 200, &p)
		id := s.command("set-config", "apn", fmt.Sprint(round))
		a = run()
		s.commandReached(id, "succeeded", 10*time.Second) // a shell agent starts slowly
		s.within(quotaPrompt, "the configuration applied", func() bool { return s.device().SyncState == "synchronized" })
	}
	s.noQuotaHits(s.agentLog())
}
