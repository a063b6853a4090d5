// Package emulator impersonates a fleet of Drover devices: each emulated
// device registers, pushes its state from a template and follows the
// server's answers (configuration, 401, 503 with Retry-After) as a real
// agent does. It is a measuring instrument: every operation ends in exactly
// one counted outcome, latencies go to HdrHistograms, and its own CPU and
// memory are reported with the results.
//
// Run drives one process's share of the fleet (a shard) and streams result
// records as JSON lines (package results); `drover report` renders them.
package emulator

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/url"
	"os"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/drover/drover/internal/buildinfo"
	"github.com/drover/drover/internal/emulator/results"
	"github.com/drover/drover/internal/protocol"
)

// Mode is a load model.
type Mode string

// Load models.
const (
	// ModeFleet is open loop: every device pushes once per Interval at its
	// own phase; latency counts from the intended send time.
	ModeFleet Mode = "fleet"
	// ModeBenchmark is closed loop: Workers push the devices Loops times
	// as fast as the server answers.
	ModeBenchmark Mode = "benchmark"
	// ModeRamp is closed loop with a rising number of workers, until drops,
	// retries or 5xx answers appear.
	ModeRamp Mode = "ramp"
)

// Config is one emulator process's run. DefaultConfig holds the defaults;
// fields marked "auto" are derived from others when zero.
type Config struct {
	Target           string // base URL of the server, http:// or https://
	EnrollmentSecret string
	CACertPEM        []byte // trusted certificates; nil: the system's
	Insecure         bool   // skip certificate verification

	Devices int    // the whole fleet
	Shard   Shard  // this process's share (zero: 1/1)
	Seed    string // identity seed

	Mode     Mode
	Conn     ConnMode      // auto: new in fleet mode, keepalive otherwise
	Interval time.Duration // fleet push interval
	Duration time.Duration // fleet: run time (auto: 10 min); benchmark, ramp: limit (0: none)

	Workers int // benchmark workers; registration concurrency in benchmark and ramp
	Loops   int // benchmark loops over all devices (0: register only)

	RampStart        int     // first step's workers
	RampFactor       float64 // workers multiply by this each step
	RampStepDuration time.Duration
	RampMax          int // auto: min(devices of the shard, 16384)

	MaxInflight  int           // fleet: operations in flight at most
	Timeout      time.Duration // per request, connect and TLS included
	MaxRetries   int           // retries after 503/429 (negative: none)
	MaxRetryWait time.Duration // longest wait before a retry
	LateAfter    time.Duration // fleet: a send this much behind schedule is late

	SourceAddrs     []net.IP  // local addresses to dial from, round robin (nil: the system's choice)
	Template        *Template // push body (nil: DefaultTemplate)
	CredentialsFile string    // load and save device IDs and tokens ("": none)

	DeviceType, Model, Firmware string // registration fields

	RunID    string               // auto: time and random
	Progress func(Progress)       // called once per second and at the end
	Warn     func(string)         // called when a warning is raised during the run
	Logf     func(string, ...any) // informational messages (nil: none)
	// Records, when set, receives every result record written, as values.
	Records *results.Stream
}

// DefaultConfig is the defaults of every field, defined once here.
func DefaultConfig() Config {
	return Config{
		Devices: 1000, Seed: "drover", Mode: ModeFleet, Interval: 200 * time.Second,
		Workers: 8, Loops: 10, RampStart: 8, RampFactor: 2, RampStepDuration: 10 * time.Second,
		MaxInflight: 10000, Timeout: 30 * time.Second, MaxRetries: 5, MaxRetryWait: time.Minute,
		LateAfter: 100 * time.Millisecond, DeviceType: "router", Model: "EMU-R1", Firmware: "7.4.2",
	}
}

// Progress is a live view of a run.
type Progress struct {
	Phase       string // "register", "push" or "done"
	Elapsed     time.Duration
	Remaining   time.Duration // -1: unknown
	Push, Reg   results.Counts
	PushRate    float64 // operations finished per second in the last interval
	RegRate     float64
	PushP99     time.Duration // last interval
	Inflight    int
	Concurrency int
	CPU         float64 // emulator cores busy
	RSS         int64
	Final       bool
}

