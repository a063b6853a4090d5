package agent

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/drover/drover/internal/protocol"
)

// answer is what the fake server replies.
type answer struct {
	status     int
	retryAfter string
	body       any
}

type pushRecord struct {
	token string
	req   protocol.PushRequest
}

// fakeServer speaks the device protocol with scripted answers and checks
// every request the way the real server does.
type fakeServer struct {
	t      *testing.T
	srv    *httptest.Server
	caFile string

	mu         sync.Mutex
	registers  []protocol.RegisterRequest
	pushes     []pushRecord
	token      string // the valid token
	onRegister func(n int) *answer
	onPush     func(n int, p protocol.PushRequest) *answer // nil answer: default
}

func newFakeServer(t *testing.T) *fakeServer {
	f := &fakeServer{t: t}
	f.srv = httptest.NewUnstartedServer(http.HandlerFunc(f.handle))
	f.srv.Config.ErrorLog = log.New(io.Discard, "", 0) // handshakes the agent refuses are expected
	f.srv.StartTLS()
	t.Cleanup(f.srv.Close)
	f.caFile = filepath.Join(t.TempDir(), "ca.pem")
	pemBytes := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: f.srv.Certificate().Raw})
	if err := os.WriteFile(f.caFile, pemBytes, 0o644); err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *fakeServer) handle(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	var a *answer
	switch r.URL.Path {
	case protocol.PathRegister:
		req, err := protocol.DecodeRegister(body)
		if err != nil {
			f.t.Errorf("agent sent an invalid registration: %v: %s", err, body)
			a = &answer{status: 400}
			break
		}
		f.registers = append(f.registers, req)
		n := len(f.registers)
		if f.onRegister != nil {
			a = f.onRegister(n)
		}
		if a == nil {
			f.token = fmt.Sprintf("7.token-%d", n)
			a = &answer{status: 200, body: protocol.RegisterResponse{DeviceID: "7", Token: f.token, PushInterval: 60, New: n == 1}}
		}
	case protocol.PathPush:
		req, err := protocol.DecodePush(body)
		if err != nil {
			f.t.Errorf("agent sent an invalid push: %v: %s", err, body)
			a = &answer{status: 400}
			break
		}
		token := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
		f.pushes = append(f.pushes, pushRecord{token: token, req: req})
		if f.onPush != nil {
			a = f.onPush(len(f.pushes), req)
		}
		if a == nil {
			if token != f.token {
				a = &answer{status: 401, body: protocol.ErrorBody{Error: protocol.ErrorDetail{Code: "unauthorized", Message: "register again"}}}
			} else {
				a = &answer{status: 200, body: protocol.PushResponse{PushInterval: 60}}
			}
		}
	default:
		a = &answer{status: 404}
	}
	f.mu.Unlock()
	if a.retryAfter != "" {
		w.Header().Set("Retry-After", a.retryAfter)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(a.status)
	if a.body == nil {
		a.body = protocol.ErrorBody{Error: protocol.ErrorDetail{Code: "scripted", Message: http.StatusText(a.status)}}
	}
	json.NewEncoder(w).Encode(a.body)
}

func (f *fakeServer) snapshot() ([]protocol.RegisterRequest, []pushRecord) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]protocol.RegisterRequest(nil), f.registers...), append([]pushRecord(nil), f.pushes...)
}

