package perf

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/drover/drover/internal/emulator"
	"github.com/drover/drover/internal/emulator/results"
	"github.com/drover/drover/internal/hostinfo"
)

// Options configure a run of one or more presets.
type Options struct {
	// A running server; empty: start one per run with ServerCmd.
	URL              string
	EnrollmentSecret string
	AdminToken       string // needed by PeakF (it changes the profile); reads /metrics without MetricsToken
	MetricsToken     string // reads /metrics (the server's --metrics-token)
	MetricsURL       string // the server's --metrics-listen, as http://host:port (default: URL, with a token)
	CAFile           string
	Insecure         bool
	ServerLog        string // remote: the server's log file, reviewed from its size at the start

	// A server started by perf: ServerCmd + "serve"-style flags.
	ServerCmd   []string // e.g. [/usr/bin/drover serve]
	ServerEnv   []string // added to the environment
	Persistence string   // default write-through
	DB          string   // default: SQLite in the temporary data dir
	ServerArgs  []string // passed through
	WorkDir     string   // parent of temporary data dirs (default: os.TempDir())
	// CPUs and MemoryBytes run a started server in a cgroup of its own
	// with that CPU quota and memory limit (0: none), so that one machine
	// measures several sizes; EnvLabel names the size in the protocol.
	CPUs        float64
	MemoryBytes int64
	EnvLabel    string

	// Workers are load machines (`drover perf worker` at host:port) that
	// run the emulated fleet split between them instead of this process;
	// WorkerToken is their shared secret; a worker that sends nothing for
	// WorkerTimeout (default 30 s) fails the test.
	Workers       []string
	WorkerToken   string
	WorkerTimeout time.Duration
	pool          *loadPool
	machineIDs    string        // the emulator's machine-ID kind ("": random); the registrar test sets it per run
	settle        time.Duration // the pause before the pre-test snapshot (0: 2 s; tests shorten it)

	Override override
	Conn     emulator.ConnMode // default: the preset's, else a new connection per request
	// TLSMaxVersion and TLSKeyExchange are what the emulated devices offer,
	// as the agent's flags (emulator.Config; "": the agent's defaults).
	TLSMaxVersion, TLSKeyExchange string
	SourceAddrs                   []net.IP // default for a local server: 127.0.0.1-127.0.0.8

	Version  string    // drover version for the environment
	Command  string    // the command line, for the protocol
	Progress io.Writer // one line every ProgressEvery (nil: none)
	// ProgressEvery defaults to 10 s.
	ProgressEvery time.Duration
	Thresholds    *thresholds
}