// Validate checks c and fills the "auto" fields. Run does it too.
func (c *Config) Validate() error {
	if c.Target == "" {
		return errors.New("no target URL")
	}
	if c.Devices <= 0 {
		return errors.New("devices must be positive")
	}
	c.Shard = c.Shard.norm()
	if c.Shard.K < 1 || c.Shard.K > c.Shard.N {
		return fmt.Errorf("shard %d/%d: want 1 ≤ k ≤ n", c.Shard.K, c.Shard.N)
	}
	switch c.Mode {
	case ModeFleet, ModeBenchmark, ModeRamp:
	default:
		return fmt.Errorf("mode %q: want fleet, benchmark or ramp", c.Mode)
	}
	if c.Conn == "" {
		c.Conn = ConnKeepAlive
		if c.Mode == ModeFleet {
			c.Conn = ConnNew
		}
	}
	switch c.Conn {
	case ConnNew, ConnResume, ConnKeepAlive:
	default:
		return fmt.Errorf("conn %q: want new, resume or keepalive", c.Conn)
	}
	if c.Interval <= 0 || c.Duration < 0 {
		return errors.New("interval and duration must be positive")
	}
	if c.Mode == ModeFleet && c.Duration == 0 {
		c.Duration = 10 * time.Minute
	}
	if c.Workers <= 0 || c.Loops < 0 {
		return errors.New("workers and loops must be positive")
	}
	if c.RampFactor <= 1 {
		return errors.New("ramp factor must be > 1")
	}
	if c.RampStepDuration < time.Second {
		return errors.New("ramp step duration must be at least 1 s")
	}
	shardDevices := (c.Devices + c.Shard.N - c.Shard.K) / c.Shard.N
	if c.RampMax == 0 {
		c.RampMax = min(shardDevices, 16384)
	}
	if c.Mode == ModeRamp && (c.RampStart < 1 || c.RampMax < c.RampStart) {
		return fmt.Errorf("ramp from %d to %d workers: want 1 ≤ start ≤ max", c.RampStart, c.RampMax)
	}
	if c.Mode == ModeRamp && c.RampMax > shardDevices {
		return fmt.Errorf("ramp max %d is more than the shard's %d devices (a device pushes one request at a time)", c.RampMax, shardDevices)
	}
	if c.MaxInflight <= 0 || c.Timeout <= 0 || c.MaxRetryWait <= 0 || c.LateAfter <= 0 {
		return errors.New("max inflight, timeout, max retry wait and late-after must be positive")
	}
	c.MaxRetries = max(c.MaxRetries, 0)
	if c.RunID == "" {
		var b [6]byte
		rand.Read(b[:])
		c.RunID = time.Now().UTC().Format("20060102T150405Z") + "-" + hex.EncodeToString(b[:])
	}
	if c.Logf == nil {
		c.Logf = func(string, ...any) {}
	}
	return nil
}

// engine is one run.
type engine struct {
	cfg   Config
	id    identity
	tr    *transport
	tpl   *Template
	rc    renderCtx
	devs  []*device
	w     *results.Writer
	start time.Time

	push, reg *opStats
	lag       *recorder // fleet: send time − intended time

	regPrefix, pushPrefix []byte

	phase       atomic.Value // string
	inflight    atomic.Int64
	concurrency atomic.Int64
	regTarget   atomic.Int64 // devices to register in this phase
	pushTarget  atomic.Int64 // pushes planned (benchmark)
	end         time.Time    // fleet end

	scratch sync.Pool
	hint    atomic.Int64

	warnMu   sync.Mutex
	warnings []string
	warned   map[string]bool

	ramp atomic.Pointer[rampState]
}

// scratch is one goroutine's reusable buffers.
type scratch struct {
	body, req, resp []byte
	res             response
	jit             rng
	hint            int
}