// testConfig is an agent configuration against f with the fake /proc tree.
func testConfig(t *testing.T, f *fakeServer) Config {
	cfg := DefaultConfig()
	cfg.Server = f.srv.URL
	cfg.EnrollSecret = "s3cret"
	cfg.StateDir = t.TempDir()
	cfg.TLS.CACert = f.caFile
	cfg.Root = "testdata/root"
	cfg.CPUWindow = 0
	cfg.MinBackoff, cfg.MaxBackoff = time.Second, 8*time.Second
	cfg.RequestTimeout = 5 * time.Second
	if testing.Verbose() {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return cfg
}

// runRecorded runs the agent with instant sleeps until it has slept n
// times, and returns the requested sleeps.
func runRecorded(t *testing.T, cfg Config, n int) []time.Duration {
	t.Helper()
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var sleeps []time.Duration
	a.sleep = func(ctx context.Context, d time.Duration) bool {
		sleeps = append(sleeps, d)
		if len(sleeps) >= n {
			cancel()
			return false
		}
		return ctx.Err() == nil
	}
	if err := a.Run(ctx); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if len(sleeps) < n {
		t.Fatalf("agent stopped after %d sleeps, want %d", len(sleeps), n)
	}
	return sleeps
}

func readState(t *testing.T, dir string) persisted {
	t.Helper()
	p, err := loadState(dir)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func within(d, lo, hi time.Duration) bool { return d >= lo && d <= hi }

func TestAgentRegistersPushesAndFollowsInterval(t *testing.T) {
	f := newFakeServer(t)
	intervals := []int{60, 5, 7}
	f.onPush = func(n int, _ protocol.PushRequest) *answer {
		return &answer{status: 200, body: protocol.PushResponse{PushInterval: intervals[min(n-1, 2)]}}
	}
	cfg := testConfig(t, f)
	sleeps := runRecorded(t, cfg, 3)
	regs, pushes := f.snapshot()
	if len(regs) != 1 || regs[0].DeviceType != "openwrt" || regs[0].Firmware != "OpenWrt 23.05.3 r23809-234f1a2efa" ||
		regs[0].EnrollmentSecret != "s3cret" || len(regs[0].MachineID) != 32 {
		t.Fatalf("registrations: %+v", regs)
	}
	for i, want := range []time.Duration{60, 5, 7} {
		if !within(sleeps[i], want*time.Second-2*time.Second, want*time.Second) {
			t.Errorf("sleep %d = %v, want about %ds", i, sleeps[i], want)
		}
	}
	for i, p := range pushes {
		if p.req.Seq != uint64(i+1) || p.token != "7.token-1" || *p.req.State.Uptime != 12345 || p.req.State.Firmware != regs[0].Firmware {
			t.Fatalf("push %d: seq %d token %q state %s", i, p.req.Seq, p.token, p.req.RawState)
		}
	}
	st := readState(t, cfg.StateDir)
	if st.DeviceID != "7" || st.Token != "7.token-1" || st.Seq < 3 || st.Server != cfg.Server {
		t.Fatalf("state file: %+v", st)
	}
}

func TestAgentAppliesConfigurationAndReportsAtOnce(t *testing.T) {
	f := newFakeServer(t)
	data := `{"apn":"internet","nested":{"list":[1,2,"}}"],"push_interval":3}}`
	f.onPush = func(n int, p protocol.PushRequest) *answer {
		resp := protocol.PushResponse{PushInterval: 60}
		if p.ConfigVersion < 3 {
			resp.Config = &protocol.Config{Version: 3, Data: json.RawMessage(data)}
		}
		return &answer{status: 200, body: resp}
	}
	cfg := testConfig(t, f)
	out := t.TempDir()
	cfg.Hook = fmt.Sprintf(`cat > %s/stdin.json; echo "$DROVER_CONFIG_VERSION $DROVER_APPLIED_VERSION $DROVER_DEVICE_ID" > %[1]s/env; cmp -s %[1]s/stdin.json "$DROVER_CONFIG_FILE" && echo same >> %[1]s/env`, out)
	sleeps := runRecorded(t, cfg, 2)
	_, pushes := f.snapshot()
	if len(pushes) != 3 {
		t.Fatalf("%d pushes, want 3 (state, report of the applied configuration, next interval)", len(pushes))
	}
	if p := pushes[0].req; p.ConfigVersion != 0 || p.ConfigError != "" {
		t.Fatalf("first push: %+v", p)
	}
	if p := pushes[1].req; p.ConfigVersion != 3 || p.ConfigError != "" {
		t.Fatalf("report push: version %d error %q", p.ConfigVersion, p.ConfigError)
	}
	if !within(sleeps[0], 58*time.Second, 60*time.Second) {
		t.Fatalf("after the report the agent waited %v, want the interval", sleeps[0])
	}
	if b, _ := os.ReadFile(filepath.Join(out, "stdin.json")); strings.TrimSpace(string(b)) != data {
		t.Fatalf("hook got %q on stdin, want %q", b, data)
	}
	if b, _ := os.ReadFile(filepath.Join(out, "env")); string(b) != "3 0 7\nsame\n" {
		t.Fatalf("hook environment: %q", b)
	}
	if b, _ := os.ReadFile(filepath.Join(cfg.StateDir, appliedFile)); strings.TrimSpace(string(b)) != data {
		t.Fatalf("applied configuration kept as %q", b)
	}
	if st := readState(t, cfg.StateDir); st.ConfigVersion != 3 || st.ConfigError != "" {
		t.Fatalf("state: %+v", st)
	}
}

// A configuration whose version is a lower number than the applied one
// is applied: versions are compared for equality (a layered
// configuration's next version may be lower).
func TestAgentAppliesLowerVersion(t *testing.T) {
	f := newFakeServer(t)
	f.onPush = func(n int, p protocol.PushRequest) *answer {
		resp := protocol.PushResponse{PushInterval: 60}
		switch {
		case p.ConfigVersion == 0:
			resp.Config = &protocol.Config{Version: 9, Data: json.RawMessage(`{"a":9}`)}
		case p.ConfigVersion == 9:
			resp.Config = &protocol.Config{Version: 5, Data: json.RawMessage(`{"a":5}`)}
		}
		return &answer{status: 200, body: resp}
	}
	cfg := testConfig(t, f)
	cfg.Hook = "true"
	runRecorded(t, cfg, 2)
	_, pushes := f.snapshot()
	var versions []int64
	for _, p := range pushes {
		versions = append(versions, p.req.ConfigVersion)
	}
	if st := readState(t, cfg.StateDir); st.ConfigVersion != 5 || !slices.Contains(versions, 5) {
		t.Fatalf("state %+v, reported versions %v: version 5 not applied after 9", st, versions)
	}
}

func TestAgentReportsHookFailureWithoutRetryingAtOnce(t *testing.T) {
	f := newFakeServer(t)
	f.onPush = func(n int, p protocol.PushRequest) *answer {
		resp := protocol.PushResponse{PushInterval: 60}
		if p.ConfigVersion < 2 {
			resp.Config = &protocol.Config{Version: 2, Data: json.RawMessage(`{"apn":"bad"}`)}
		}
		return &answer{status: 200, body: resp}
	}
	cfg := testConfig(t, f)
	runs := filepath.Join(t.TempDir(), "runs")
	cfg.Hook = "echo run >> " + runs + "; echo 'checking APN'; echo 'first problem' >&2; echo 'modem refused APN bad' >&2; exit 4"
	cfg.HookRetry = time.Hour
	runRecorded(t, cfg, 3)
	_, pushes := f.snapshot()
	if len(pushes) != 4 {
		t.Fatalf("%d pushes, want 4", len(pushes))
	}
	for i, p := range pushes[1:] {
		if p.req.ConfigVersion != 0 || p.req.ConfigError != "modem refused APN bad" {
			t.Fatalf("push %d: version %d error %q", i+2, p.req.ConfigVersion, p.req.ConfigError)
		}
	}
	if b, _ := os.ReadFile(runs); strings.Count(string(b), "run") != 1 {
		t.Fatalf("hook ran %d times within the retry period, want once", strings.Count(string(b), "run"))
	}
	st := readState(t, cfg.StateDir)
	if st.FailedVersion != 2 || st.ConfigError == "" || st.FailedAt.IsZero() {
		t.Fatalf("state: %+v", st)
	}

	// After the retry period the same version is tried again, once per
	// interval: no loop of immediate pushes.
	os.Remove(runs)
	cfg.HookRetry = time.Nanosecond
	sleeps := runRecorded(t, cfg, 3)
	_, all := f.snapshot()
	if n := len(all) - len(pushes); n > 6 {
		t.Fatalf("%d pushes for 3 sleeps: the failing hook makes the agent loop", n)
	}
	for _, s := range sleeps {
		if s < 55*time.Second {
			t.Fatalf("sleeps %v: retries of a failing hook must wait for the interval", sleeps)
		}
	}
	if b, _ := os.ReadFile(runs); strings.Count(string(b), "run") != 3 {
		t.Fatalf("hook ran %d times in 3 intervals, want once per interval", strings.Count(string(b), "run"))
	}
}

func TestAgentHookProblems(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, hook string
		timeout    time.Duration
		want       string
	}{
		{"none", "", time.Minute, "no configuration hook is installed on this device"},
		{"timeout", "sleep 30", 300 * time.Millisecond, "hook timed out after 300ms"},
		{"silent", "exit 9", time.Minute, "hook exited with status 9"},
		{"stdout", "echo 'only on stdout'; exit 1", time.Minute, "only on stdout"},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFakeServer(t)
			f.onPush = func(n int, p protocol.PushRequest) *answer {
				resp := protocol.PushResponse{PushInterval: 60}
				if p.ConfigVersion < 1 {
					resp.Config = &protocol.Config{Version: 1, Data: json.RawMessage(`{}`)}
				}
				return &answer{status: 200, body: resp}
			}
			cfg := testConfig(t, f)
			cfg.Hook, cfg.HookTimeout = c.hook, c.timeout
			start := time.Now()
			runRecorded(t, cfg, 1)
			if time.Since(start) > 10*time.Second {
				t.Fatal("hook was not stopped in time")
			}
			_, pushes := f.snapshot()
			if got := pushes[len(pushes)-1].req.ConfigError; !strings.Contains(got, c.want) {
				t.Fatalf("config_error %q, want %q", got, c.want)
			}
		})
	}
}