// Run runs one preset and returns its result. The result is returned with
// its parts so far when ctx ends early.
func Run(ctx context.Context, preset Preset, o Options) (*Result, error) {
	p, changes, err := o.Override.Apply(preset)
	if err != nil {
		return nil, err
	}
	if o.URL != "" && len(o.Override.Handlers) > 0 {
		return nil, errors.New("--handlers needs a server started by drover perf: a running server keeps its own threads")
	}
	if o.URL != "" && (o.CPUs > 0 || o.MemoryBytes > 0) {
		return nil, errors.New("--cpus and --memory limit a server started by drover perf; a running server has its own limits")
	}
	if o.URL == "" && len(o.ServerCmd) == 0 {
		return nil, errors.New("no server: give a URL or a server command")
	}
	if p.Kind == peak && p.Mode == peakFull && o.URL != "" && o.AdminToken == "" {
		return nil, errors.New(p.Name + " changes the configuration profile during the test: give --admin-token")
	}
	if len(o.Workers) > 0 {
		if o.URL == "" {
			return nil, errors.New("load machines (--workers) need a server they can reach: give its --url")
		}
		if p.Kind == rollout {
			return nil, errors.New(p.Name + ": a rollout test runs on one load machine (its downloads are watched live); drop --workers")
		}
		if o.pool, err = newLoadPool(ctx, o.Workers, o.WorkerToken, o.WorkerTimeout); err != nil {
			return nil, err
		}
	}
	registrarModes, err := registrarModesOf(p, o.Persistence)
	if err != nil {
		return nil, err
	}
	if p.Kind == registrar && len(registrarModes) < len(registrarPersistence) {
		only := strings.Join(registrarModes, ", ") + " only"
		if changes != "" {
			only = ", " + only
		}
		changes += only
	}
	if o.Persistence == "" || p.Kind == registrar {
		o.Persistence = "write-through"
	}
	if o.Conn == "" {
		o.Conn = p.Conn
	}
	if o.Conn == "" {
		o.Conn = emulator.ConnNew
	}
	if o.ProgressEvery == 0 {
		o.ProgressEvery = 10 * time.Second
	}
	if o.WorkDir != "" {
		if err := os.MkdirAll(o.WorkDir, 0o750); err != nil {
			return nil, fmt.Errorf("--work-dir: %w", err)
		}
	}
	th := defaultThresholds()
	if o.Thresholds != nil {
		th = *o.Thresholds
	}
	r := &Result{Format: resultFormat, Preset: p, Changes: changes, Command: o.Command, Started: time.Now().UTC(),
		Env: readEnvironment(o.Version), Thresholds: th}
	r.Env.Label = o.EnvLabel
	r.Env.CPUProbeStartUS = probeCPU()
	var lim syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim) == nil {
		r.Env.OpenFiles = lim.Cur
	}
	r.Setup = setup{Target: o.URL, Local: o.URL == "", Persistence: o.Persistence, TLS: p.SSL, Conn: string(o.Conn), ServerArgs: o.ServerArgs}
	r.Setup.Backend = backendName(o.DB, o.Persistence)
	if o.URL != "" {
		r.Setup.TLS = strings.HasPrefix(o.URL, "https://")
	}
	if r.Setup.TLS {
		r.Setup.TLSMaxVersion, r.Setup.TLSKeyExchange = cmp.Or(o.TLSMaxVersion, "1.3"), cmp.Or(o.TLSKeyExchange, emulator.DefaultConfig().TLSKeyExchange)
	}
	if o.URL != "" {
		r.Setup.Persistence, r.Setup.Backend = "as configured on the server", "as configured on the server"
		r.Env.Emulator = fmt.Sprintf("this machine (%s), in the drover perf process (GOMAXPROCS %d); the server at %s", r.Env.Host, runtime.GOMAXPROCS(0), o.URL)
	} else {
		r.Env.Emulator = fmt.Sprintf("the same machine as the server, in the drover perf process (GOMAXPROCS %d); the server a separate process", runtime.GOMAXPROCS(0))
		if o.SourceAddrs == nil {
			for i := 1; i <= sourceAddrsFor(p); i++ {
				o.SourceAddrs = append(o.SourceAddrs, net.IPv4(127, 0, 0, byte(i)))
			}
		}
	}
	handlers := []int{0}
	if o.URL == "" && len(p.Handlers) > 0 {
		switch {
		case p.Kind == benchmark || p.Kind == registrar:
			handlers = p.Handlers
		case len(p.Handlers) == 1:
			handlers = p.Handlers // one server with that many threads
		default:
			return r, fmt.Errorf("--handlers %s: a %s test runs one server; give one thread count (a Benchmark runs one part per count)", joinInts(p.Handlers), p.Kind)
		}
		for _, h := range handlers {
			if h > r.Env.Threads && o.Progress != nil {
				fmt.Fprintf(o.Progress, "%s warning: %d handler threads on a machine with %d CPU threads: the extra threads only take turns\n", p.Name, h, r.Env.Threads)
			}
		}
	}
	defer func() {
		r.Ended = time.Now().UTC()
		r.Env.CPUProbeEndUS = probeCPU()
	}()
	if p.Kind == registrar {
		return r, runRegistrar(ctx, r, p, handlers, registrarModes, o)
	}
	for _, h := range handlers {
		part, err := runPart(ctx, r, p, h, o)
		r.Parts = append(r.Parts, part)
		if err != nil {
			return r, err
		}
		if ctx.Err() != nil {
			return r, ctx.Err()
		}
	}
	return r, nil
}

// sourceAddrsFor is how many loopback source addresses a test connects
// from: 8, or for an open loop one per 20,000 connections a closed socket
// holds in TIME_WAIT for up to two minutes (a source address and a
// destination have about 28,000 ephemeral ports).
func sourceAddrsFor(p Preset) int {
	n := 8
	if p.Kind == overload {
		n = 32 // its rate is known only once the capacity is measured
	}
	if (p.Kind == fleet || p.Kind == stability) && p.LoopTime > 0 {
		rate := float64(p.Devices) / float64(p.LoopTime)
		n = max(n, int(math.Ceil(rate*120/20000)))
	}
	return min(n, 250)
}

func backendName(db, persistence string) string {
	if persistence == "memory" {
		return "none (in memory)"
	}
	switch {
	case db == "":
		return "SQLite (embedded)"
	case strings.HasPrefix(db, "postgres"):
		return "PostgreSQL"
	case strings.HasPrefix(db, "mysql"), strings.HasPrefix(db, "mariadb"):
		return "MariaDB/MySQL"
	default:
		return "SQLite"
	}
}