// Run runs cfg's shard of the fleet until its load model is done, its
// duration is over or ctx ends, streaming records to sink (nil: none).
// The summary is returned even when err is not nil, if the run started.
func Run(ctx context.Context, cfg Config, sink io.Writer) (*results.Summary, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	e, err := newEngine(cfg)
	if err != nil {
		return nil, err
	}
	if sink == nil {
		sink = io.Discard
	}
	e.w = results.NewWriter(sink)
	e.w.Keep = cfg.Records
	return e.run(ctx)
}

func newEngine(cfg Config) (*engine, error) {
	u, err := url.Parse(cfg.Target)
	if err != nil || u.Host == "" {
		return nil, fmt.Errorf("target %q is not a URL like https://host:8443", cfg.Target)
	}
	tlsConf := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: cfg.Insecure}
	if len(cfg.CACertPEM) > 0 {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(cfg.CACertPEM) {
			return nil, errors.New("CA certificate: no PEM certificate found")
		}
		tlsConf.RootCAs = pool
	}
	tr, err := newTransport(u, tlsConf, cfg.Conn, cfg.SourceAddrs, cfg.Timeout)
	if err != nil {
		return nil, err
	}
	tpl := cfg.Template
	if tpl == nil {
		if tpl, err = ParseTemplate("default", DefaultTemplate); err != nil {
			return nil, err
		}
	}
	e := &engine{
		cfg: cfg, id: newIdentity(cfg.Seed), tr: tr, tpl: tpl,
		push: newOpStats(), reg: newOpStats(), warned: map[string]bool{},
	}
	if cfg.Mode == ModeFleet {
		e.lag = newRecorder()
	}
	e.rc.firmware = cfg.Firmware
	e.phase.Store("start")
	base := strings.TrimSuffix(u.EscapedPath(), "/")
	hdr := " HTTP/1.1\r\nHost: " + u.Host + "\r\nUser-Agent: drover-emulator\r\nContent-Type: application/json\r\n"
	if cfg.Conn != ConnKeepAlive {
		hdr += "Connection: close\r\n"
	}
	e.regPrefix = []byte("POST " + base + protocol.PathRegister + hdr + "Content-Length: ")
	e.pushPrefix = []byte("POST " + base + protocol.PathPush + hdr + "Authorization: Bearer ")
	e.scratch.New = func() any {
		return &scratch{body: make([]byte, 0, 2048), req: make([]byte, 0, 4096), resp: make([]byte, 0, 1024),
			jit: newJitter(), hint: int(e.hint.Add(1))}
	}

	idx := cfg.Shard.indexes(cfg.Devices)
	e.devs = make([]*device, len(idx))
	for i, x := range idx {
		e.devs[i] = newDevice(e.id, x)
	}
	if cfg.CredentialsFile != "" {
		byIdx := make(map[int]*device, len(e.devs))
		for _, d := range e.devs {
			byIdx[d.idx] = d
		}
		n, err := loadCredentials(cfg.CredentialsFile, byIdx)
		if err != nil {
			return nil, fmt.Errorf("credentials: %w", err)
		}
		cfg.Logf("credentials: %d of %d devices loaded from %s", n, len(e.devs), cfg.CredentialsFile)
	}
	return e, nil
}