func TestAgentReregistersOn401KeepingMachineID(t *testing.T) {
	f := newFakeServer(t)
	f.onPush = func(n int, _ protocol.PushRequest) *answer {
		if n == 2 {
			f.token = "7.rotated" // e.g. the device was re-registered elsewhere
		}
		return nil
	}
	cfg := testConfig(t, f)
	sleeps := runRecorded(t, cfg, 3)
	regs, pushes := f.snapshot()
	if len(regs) != 2 || regs[0].MachineID != regs[1].MachineID {
		t.Fatalf("registrations: %+v", regs)
	}
	// push 1 ok, sleep, push 2 → 401, register, push 3 at once, sleep, push 4, sleep
	if len(pushes) != 4 || pushes[2].token != "7.token-2" || pushes[3].token != "7.token-2" {
		t.Fatalf("pushes: %+v", pushes)
	}
	for _, s := range sleeps {
		if s < 50*time.Second {
			t.Fatalf("sleeps %v: the 401 should lead to an immediate registration, not a wait", sleeps)
		}
	}
	if st := readState(t, cfg.StateDir); st.Token != "7.token-2" || st.DeviceID != "7" {
		t.Fatalf("state: %+v", st)
	}
}

func TestAgentBacksOffWhenFreshTokenIsRefused(t *testing.T) {
	f := newFakeServer(t)
	f.onPush = func(int, protocol.PushRequest) *answer { return &answer{status: 401} }
	cfg := testConfig(t, f)
	sleeps := runRecorded(t, cfg, 4)
	regs, pushes := f.snapshot()
	if len(regs) > 5 || len(pushes) > 5 {
		t.Fatalf("%d registrations and %d pushes for 4 sleeps: a 401 loop", len(regs), len(pushes))
	}
	for i, s := range sleeps {
		if s < cfg.MinBackoff/2 {
			t.Fatalf("sleep %d = %v", i, s)
		}
	}
}