// target is the server under test during one part.
type target struct {
	url, secret, admin string
	metricsURL         string // where /metrics is read (remote)
	metricsToken       string // sent with it; "" for none
	tlsConf            *tls.Config
	caPEM              []byte
	client             *http.Client
	local              *localServer
	review             *logReview
	logFile            string
	logOffset          int64
	pool               *loadPool     // load machines; nil: this process
	info               *serverInfo   // remote: GET /api/v1/server answered (nil: not available)
	seed               string        // the emulated fleet's identity seed
	interval           time.Duration // overload test: the push interval offering OverloadFactor × capacity
	credentials        string        // a fleet test: the registered fleet's credentials file
}

func randomToken() string {
	b := make([]byte, 18)
	rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}

func runPart(ctx context.Context, r *Result, p Preset, handlers int, o Options) (resultPart, error) {
	part := resultPart{HandlerThreads: handlers}
	t, err := openTarget(ctx, p, handlers, o)
	if err != nil {
		part.Err = err.Error()
		return part, err
	}
	defer t.close()
	t.describe(r)
	if t.pool != nil {
		r.Env.Emulator = t.pool.describe()
		defer func() { r.Env.LoadMachines = slices.Clone(t.pool.machines) }()
	}
	if r.Setup.Target == "" || !r.Setup.Local {
		r.Setup.Target = t.url
	}
	if t.local != nil {
		r.Setup.Target = "local " + t.url
	}

	t.seed = "perf-" + strings.ToLower(p.Name) + "-" + strconv.FormatInt(time.Now().Unix(), 36)
	if p.Kind == registrar { // runs follow each other within a second: each its own sequential-ID prefix
		t.seed += "-" + randomToken()[:8]
	}
	if p.Kind == fleet || p.Kind == overload || p.Kind == rollout {
		sleepCtx(ctx, time.Second)
		if empty, err := t.snapshot(); err == nil {
			part.Empty = &empty
		}
		reg, err := registerFleet(ctx, p, t, o)
		part.Register = reg
		if err != nil {
			part.Err = err.Error()
			return part, err
		}
	}
	if p.Kind == overload {
		capa, err := measureCapacity(ctx, p, t, o)
		part.Capacity = capa
		if err != nil {
			part.Err = err.Error()
			return part, err
		}
		t.interval = time.Duration(capa.IntervalMs * float64(time.Millisecond))
	}

	// Settle, then the pre-test snapshot.
	sleepCtx(ctx, cmp.Or(o.settle, 2*time.Second))
	before, err := t.snapshot()
	if err != nil {
		part.Err = err.Error()
		return part, fmt.Errorf("sampling the server: %w", err)
	}
	part.Before = before

	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	every := time.Second
	if p.Duration > 0 {
		every = max(time.Second, (p.Duration / 1500).Round(time.Second))
	}
	smp := &sampler{t: t, every: every, cancel: cancel, before: before}
	smpDone := make(chan struct{})
	go func() { smp.loop(runCtx); close(smpDone) }()

	var wg sync.WaitGroup
	if p.Kind == peak && p.Mode == peakFull {
		wg.Add(1)
		go func() {
			defer wg.Done()
			part.ConfigChanges = t.changeConfig(runCtx, max(p.Duration/3, 3*time.Second), time.Now().Add(p.Duration))
		}()
	}
	part.Started = time.Now().UTC()
	var sum *results.Summary
	var series []point
	if p.Kind == rollout {
		sum, series, part.Rollout, err = driveRollout(runCtx, p, t, o, part.Started, smp)
	} else {
		sum, series, part.ScheduleStart, err = drive(runCtx, p, t, o, part.Started)
	}
	part.Ended = time.Now().UTC()
	cancel()
	wg.Wait()
	<-smpDone
	part.Samples = smp.samples
	part.Restarts = smp.restarts
	if smp.exit != "" {
		part.ServerExit = smp.exit
	}
	part.Series = series
	if sum != nil {
		part.Push = opStats(sum.Op(results.OpPush))
		if p.Kind != fleet && p.Kind != overload && p.Kind != rollout { // their registrations were before the test
			part.Register = opStats(sum.Op(results.OpRegister))
		}
		res := sum.Resources
		part.Emulator = emuStats{CPUAvg: res.CPUAvg, CPUMax: res.CPUMax, RSSMiB: mib(res.RSSMax), Cores: res.Cores, Warnings: sum.Warnings}
		conns := sum.Conns
		part.Conns = &conns
		if sum.Err != "" && err == nil && ctx.Err() == nil && part.ServerExit == "" {
			part.Err = sum.Err
		}
	}
	if err != nil && part.ServerExit == "" && ctx.Err() == nil {
		part.Err = err.Error()
	}
	if part.ServerExit == "" {
		if after, err := t.snapshot(); err == nil {
			part.After = after
		} else {
			part.After = smp.last
		}
		if m, err := t.metrics(); err == nil {
			part.SyncStates = m.SyncStates
		}
	} else {
		part.After = smp.last
	}
	part.Log, part.LogReviewed = t.logSummary()
	if ctx.Err() != nil && part.Err == "" {
		part.Err = "interrupted before the end of the test"
	}
	if part.ServerExit != "" {
		return part, fmt.Errorf("the server ended during the test: %s", part.ServerExit)
	}
	if err != nil && ctx.Err() == nil {
		return part, err
	}
	return part, nil
}