func (e *engine) run(ctx context.Context) (*results.Summary, error) {
	cfg := &e.cfg
	e.start = time.Now()
	e.rc.start = e.start
	host, _ := os.Hostname()
	st := &results.Start{
		Type: results.TypeStart, RunID: cfg.RunID, Shard: cfg.Shard.String(), Version: buildinfo.Version(), Started: e.start.UTC(),
		Mode: string(cfg.Mode), Target: cfg.Target, Conn: string(cfg.Conn), Devices: cfg.Devices, ShardDevices: len(e.devs),
		Seed: cfg.Seed, Template: e.tpl.Name, Host: host, GOMAXPROCS: runtime.GOMAXPROCS(0), CPUs: runtime.NumCPU(),
	}
	switch cfg.Mode {
	case ModeFleet:
		st.Interval, st.Duration, st.MaxInflight = cfg.Interval.Seconds(), cfg.Duration.Seconds(), cfg.MaxInflight
	case ModeBenchmark:
		st.Workers, st.Loops, st.Duration = cfg.Workers, cfg.Loops, cfg.Duration.Seconds()
	case ModeRamp:
		st.Workers, st.Duration = cfg.RampMax, cfg.Duration.Seconds()
	}
	for _, ip := range cfg.SourceAddrs {
		st.SourceAddrs = append(st.SourceAddrs, ip.String())
	}
	if err := e.w.Write(st); err != nil {
		return nil, fmt.Errorf("writing results: %w", err)
	}
	e.checkFDs()
	if cfg.Mode == ModeFleet {
		e.end = e.start.Add(cfg.Duration)
	}

	col := newCollector(e)
	colDone := make(chan struct{})
	stopCol := make(chan struct{})
	go func() { col.loop(stopCol); close(colDone) }()

	runCtx := ctx
	var cancel context.CancelFunc = func() {}
	if cfg.Duration > 0 && cfg.Mode != ModeFleet {
		runCtx, cancel = context.WithTimeout(ctx, cfg.Duration)
	}
	stopAbort := context.AfterFunc(ctx, func() { e.tr.shutdown(true) })
	var runErr error
	switch cfg.Mode {
	case ModeFleet:
		runErr = e.runFleet(runCtx)
	case ModeBenchmark:
		runErr = e.runBenchmark(runCtx)
	case ModeRamp:
		runErr = e.runRamp(runCtx)
	}
	cancel()
	stopAbort()
	e.tr.shutdown(false)
	e.phase.Store("done")
	close(stopCol)
	<-colDone

	if cfg.CredentialsFile != "" && e.reg.first.Load()+e.push.first.Load() != 0 {
		path := credentialsPath(cfg.CredentialsFile, cfg.Shard)
		n, err := saveCredentials(path, e.devs)
		if err != nil {
			e.warn("credentials could not be saved: " + err.Error())
		} else {
			cfg.Logf("credentials: %d devices saved to %s", n, path)
		}
	}
	if ctx.Err() != nil && runErr == nil {
		runErr = ctx.Err()
	}
	sum := col.summary()
	if runErr != nil && !errors.Is(runErr, context.DeadlineExceeded) {
		sum.Err = runErr.Error()
	}
	if err := e.w.Write(sum); err != nil && runErr == nil {
		runErr = fmt.Errorf("writing results: %w", err)
	}
	if errors.Is(runErr, context.DeadlineExceeded) && ctx.Err() == nil {
		runErr = nil // the run's own duration limit
	}
	return sum, runErr
}

// warn records a warning once (by key) and reports it at once.
func (e *engine) warnOnce(key, msg string) {
	e.warnMu.Lock()
	if e.warned[key] {
		e.warnMu.Unlock()
		return
	}
	e.warned[key] = true
	e.warnings = append(e.warnings, msg)
	e.warnMu.Unlock()
	if e.cfg.Warn != nil {
		e.cfg.Warn(msg)
	}
}

func (e *engine) warn(msg string) { e.warnOnce(msg, msg) }

func (e *engine) hasWarned(key string) bool {
	e.warnMu.Lock()
	defer e.warnMu.Unlock()
	return e.warned[key]
}

// checkFDs warns when the connections the run may open exceed the limit of
// open files.
func (e *engine) checkFDs() {
	var lim syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim) != nil {
		return
	}
	need := 0
	switch e.cfg.Mode {
	case ModeFleet:
		need = min(e.cfg.MaxInflight, len(e.devs))
	case ModeBenchmark:
		need = e.cfg.Workers
	case ModeRamp:
		need = e.cfg.RampMax
	}
	if uint64(need)+64 > lim.Cur {
		e.warn(fmt.Sprintf("this process may need %d connections but may open only %d files: split the fleet with --procs or --shard", need, lim.Cur))
	}
}

func (e *engine) getScratch() *scratch  { return e.scratch.Get().(*scratch) }
func (e *engine) putScratch(s *scratch) { e.scratch.Put(s) }

// --- operations ---