func TestAgentHonoursRetryAfter(t *testing.T) {
	f := newFakeServer(t)
	f.onPush = func(n int, _ protocol.PushRequest) *answer {
		if n == 1 {
			return &answer{status: 503, retryAfter: "7"}
		}
		return nil
	}
	cfg := testConfig(t, f)
	sleeps := runRecorded(t, cfg, 2)
	if !within(sleeps[0], 7*time.Second, 10500*time.Millisecond) {
		t.Fatalf("after 503 Retry-After: 7 the agent waited %v", sleeps[0])
	}
	if !within(sleeps[1], 58*time.Second, 60*time.Second) {
		t.Fatalf("then %v, want the interval", sleeps[1])
	}
}

func TestAgentBacksOffOnErrorsAndResets(t *testing.T) {
	f := newFakeServer(t)
	f.onPush = func(n int, _ protocol.PushRequest) *answer {
		if n <= 5 || n == 7 {
			return &answer{status: 500}
		}
		return nil
	}
	cfg := testConfig(t, f)
	sleeps := runRecorded(t, cfg, 7)
	nominal := []time.Duration{1, 2, 4, 8, 8} // seconds, capped at MaxBackoff
	for i, n := range nominal {
		if !within(sleeps[i], n*time.Second/2, n*time.Second) {
			t.Fatalf("backoff %d = %v, want within %v..%v (all: %v)", i, sleeps[i], n*time.Second/2, n*time.Second, sleeps)
		}
	}
	if !within(sleeps[5], 58*time.Second, 60*time.Second) {
		t.Fatalf("after success: %v", sleeps[5])
	}
	if !within(sleeps[6], 500*time.Millisecond, time.Second) {
		t.Fatalf("backoff did not reset after success: %v", sleeps[6])
	}
}