func opStats(o *results.OpSummary) opFigures {
	s := opFigures{Accepted: o.Accepted, Rejected: o.Rejected, Dropped: o.Dropped, Aborted: o.Aborted, Retried: o.Retried,
		Resent: o.Resent, Reregistered: o.Reregistered, Skipped: o.Skipped, Unregistered: o.Unregistered, Late: o.Late,
		ConfigsSeen: o.ConfigsSeen, RetryAfter: o.RetryAfter, ElapsedSec: o.Elapsed().Seconds()}
	if o.Latency != nil && o.Latency.Count() > 0 {
		s.LatencyMs = latency{P50: ms(o.Latency.Quantile(.5)), P90: ms(o.Latency.Quantile(.9)), P99: ms(o.Latency.Quantile(.99)),
			Max: ms(o.Latency.Max()), Mean: ms(o.Latency.Mean())}
	}
	return s
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// emuConfig is the emulator's configuration for a part, before its load model.
func emuConfig(p Preset, t *target, o Options) (emulator.Config, *progress) {
	cfg := emulator.DefaultConfig()
	cfg.Target, cfg.EnrollmentSecret, cfg.CACertPEM, cfg.Insecure = t.url, t.secret, t.caPEM, o.Insecure && t.local == nil
	cfg.Devices, cfg.Seed, cfg.MachineIDs = p.Devices, t.seed, o.machineIDs
	cfg.Conn, cfg.SourceAddrs, cfg.Workers = o.Conn, o.SourceAddrs, p.Threads
	cfg.TLSMaxVersion = o.TLSMaxVersion
	if o.TLSKeyExchange != "" {
		cfg.TLSKeyExchange = o.TLSKeyExchange
	}
	prog := &progress{w: o.Progress, every: o.ProgressEvery, name: p.Name}
	cfg.Progress = prog.show
	cfg.Warn = prog.warn
	return cfg, prog
}

// registerFleet registers a fleet test's devices before it (a registration
// storm on kept-alive connections, not measured) and saves their
// credentials for the test.
func registerFleet(ctx context.Context, p Preset, t *target, o Options) (opFigures, error) {
	dir, err := os.MkdirTemp(o.WorkDir, "drover-perf-cred")
	if err != nil {
		return opFigures{}, err
	}
	t.credentials = filepath.Join(dir, "credentials.jsonl")
	cfg, prog := emuConfig(p, t, o)
	prog.name = p.Name + " registration"
	cfg.Mode, cfg.Loops, cfg.Workers, cfg.Conn = emulator.ModeBenchmark, 0, 64, emulator.ConnKeepAlive
	cfg.CredentialsFile = t.credentials
	sum, err := t.emulate(ctx, cfg, nil, 0)
	if sum == nil {
		return opFigures{}, fmt.Errorf("registering the fleet: %w", err)
	}
	reg := opStats(sum.Op(results.OpRegister))
	if err != nil {
		return reg, fmt.Errorf("registering the fleet: %w", err)
	}
	if reg.Accepted < int64(p.Devices) {
		return reg, fmt.Errorf("registering the fleet: %d of %d devices registered", reg.Accepted, p.Devices)
	}
	return reg, nil
}

// capacityTime is how long an overload test pushes back to back to measure
// the capacity.
const capacityTime = 20 * time.Second

// measureCapacity runs an overload test's first phase: p.Threads workers
// push back to back (closed loop, the test's connection mode) for
// capacityTime; the capacity is the accepted pushes per second.
func measureCapacity(ctx context.Context, p Preset, t *target, o Options) (*capacity, error) {
	cfg, prog := emuConfig(p, t, o)
	prog.name = p.Name + " capacity"
	cfg.Mode, cfg.Loops, cfg.CredentialsFile = emulator.ModeBenchmark, 1<<30, t.credentials
	sum, err := t.emulate(ctx, cfg, nil, capacityTime)
	if sum == nil {
		return nil, fmt.Errorf("measuring the capacity: %w", err)
	}
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	op := sum.Op(results.OpPush)
	c := &capacity{Workers: p.Threads, Seconds: op.Elapsed().Seconds(), Push: opStats(op), PerSec: op.AcceptedRate()}
	if c.PerSec <= 0 {
		return c, errors.New("measuring the capacity: no push was accepted")
	}
	c.Offered = overloadFactor * c.PerSec
	c.IntervalMs = float64(p.Devices) / c.Offered * 1000
	return c, nil
}

// drive runs the emulator for one part.
func drive(ctx context.Context, p Preset, t *target, o Options, start time.Time) (*results.Summary, []point, float64, error) {
	cfg, _ := emuConfig(p, t, o)
	switch p.Kind {
	case stability, fleet, overload:
		cfg.Mode = emulator.ModeFleet
		cfg.Interval = time.Duration(p.LoopTime) * time.Second
		cfg.Duration = p.Duration
		cfg.MaxInflight = p.Threads
		cfg.CredentialsFile = t.credentials
		if p.Kind == overload { // p.Threads were the capacity phase's workers
			cfg.Interval, cfg.MaxInflight = t.interval, 15000
		}
	case benchmark:
		cfg.Mode = emulator.ModeBenchmark
		cfg.Loops = p.Loops
	case registrar:
		cfg.Mode, cfg.Loops = emulator.ModeBenchmark, 0 // register only
	case peak:
		cfg.Mode = emulator.ModeBenchmark
		cfg.Duration = p.Duration
		switch p.Mode {
		case peakRegister:
			cfg.Loops = 0
		case peakData:
			// Register first, unmeasured; the storm then starts from saved credentials.
			dir, err := os.MkdirTemp(o.WorkDir, "drover-perf-cred")
			if err != nil {
				return nil, nil, 0, err
			}
			defer os.RemoveAll(dir)
			cfg.CredentialsFile = filepath.Join(dir, "credentials.jsonl")
			reg := cfg
			reg.Loops, reg.Duration = 0, 0
			reg.Progress, reg.Warn = nil, nil
			pre, err2 := t.emulate(ctx, reg, nil, 0)
			if err2 != nil {
				return nil, nil, 0, fmt.Errorf("registering the fleet before the storm: %w", err2)
			}
			if n := pre.Op(results.OpRegister).Accepted; n < int64(p.Devices) {
				return nil, nil, 0, fmt.Errorf("registering the fleet before the storm: %d of %d devices registered", n, p.Devices)
			}
			cfg.Loops = 1 << 30
		case peakFull:
			cfg.Loops = 1 << 30
		}
	}
	width := time.Second
	if p.Duration > 0 {
		width = max(time.Second, (p.Duration / 600).Round(time.Second))
	}
	sink := newSeriesSink(start, width)
	if cfg.Mode == emulator.ModeFleet {
		sum, err := t.emulate(ctx, cfg, sink, 0)
		return sum, sink.points(), sink.scheduleStart(), err
	}
	// A closed loop's duration ends by cancellation, not by a context
	// deadline (emulateFor).
	dur := cfg.Duration
	cfg.Duration = 0
	sum, err := t.emulate(ctx, cfg, sink, dur)
	return sum, sink.points(), sink.scheduleStart(), err
}

// emulate runs the emulator here, or split over the load machines.
func (t *target) emulate(ctx context.Context, cfg emulator.Config, sink io.Writer, stopAfter time.Duration) (*results.Summary, error) {
	if t.pool != nil {
		return t.pool.run(ctx, cfg, sink, stopAfter)
	}
	return emulateFor(ctx, cfg, sink, stopAfter)
}

// progress prints a line every so often.
type progress struct {
	w     io.Writer
	every time.Duration
	name  string
	mu    sync.Mutex
	last  time.Time
}

func (pr *progress) show(pg emulator.Progress) {
	if pr.w == nil {
		return
	}
	pr.mu.Lock()
	defer pr.mu.Unlock()
	if !pg.Final && time.Since(pr.last) < pr.every {
		return
	}
	pr.last = time.Now()
	fmt.Fprintf(pr.w, "%s %s %s: push %d ok %d err (%.0f/s, p99 %s), register %d ok, emulator CPU %.2f\n",
		time.Now().Format("15:04:05"), pr.name, pg.Phase, pg.Push.Accepted, pg.Push.Errors(), pg.PushRate,
		pg.PushP99.Round(time.Millisecond), pg.Reg.Accepted, pg.CPU)
}

func (pr *progress) warn(msg string) {
	if pr.w != nil {
		fmt.Fprintf(pr.w, "%s %s emulator warning: %s\n", time.Now().Format("15:04:05"), pr.name, msg)
	}
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// --- the server under test ---

func openTarget(ctx context.Context, p Preset, handlers int, o Options) (*target, error) {
	t := &target{pool: o.pool}
	if o.URL == "" {
		ls, err := startLocal(ctx, p, handlers, o)
		if err != nil {
			return nil, err
		}
		t.local, t.review = ls, ls.review
		t.url, t.secret, t.admin, t.caPEM = ls.url, ls.secret, ls.admin, ls.caPEM
		t.metricsURL, t.metricsToken = ls.url, ls.admin
	} else {
		u, err := url.Parse(o.URL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("--url %q: want http(s)://host:port", o.URL)
		}
		t.url = strings.TrimSuffix(o.URL, "/")
		t.secret, t.admin = o.EnrollmentSecret, o.AdminToken
		if t.secret == "" {
			return nil, errors.New("a running server needs --enrollment-secret")
		}
		t.metricsURL, t.metricsToken = t.url, o.MetricsToken
		if t.metricsToken == "" {
			t.metricsToken = o.AdminToken
		}
		if o.MetricsURL != "" {
			if u, err := url.Parse(o.MetricsURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				return nil, fmt.Errorf("--metrics-url %q: want http(s)://host:port", o.MetricsURL)
			}
			t.metricsURL = strings.TrimSuffix(o.MetricsURL, "/")
		} else if t.metricsToken == "" {
			return nil, errors.New("a running server's /metrics needs --metrics-token or --admin-token, or its --metrics-listen address as --metrics-url")
		}
		if o.CAFile != "" {
			if t.caPEM, err = os.ReadFile(o.CAFile); err != nil {
				return nil, err
			}
		}
		if o.ServerLog != "" {
			st, err := os.Stat(o.ServerLog)
			if err != nil {
				return nil, fmt.Errorf("--server-log: %w", err)
			}
			t.logFile, t.logOffset = o.ServerLog, st.Size()
		}
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: o.Insecure && t.local == nil}
	if len(t.caPEM) > 0 {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(t.caPEM) {
			t.close()
			return nil, errors.New("CA certificate: no PEM certificate found")
		}
		tc.RootCAs = pool
	}
	t.tlsConf = tc
	t.client = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: tc, MaxIdleConnsPerHost: 2}}
	if t.local == nil {
		if _, err := t.metrics(); err != nil {
			t.close()
			return nil, fmt.Errorf("%s/metrics: %w", t.metricsURL, err)
		}
	}
	return t, nil
}