// registerDevice registers d. It returns false when d has no token after it.
func (e *engine) registerDevice(ctx context.Context, d *device, s *scratch) bool {
	st := e.reg
	started := time.Now()
	st.begin(started.UnixNano())
	s.body = append(s.body[:0], `{"machine_id":"`...)
	s.body = appendJSONText(s.body, d.machineID)
	s.body = append(s.body, `","device_type":"`...)
	s.body = appendJSONText(s.body, e.cfg.DeviceType)
	s.body = append(s.body, `","model":"`...)
	s.body = appendJSONText(s.body, e.cfg.Model)
	s.body = append(s.body, `","firmware":"`...)
	s.body = appendJSONText(s.body, e.cfg.Firmware)
	s.body = append(s.body, `","serial":"`...)
	s.body = appendSerial(s.body, d.idx)
	s.body = append(s.body, `","enrollment_secret":"`...)
	s.body = appendJSONText(s.body, e.cfg.EnrollmentSecret)
	if d.key != "" {
		s.body = append(s.body, `","device_key":"`...)
		s.body = appendJSONText(s.body, d.key)
	}
	s.body = append(s.body, `"}`...)
	s.req = append(s.req[:0], e.regPrefix...)
	s.req = strconv.AppendInt(s.req, int64(len(s.body)), 10)
	s.req = append(s.req, "\r\n\r\n"...)
	s.req = append(s.req, s.body...)

	for attempt := 0; ; attempt++ {
		e.inflight.Add(1)
		resent, err := e.tr.do(ctx, s.req, s.resp, &s.res)
		e.inflight.Add(-1)
		if resent {
			st.resent.Add(1)
		}
		now := time.Now()
		if err != nil {
			e.dropped(ctx, st, err, now)
			return false
		}
		s.resp = s.res.body[:0]
		switch status := s.res.status; {
		case status == 200:
			var rr protocol.RegisterResponse
			if err := json.Unmarshal(s.res.body, &rr); err != nil || !validToken(rr.Token) {
				st.drop(DropProtocol)
				st.end(now.UnixNano())
				e.warnOnce("bad-register-answer", "the server answered a registration with 200 but no usable token")
				return false
			}
			d.deviceID, d.token = rr.DeviceID, rr.Token
			if rr.DeviceKey != "" {
				d.key = rr.DeviceKey
			}
			if rr.New {
				st.newReg.Add(1)
			}
			st.lat.record(s.hint, now.Sub(started))
			st.accepted.Add(1)
			st.end(now.UnixNano())
			return true
		case (status == 503 || status == 429) && attempt < e.cfg.MaxRetries:
			wait, ok := e.retryWait(s.res.retryAfter, attempt+1, &s.jit)
			if !ok {
				e.rejected(st, status, s.hint, now.Sub(started), now)
				return false
			}
			st.retried.Add(1)
			if !sleepCtx(ctx, wait) {
				st.aborted.Add(1)
				st.end(time.Now().UnixNano())
				return false
			}
		case status == 202:
			// Waiting for an operator (docs/protocol.md#admission): keep the
			// key it was given; the device stays unregistered for now.
			var rr protocol.RegisterResponse
			if json.Unmarshal(s.res.body, &rr) == nil && rr.DeviceKey != "" {
				d.key = rr.DeviceKey
			}
			e.warnOnce("202", "registration answered 202: it waits for an operator's approval (admission policy, or a known machine ID without its device key)")
			e.rejected(st, status, s.hint, now.Sub(started), now)
			return false
		default:
			if status == 403 {
				e.warnOnce("403", "registration answered 403: the enrollment secret is wrong, or the device is blocked or not admitted")
			}
			e.rejected(st, status, s.hint, now.Sub(started), now)
			return false
		}
	}
}

func validToken(t string) bool {
	if t == "" || len(t) > 1024 {
		return false
	}
	for i := 0; i < len(t); i++ {
		if t[i] <= ' ' || t[i] >= 0x7f {
			return false
		}
	}
	return true
}

func (e *engine) rejected(st *opStats, status, hint int, lat time.Duration, now time.Time) {
	st.lat.record(hint, lat)
	st.reject(status)
	st.end(now.UnixNano())
}