func TestAgentBacksOffOnNetworkErrors(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var mu sync.Mutex
	conns := 0
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns++
			mu.Unlock()
			c.Close()
		}
	}()
	f := newFakeServer(t)
	cfg := testConfig(t, f)
	cfg.Server = "https://" + ln.Addr().String()
	sleeps := runRecorded(t, cfg, 6)
	for i, s := range sleeps {
		if s < cfg.MinBackoff/2 || s > cfg.MaxBackoff {
			t.Fatalf("sleep %d = %v (all %v)", i, s, sleeps)
		}
	}
	if sleeps[4] < 4*time.Second {
		t.Fatalf("backoff does not grow: %v", sleeps)
	}
	mu.Lock()
	defer mu.Unlock()
	if conns < 5 || conns > 7 {
		t.Fatalf("%d connection attempts for 6 sleeps", conns)
	}
}

func TestAgentEnrollmentRejected(t *testing.T) {
	f := newFakeServer(t)
	f.onRegister = func(int) *answer { return &answer{status: 403} }
	cfg := testConfig(t, f)
	cfg.Once = true
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	err = a.Run(context.Background())
	a.Close()
	if !errors.Is(err, ErrEnrollment) {
		t.Fatalf("--once with a wrong secret: %v", err)
	}
	cfg.Once = false
	sleeps := runRecorded(t, cfg, 2)
	if sleeps[0] != cfg.EnrollRetry || sleeps[1] != cfg.EnrollRetry {
		t.Fatalf("after 403 the agent waited %v, want %v", sleeps, cfg.EnrollRetry)
	}
}

func TestAgentSequencePersistsWithFewWrites(t *testing.T) {
	f := newFakeServer(t)
	cfg := testConfig(t, f)
	inode := func() uint64 {
		fi, err := os.Stat(filepath.Join(cfg.StateDir, stateFile))
		if err != nil {
			t.Fatal(err)
		}
		return fi.Sys().(*syscall.Stat_t).Ino
	}
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	inodes := map[uint64]bool{}
	n := 0
	a.sleep = func(context.Context, time.Duration) bool {
		inodes[inode()] = true
		if n++; n == 20 {
			cancel()
			return false
		}
		return true
	}
	a.Run(ctx)
	a.Close()
	if len(inodes) != 1 {
		t.Fatalf("state file rewritten %d times in 20 pushes, want once", len(inodes))
	}
	// Two restarts: sequence numbers keep growing.
	cfg.Once = true
	for i := 0; i < 2; i++ {
		a, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := a.Run(context.Background()); err != nil {
			t.Fatal(err)
		}
		a.Close()
	}
	_, pushes := f.snapshot()
	for i := 1; i < len(pushes); i++ {
		if pushes[i].req.Seq <= pushes[i-1].req.Seq {
			t.Fatalf("seq went from %d to %d at push %d", pushes[i-1].req.Seq, pushes[i].req.Seq, i)
		}
	}
	if regs, _ := f.snapshot(); len(regs) != 1 {
		t.Fatalf("restarts registered again: %d registrations", len(regs))
	}
}