func (t *target) close() {
	if t.local != nil {
		t.local.stop()
	}
	if t.credentials != "" {
		os.RemoveAll(filepath.Dir(t.credentials))
	}
	if t.client != nil {
		t.client.CloseIdleConnections()
	}
}

func (t *target) metrics() (metrics, error) {
	req, err := http.NewRequest("GET", t.metricsURL+"/metrics", nil)
	if err != nil {
		return metrics{}, err
	}
	if t.metricsToken != "" {
		req.Header.Set("Authorization", "Bearer "+t.metricsToken)
	}
	resp, err := t.client.Do(req)
	if err != nil {
		return metrics{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return metrics{}, fmt.Errorf("HTTP %d", resp.StatusCode)
	}
	return parseMetrics(resp.Body)
}

// snapshot samples the server (from /proc when local, /metrics when
// remote) and, when local, the machine.
func (t *target) snapshot() (snapshot, error) {
	s := snapshot{At: time.Now().UTC()}
	if t.local != nil {
		ps, err := hostinfo.ReadProc(t.local.cmd.Process.Pid)
		if err != nil {
			return s, err
		}
		s.RSSMiB, s.CPUSecs = mib(ps.RSS), ps.CPUSecs
		mi, err1 := hostinfo.ReadMemInfo()
		l15, err2 := hostinfo.ReadLoad15()
		if err1 == nil && err2 == nil {
			s.UsedMiB, s.AvailMiB, s.Load15, s.Machine = mib(mi.Used), mib(mi.Available), l15, true
			s.limitMemory(hostinfo.ReadCgroup(t.local.cmd.Process.Pid))
		}
		return s, nil
	}
	if t.info != nil {
		if in, err := t.serverInfo(); err == nil {
			s.RSSMiB, s.CPUSecs = mib(in.RSSBytes), in.CPUSeconds
			s.UsedMiB, s.AvailMiB, s.Load15, s.Machine = mib(in.UsedBytes), mib(in.AvailBytes), in.Load15, in.RAMBytes > 0
			s.limitMemory(in.Cgroup)
			return s, nil
		}
	}
	m, err := t.metrics()
	if err != nil {
		return s, err
	}
	s.RSSMiB, s.CPUSecs = mib(m.RSS), m.CPUSecs
	return s, nil
}

func (t *target) logSummary() (logSummary, bool) {
	if t.review != nil {
		return t.review.Summary(), true
	}
	if t.logFile == "" {
		return logSummary{}, false
	}
	f, err := os.Open(t.logFile)
	if err != nil {
		return logSummary{}, false
	}
	defer f.Close()
	if _, err := f.Seek(t.logOffset, io.SeekStart); err != nil {
		return logSummary{}, false
	}
	rv := newLogReview(nil)
	if _, err := io.Copy(rv, f); err != nil {
		return logSummary{}, false
	}
	return rv.Summary(), true
}

// changeConfig updates every profile's configuration every period (a third
// of the test: long enough for the fleet to cycle), so that devices receive
// and acknowledge it; no change comes less than half a period before end.
// It returns the updates made.
func (t *target) changeConfig(ctx context.Context, period time.Duration, end time.Time) int {
	n := 0
	tick := time.NewTicker(period)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return n
		case <-tick.C:
		}
		if time.Until(end) < period/2 {
			return n
		}
		req, _ := http.NewRequestWithContext(ctx, "GET", t.url+"/api/v1/profiles", nil)
		req.Header.Set("Authorization", "Bearer "+t.admin)
		resp, err := t.client.Do(req)
		if err != nil {
			continue
		}
		var list struct {
			Profiles []struct {
				ID json.Number `json:"id"`
			} `json:"profiles"`
		}
		err = json.NewDecoder(resp.Body).Decode(&list)
		resp.Body.Close()
		if err != nil {
			continue
		}
		for _, pr := range list.Profiles {
			body := fmt.Sprintf(`{"config":{"perf_change":%d,"ntp":"pool.ntp.org","log_level":"info"}}`, n+1)
			req, _ := http.NewRequestWithContext(ctx, "PATCH", t.url+"/api/v1/profiles/"+pr.ID.String(), strings.NewReader(body))
			req.Header.Set("Authorization", "Bearer "+t.admin)
			req.Header.Set("Content-Type", "application/json")
			resp, err := t.client.Do(req)
			if err != nil {
				continue
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 {
				n++
			}
		}
	}
}