// ended tells whether ctx is done or past its deadline (a deadline can
// fail I/O a moment before ctx itself reports it).
func ended(ctx context.Context) bool {
	if ctx.Err() != nil {
		return true
	}
	dl, ok := ctx.Deadline()
	return ok && !time.Now().Before(dl)
}

func (e *engine) dropped(ctx context.Context, st *opStats, err error, now time.Time) {
	if ended(ctx) {
		st.aborted.Add(1)
	} else {
		reason := classify(err)
		st.drop(reason)
		switch reason {
		case DropNoPort:
			e.warnOnce("no_port", "out of ephemeral ports for new connections: add source addresses (--source-addrs 127.0.0.1-127.0.0.8)")
		case DropFDLimit:
			e.warnOnce("fd_limit", "out of file descriptors: split the fleet over processes (--procs)")
		case DropTLS:
			e.warnOnce("tls", "TLS handshakes fail: "+err.Error())
		}
	}
	st.end(now.UnixNano())
}

// retryWait is how long to wait before retry number attempt: at least the
// server's Retry-After, at least an exponential backoff from 1 s, plus up
// to 50 % jitter. ok is false when the server asks for more than
// MaxRetryWait.
func (e *engine) retryWait(retryAfter time.Duration, attempt int, j *rng) (time.Duration, bool) {
	if retryAfter > e.cfg.MaxRetryWait {
		return 0, false
	}
	w := time.Second << min(attempt-1, 16)
	w = max(w, retryAfter)
	w += time.Duration(j.intn(int64(w/2) + 1))
	return min(w, e.cfg.MaxRetryWait), true
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

var configKey = []byte(`"config"`)

// pushDevice makes one push of d, intended at time intended: registering
// first if d has no token, retrying after 503/429, registering again after
// 401 as an agent does.
func (e *engine) pushDevice(ctx context.Context, d *device, s *scratch, intended time.Time, fleet bool) {
	st := e.push
	if d.token == "" {
		if !e.registerDevice(ctx, d, s) {
			st.unregistered.Add(1)
			return
		}
		intended = time.Now() // the push proper starts now
		fleet = false         // its lag is the registration's time, not the schedule's
	}
	r := d.advance(e.id)
	reregistered := false
	for attempt := 0; ; attempt++ {
		now := time.Now()
		if attempt == 0 {
			st.begin(now.UnixNano())
			if fleet {
				lag := now.Sub(intended)
				e.lag.record(s.hint, lag)
				if lag > e.cfg.LateAfter {
					st.late.Add(1)
				}
			}
		}
		rr := r
		s.body = e.tpl.Render(s.body[:0], d, &e.rc, now, &rr)
		s.req = append(s.req[:0], e.pushPrefix...)
		s.req = append(s.req, d.token...)
		s.req = append(s.req, "\r\nContent-Length: "...)
		s.req = strconv.AppendInt(s.req, int64(len(s.body)), 10)
		s.req = append(s.req, "\r\n\r\n"...)
		s.req = append(s.req, s.body...)

		e.inflight.Add(1)
		resent, err := e.tr.do(ctx, s.req, s.resp, &s.res)
		e.inflight.Add(-1)
		if resent {
			st.resent.Add(1)
		}
		done := time.Now()
		if err != nil {
			e.dropped(ctx, st, err, done)
			return
		}
		s.resp = s.res.body[:0]
		switch status := s.res.status; {
		case status == 200:
			if bytes.Contains(s.res.body, configKey) {
				var pr protocol.PushResponse
				if json.Unmarshal(s.res.body, &pr) == nil && pr.Config != nil && pr.Config.Version != d.cfgVer {
					d.cfgVer = pr.Config.Version // applied at once
					st.configs.Add(1)
				}
			}
			st.lat.record(s.hint, done.Sub(intended))
			st.accepted.Add(1)
			st.end(done.UnixNano())
			return
		case status == 401 && !reregistered:
			reregistered = true
			st.rereg.Add(1)
			d.token = ""
			if !e.registerDevice(ctx, d, s) {
				e.rejected(st, status, s.hint, time.Since(intended), time.Now())
				return
			}
		case (status == 503 || status == 429) && attempt < e.cfg.MaxRetries:
			wait, ok := e.retryWait(s.res.retryAfter, attempt+1, &s.jit)
			if !ok {
				e.rejected(st, status, s.hint, done.Sub(intended), done)
				return
			}
			st.retried.Add(1)
			if !sleepCtx(ctx, wait) {
				st.aborted.Add(1)
				st.end(time.Now().UnixNano())
				return
			}
		default:
			e.rejected(st, status, s.hint, done.Sub(intended), done)
			return
		}
	}
}

// --- load models ---

// registerPhase registers every device without a token, with workers
// concurrent registrations (a registration storm).
func (e *engine) registerPhase(ctx context.Context, workers int) {
	var todo []*device
	for _, d := range e.devs {
		if d.token == "" {
			todo = append(todo, d)
		}
	}
	if len(todo) == 0 {
		return
	}
	e.phase.Store("register")
	e.regTarget.Store(int64(len(todo)))
	workers = max(min(workers, len(todo)), 1)
	e.concurrency.Store(int64(workers))
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := e.getScratch()
			defer e.putScratch(s)
			for i := w; i < len(todo) && !ended(ctx); i += workers {
				e.registerDevice(ctx, todo[i], s)
			}
		}()
	}
	wg.Wait()
	e.concurrency.Store(0)
}