func TestAgentRegistersAgainForNewServerOrMachineID(t *testing.T) {
	f := newFakeServer(t)
	cfg := testConfig(t, f)
	cfg.Once = true
	run := func(c Config) {
		t.Helper()
		a, err := New(c)
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close()
		if err := a.Run(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	run(cfg)
	alt := cfg
	alt.Server = strings.Replace(cfg.Server, "127.0.0.1", "localhost", 1)
	alt.TLS.PinPubKey = pinOf(t, f.caFile) // the test certificate does not name localhost
	alt.TLS.CACert = ""
	run(alt)
	withID := alt
	withID.MachineID = "explicit-id"
	run(withID)
	regs, _ := f.snapshot()
	if len(regs) != 3 || regs[0].MachineID != regs[1].MachineID || regs[2].MachineID != "explicit-id" {
		t.Fatalf("registrations: %+v", regs)
	}
}

func TestAgentCollectorCommand(t *testing.T) {
	f := newFakeServer(t)
	cfg := testConfig(t, f)
	cfg.Once = true
	cfg.Collector = `printf 'rssi=-70\nrsrq=-9.5\noperator=Example Mobile\ntechnology=LTE\nband=B3\ndevice=%s\n' "$DROVER_DEVICE_ID"`
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	a.Close()
	_, pushes := f.snapshot()
	st := pushes[0].req.State
	if st.Signal == nil || *st.Signal.RSSI != -70 || *st.Signal.RSRQ != -9.5 || st.Signal.Operator != "Example Mobile" || st.Signal.Technology != "LTE" {
		t.Fatalf("signal: %s", pushes[0].req.RawState)
	}
	if st.Extra["band"] != "B3" || st.Extra["device"] != "7" {
		t.Fatalf("extra: %v", st.Extra)
	}

	cfg.Collector = "echo rssi=-80; echo 'modem not found' >&2; exit 1"
	a, err = New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	a.Close()
	_, pushes = f.snapshot()
	st = pushes[len(pushes)-1].req.State
	if st.Extra["collector_error"] != "modem not found" || st.Signal == nil || *st.Signal.RSSI != -80 {
		t.Fatalf("failing collector: %s", pushes[len(pushes)-1].req.RawState)
	}
}

func TestAgentStateDirIsExclusive(t *testing.T) {
	t.Parallel()
	f := newFakeServer(t)
	cfg := testConfig(t, f)
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), "another agent") {
		t.Fatalf("second agent on the same state dir: %v", err)
	}
}

// selfSignedFile writes a certificate unrelated to the test servers.
func selfSignedFile(t *testing.T) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "other"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "other.pem")
	if err := os.WriteFile(file, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
	return file
}

func pinOf(t *testing.T, file string) string {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	pin, err := PinOf(b)
	if err != nil {
		t.Fatal(err)
	}
	return pin
}

func TestAgentChecksServerCertificate(t *testing.T) {
	f := newFakeServer(t)
	otherCA := selfSignedFile(t)
	goodPin := pinOf(t, f.caFile)
	badPin := pinOf(t, otherCA)
	for _, c := range []struct {
		name    string
		tls     TLSOptions
		wantErr string
	}{
		{"system roots", TLSOptions{}, "certificate"},
		{"ca", TLSOptions{CACert: f.caFile}, ""},
		{"wrong ca", TLSOptions{CACert: otherCA}, "certificate"},
		{"pin alone", TLSOptions{PinPubKey: goodPin}, ""},
		{"pin among several", TLSOptions{PinPubKey: badPin + ";" + goodPin}, ""},
		{"wrong pin", TLSOptions{PinPubKey: badPin}, "matches no --pin-pubkey"},
		{"ca and wrong pin", TLSOptions{CACert: f.caFile, PinPubKey: badPin}, "matches no --pin-pubkey"},
		{"ca and pin", TLSOptions{CACert: f.caFile, PinPubKey: goodPin}, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := testConfig(t, f)
			cfg.TLS, cfg.Once = c.tls, true
			a, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			err = a.Run(context.Background())
			if c.wantErr == "" && err != nil || c.wantErr != "" && (err == nil || !strings.Contains(err.Error(), c.wantErr)) {
				t.Fatalf("err = %v, want %q", err, c.wantErr)
			}
		})
	}
}

func TestNewRejectsBadSettings(t *testing.T) {
	f := newFakeServer(t)
	for _, c := range []struct {
		name   string
		change func(*Config)
		want   string
	}{
		{"no server", func(c *Config) { c.Server = "" }, "--server is required"},
		{"http", func(c *Config) { c.Server = "http://127.0.0.1:1" }, "--allow-http"},
		{"ftp", func(c *Config) { c.Server = "ftp://x" }, "https://"},
		{"bad pin", func(c *Config) { c.TLS.PinPubKey = "sha256//tooshort" }, "--pin-pubkey"},
		{"missing ca", func(c *Config) { c.TLS.CACert = "/nonexistent.pem" }, "--ca-cert"},
		{"long type", func(c *Config) { c.Identity.DeviceType = strings.Repeat("x", 65) }, "device_type"},
		{"backoff", func(c *Config) { c.MaxBackoff = time.Millisecond }, "--max-backoff"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := testConfig(t, f)
			c.change(&cfg)
			if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want %q", err, c.want)
			}
		})
	}
	cfg := testConfig(t, f)
	cfg.Server, cfg.TLS.AllowHTTP = "http://127.0.0.1:1", true
	a, err := New(cfg)
	if err != nil {
		t.Fatalf("--allow-http: %v", err)
	}
	a.Close()
}