// sampler samples the server while the emulator runs.
type sampler struct {
	mu       sync.Mutex // samples, for a reader during the run
	t        *target
	every    time.Duration
	cancel   context.CancelFunc
	before   snapshot
	samples  []sample
	last     snapshot
	exit     string
	restarts int
}

func (s *sampler) loop(ctx context.Context) {
	prev := s.before
	s.last = prev
	start := time.Now()
	var startTime float64
	if s.t.local == nil {
		if m, err := s.t.metrics(); err == nil {
			startTime = m.StartTime
		}
	}
	tick := time.NewTicker(s.every)
	defer tick.Stop()
	var exited <-chan struct{}
	if s.t.local != nil {
		exited = s.t.local.done
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-exited:
			s.exit = s.t.local.exitReason()
			s.cancel()
			return
		case <-tick.C:
		}
		snap, err := s.t.snapshot()
		if err != nil {
			if s.t.local != nil {
				continue // the exit shows on done
			}
			continue // remote: a failed scrape is a gap in the chart
		}
		if s.t.local == nil && startTime != 0 {
			if m, err := s.t.metrics(); err == nil && m.StartTime != 0 && m.StartTime != startTime {
				s.restarts++
				startTime = m.StartTime
			}
		}
		sm := sample{T: time.Since(start).Seconds(), RSSMiB: snap.RSSMiB}
		if dt := snap.At.Sub(prev.At).Seconds(); dt > 0 && snap.CPUSecs >= prev.CPUSecs {
			sm.CPUPct = (snap.CPUSecs - prev.CPUSecs) / dt * 100
		}
		if snap.Machine {
			sm.UsedMiB, sm.AvailMiB, sm.Load15 = snap.UsedMiB, snap.AvailMiB, snap.Load15
		}
		s.mu.Lock()
		s.samples = append(s.samples, sm)
		s.mu.Unlock()
		prev, s.last = snap, snap
	}
}