func (e *engine) runBenchmark(ctx context.Context) error {
	e.registerPhase(ctx, e.cfg.Workers)
	if e.cfg.Loops == 0 || ctx.Err() != nil {
		return ctx.Err()
	}
	e.phase.Store("push")
	workers := max(min(e.cfg.Workers, len(e.devs)), 1)
	e.pushTarget.Store(int64(len(e.devs) * e.cfg.Loops))
	e.concurrency.Store(int64(workers))
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := e.getScratch()
			defer e.putScratch(s)
			for range e.cfg.Loops {
				for i := w; i < len(e.devs); i += workers {
					if ended(ctx) {
						return
					}
					e.pushDevice(ctx, e.devs[i], s, time.Now(), false)
				}
			}
		}()
	}
	wg.Wait()
	e.concurrency.Store(0)
	return ctx.Err()
}

func (e *engine) runFleet(ctx context.Context) error {
	e.phase.Store("push")
	order := make([]*device, len(e.devs))
	copy(order, e.devs)
	phase := func(d *device) time.Duration { return e.id.phase(d.idx, e.cfg.Interval) }
	sort.Slice(order, func(i, j int) bool { return phase(order[i]) < phase(order[j]) })
	phases := make([]time.Duration, len(order))
	for i, d := range order {
		phases[i] = phase(d)
	}
	start := e.start
	sem := make(chan struct{}, e.cfg.MaxInflight)
	var wg sync.WaitGroup
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	limited := false
dispatch:
	for round := 0; ; round++ {
		base := start.Add(time.Duration(round) * e.cfg.Interval)
		if !base.Before(e.end) {
			break
		}
		for i, d := range order {
			due := base.Add(phases[i])
			if !due.Before(e.end) {
				break dispatch
			}
			if wait := time.Until(due); wait > 0 {
				timer.Reset(wait)
				select {
				case <-timer.C:
				case <-ctx.Done():
					break dispatch
				}
			}
			if ctx.Err() != nil {
				break dispatch
			}
			for {
				if d.state.CompareAndSwap(0, 1) {
					select {
					case sem <- struct{}{}:
					default:
						if !limited {
							limited = true
							e.warnOnce("inflight", fmt.Sprintf("%d operations in flight (--max-inflight): sends are delayed; the server answers too slowly for this fleet or the limit is too low", e.cfg.MaxInflight))
						}
						select {
						case sem <- struct{}{}:
						case <-ctx.Done():
							d.state.Store(0)
							break dispatch
						}
					}
					wg.Add(1)
					go e.fleetDevice(ctx, d, due, sem, &wg)
					break
				}
				if d.state.Load() == 2 {
					e.push.skipped.Add(1)
					break
				}
				d.pendingDue.Store(due.UnixNano())
				if d.state.CompareAndSwap(1, 2) {
					break
				}
			}
		}
	}
	wg.Wait()
	return ctx.Err()
}

