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
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/drover/drover/internal/buildinfo"
	"github.com/drover/drover/internal/emulator/results"
	"github.com/drover/drover/internal/protocol"
)

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
	conn, cmd *opStats   // connect mode
	conns     *connState // connect mode
	lag       *recorder  // fleet: send time − intended time
	acks      *acksLog   // nil: no Config.AcksFile

	regPrefix, pushPrefix []byte

	phase       atomic.Value // string
	inflight    atomic.Int64
	concurrency atomic.Int64
	regTarget   atomic.Int64 // devices to register in this phase
	pushTarget  atomic.Int64 // pushes planned (benchmark)
	end         time.Time    // fleet end
	schedule    []scheduled  // fleet: the devices by phase (fleetSchedule)

	scratch sync.Pool
	hint    atomic.Int64

	warnMu   sync.Mutex
	warnings []string
	warned   map[string]bool

	ramp atomic.Pointer[rampState]
	dl   *downloader // fleet mode: firmware downloads
	wipe *wiper      // fleet mode with Config.Wipe
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
	groups, err := protocol.KeyExchangeGroups(cfg.TLSKeyExchange) // as the agent
	if err != nil {
		return nil, err
	}
	tlsConf.CurvePreferences = groups
	if tlsConf.MaxVersion, err = protocol.TLSMaxVersion(cfg.TLSMaxVersion); err != nil {
		return nil, err
	}
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
	if cfg.MachineIDs == MachineIDsSequential {
		e.id.seqPrefix = sequentialPrefix(cfg.Seed)
	}
	if cfg.Mode == ModeConnect {
		e.conn, e.cmd = newOpStats(), newOpStats()
	}
	if cfg.Mode == ModeFleet {
		e.lag = newRecorder()
		e.dl = newDownloader(e, tlsConf)
		if cfg.Wipe > 0 {
			e.wipe = newWiper(cfg, tlsConf)
		}
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
		e.devs[i].wipe = e.wipe != nil && e.wipeChosen(x)
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
	if cfg.Mode == ModeConnect {
		e.conns = newConnState(e, tlsConf)
	}
	return e, nil
}

func (e *engine) run(ctx context.Context) (*results.Summary, error) {
	cfg := &e.cfg
	if cfg.Mode == ModeFleet {
		// Before the clock starts: for a million devices this takes a
		// noticeable time, which would otherwise delay the first pushes.
		e.schedule = e.fleetSchedule()
	}
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
	case ModeConnect:
		st.Workers, st.Duration = cfg.Workers, cfg.Duration.Seconds()
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
		if e.wipe != nil {
			e.wipe.at = e.start.Add(cfg.WipeAt)
		}
	}
	if cfg.AcksFile != "" {
		var err error
		if e.acks, err = openAcks(credentialsPath(cfg.AcksFile, cfg.Shard)); err != nil {
			return nil, fmt.Errorf("acks: %w", err)
		}
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
		e.dl.stop()
		e.wipeReport()
	case ModeBenchmark:
		runErr = e.runBenchmark(runCtx)
	case ModeRamp:
		runErr = e.runRamp(runCtx)
	case ModeConnect:
		runErr = e.runConnect(runCtx)
	}
	cancel()
	stopAbort()
	e.tr.shutdown(false)
	e.phase.Store("done")
	close(stopCol)
	<-colDone
	if e.acks != nil {
		if err := e.acks.close(); err != nil {
			e.warn("acknowledged pushes could not be written: " + err.Error())
		}
	}

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