// snapshotSamples is a copy of the samples so far.
func (s *sampler) snapshotSamples() []sample {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]sample(nil), s.samples...)
}

// localServer is `drover serve` started by perf.
type localServer struct {
	cmd                *exec.Cmd
	dir                string
	url, secret, admin string
	caPEM              []byte
	review             *logReview
	done               chan struct{}
	waitErr            error
	stopping           bool
	mu                 sync.Mutex
	stderrDone         chan struct{}
	limits             *hostinfo.Limits // --cpus, --memory; nil: none
}

func startLocal(ctx context.Context, p Preset, handlers int, o Options) (*localServer, error) {
	dir, err := os.MkdirTemp(o.WorkDir, "drover-perf-")
	if err != nil {
		return nil, err
	}
	ls := &localServer{dir: dir, secret: randomToken(), admin: randomToken(), done: make(chan struct{}), stderrDone: make(chan struct{})}
	args := append([]string{}, o.ServerCmd[1:]...)
	args = append(args, "--data-dir", filepath.Join(dir, "data"), "--log-format", "json", "--persistence", o.Persistence,
		"--enrollment-secret", ls.secret, "--admin-token", ls.admin, "--push-interval", strconv.Itoa(p.LoopTime),
		// The suite measures capacity with closed-loop pushes and registrations,
		// which per-device quotas and the registration rate limits would refuse
		// or slow; --server-args may set them again.
		"--quota-push-rate", "0", "--quota-history-samples", "0", "--quota-history-bytes", "0",
		"--register-rate", "0", "--register-rate-per-address", "0")
	if o.DB != "" {
		args = append(args, "--db", o.DB)
	}
	if handlers > 0 {
		args = append(args, "--threads", strconv.Itoa(handlers))
	}
	if p.SSL {
		args = append(args, "--listen", "127.0.0.1:0")
	} else {
		args = append(args, "--listen=", "--http-listen", "127.0.0.1:0")
	}
	args = append(args, o.ServerArgs...)
	ls.cmd = exec.Command(o.ServerCmd[0], args...)
	ls.cmd.Env = append(os.Environ(), o.ServerEnv...)
	ls.cmd.Stdout = io.Discard
	addr := make(chan string, 1)
	ls.review = newLogReview(func(_ []byte, rec logRecord) {
		if rec.Msg == "listening" && rec.Attrs["addr"] != "" {
			select {
			case addr <- rec.Attrs["proto"] + "://" + rec.Attrs["addr"]:
			default:
			}
		}
	})
	var tail bytes.Buffer // the first lines, for an early exit
	pr, pw := io.Pipe()
	ls.cmd.Stderr = pw
	go func() {
		defer close(ls.stderrDone)
		buf := make([]byte, 32<<10)
		for {
			n, err := pr.Read(buf)
			if n > 0 {
				ls.review.Write(buf[:n])
				ls.mu.Lock()
				if tail.Len() < 8<<10 {
					tail.Write(buf[:n])
				}
				ls.mu.Unlock()
			}
			if err != nil {
				return
			}
		}
	}()
	if err := ls.cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("starting the server: %w", err)
	}
	go func() {
		ls.waitErr = ls.cmd.Wait()
		pw.Close()
		close(ls.done)
	}()
	if o.CPUs > 0 || o.MemoryBytes > 0 {
		// Moved at once, before it listens: its start-up runs under the
		// limits too (the Go runtime then sets GOMAXPROCS to the quota).
		lim, err := hostinfo.NewLimits("drover-perf-"+strconv.Itoa(ls.cmd.Process.Pid), o.CPUs, o.MemoryBytes)
		if err == nil {
			ls.limits = lim
			err = lim.Add(ls.cmd.Process.Pid)
		}
		if err != nil {
			ls.stop()
			return nil, fmt.Errorf("--cpus/--memory: %w", err)
		}
	}
	select {
	case ls.url = <-addr:
	case <-ls.done:
		<-ls.stderrDone
		ls.mu.Lock()
		out := strings.TrimSpace(tail.String())
		ls.mu.Unlock()
		os.RemoveAll(dir)
		return nil, fmt.Errorf("the server exited at start (%v): %s", ls.waitErr, out)
	case <-time.After(2 * time.Minute):
		ls.stop()
		return nil, errors.New("the server did not listen within 2 minutes")
	case <-ctx.Done():
		ls.stop()
		return nil, ctx.Err()
	}
	if p.SSL {
		if ls.caPEM, err = os.ReadFile(filepath.Join(dir, "data", "tls", "cert.pem")); err != nil {
			ls.stop()
			return nil, fmt.Errorf("the server's certificate: %w", err)
		}
	}
	return ls, nil
}

func (ls *localServer) exitReason() string {
	<-ls.done
	if ls.waitErr != nil {
		return ls.waitErr.Error()
	}
	return "exited with status 0"
}

// stop ends the server with SIGTERM (SIGKILL after a minute) and removes
// its data.
func (ls *localServer) stop() {
	ls.mu.Lock()
	already := ls.stopping
	ls.stopping = true
	ls.mu.Unlock()
	if already {
		return
	}
	if ls.cmd.Process != nil {
		ls.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-ls.done:
		case <-time.After(time.Minute):
			ls.cmd.Process.Kill()
			<-ls.done
		}
		<-ls.stderrDone
	}
	if ls.limits != nil {
		ls.limits.Remove()
	}
	os.RemoveAll(ls.dir)
}