func (e *engine) fleetDevice(ctx context.Context, d *device, due time.Time, sem chan struct{}, wg *sync.WaitGroup) {
	defer wg.Done()
	defer func() { <-sem }()
	s := e.getScratch()
	defer e.putScratch(s)
	for {
		e.pushDevice(ctx, d, s, due, true)
		if d.state.CompareAndSwap(1, 0) {
			return
		}
		// A due time passed while this push was busy: push again now,
		// measured from that due time.
		due = time.Unix(0, d.pendingDue.Load())
		d.state.Store(1)
		if ctx.Err() != nil {
			d.state.Store(0)
			return
		}
	}
}

// rampState is driven by the collector once per interval.
type rampState struct {
	e         *engine
	pool      chan *device
	ctx       context.Context
	wg        sync.WaitGroup
	mu        sync.Mutex
	workers   int
	step      int
	conc      int
	stepStart time.Time
	op        *results.Op
	steps     []*results.Step
	outcome   results.Ramp
	done      chan struct{}
	finished  bool
}

func (e *engine) runRamp(ctx context.Context) error {
	e.registerPhase(ctx, e.cfg.Workers)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	e.phase.Store("push")
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	r := &rampState{e: e, pool: make(chan *device, len(e.devs)), ctx: rctx, done: make(chan struct{}), op: &results.Op{}}
	for _, d := range e.devs {
		r.pool <- d
	}
	r.mu.Lock()
	r.stepStart = time.Now()
	r.conc = e.cfg.RampStart
	r.grow(r.conc)
	e.ramp.Store(r)
	r.mu.Unlock()
	select {
	case <-r.done:
	case <-ctx.Done():
	}
	cancel()
	r.wg.Wait()
	e.concurrency.Store(0)
	r.mu.Lock()
	if !r.finished {
		r.finished = true
		if r.outcome.Reason == "" {
			r.outcome.Reason = "stopped before a breaking point was found"
		}
	}
	r.mu.Unlock()
	return ctx.Err()
}

// grow starts workers up to n; called with r.mu held.
func (r *rampState) grow(n int) {
	for r.workers < n {
		r.workers++
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			s := r.e.getScratch()
			defer r.e.putScratch(s)
			for !ended(r.ctx) {
				var d *device
				select {
				case d = <-r.pool:
				case <-r.ctx.Done():
					return
				}
				r.e.pushDevice(r.ctx, d, s, time.Now(), false)
				r.pool <- d
			}
		}()
	}
	r.e.concurrency.Store(int64(r.workers))
}

// onInterval adds an interval's pushes to the current step and closes the
// step when its time is up.
func (r *rampState) onInterval(op *results.Op, now time.Time) *results.Step {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.finished {
		return nil
	}
	r.op.Merge(op)
	if now.Sub(r.stepStart) < r.e.cfg.RampStepDuration-50*time.Millisecond {
		return nil
	}
	st := &results.Step{
		Type: results.TypeStep, RunID: r.e.cfg.RunID, Shard: r.e.cfg.Shard.String(), Index: r.step,
		Concurrency: r.conc, Start: r.stepStart.UTC(), End: now.UTC(), Ops: map[string]*results.Op{results.OpPush: r.op},
	}
	st.Broke = results.StepBroke(st.Ops)
	r.steps = append(r.steps, st)
	r.outcome = *results.RampOutcome(r.steps, nil)
	switch {
	case st.Broke:
		r.finish("")
	case r.conc >= r.e.cfg.RampMax:
		r.finish(fmt.Sprintf("no breaking point up to %d workers (--ramp-max)", r.e.cfg.RampMax))
	default:
		r.step++
		r.conc = min(max(int(math.Ceil(float64(r.conc)*r.e.cfg.RampFactor)), r.conc+1), r.e.cfg.RampMax)
		r.grow(r.conc)
		r.stepStart = now
		r.op = &results.Op{}
	}
	return st
}

func (r *rampState) finish(reason string) {
	r.finished = true
	if reason != "" {
		r.outcome.Reason = reason
	}
	close(r.done)
}
