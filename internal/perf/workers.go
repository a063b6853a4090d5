package perf

// Load machines (docs/perf.md#several-load-machines): one test's devices
// split over several machines. Each load machine runs a worker (`drover
// perf worker`), an HTTP server that runs one shard of the emulated fleet
// at a time; the coordinator (`drover perf run --workers …`) gives every
// worker its shard of the same fleet with the same start time, reads their
// result streams as they come and merges them exactly (emulator.RunShards:
// counters add up, latency histograms merge).
//
// The protocol, JSON over HTTP with the bearer token every request must
// carry:
//
//	GET  /v1/info          the load machine: workerInfo
//	POST /v1/run           a workerJob; the answer streams JSON lines: a
//	                       "worker" record (workerInfo), the emulator's
//	                       result records (package results) as they are
//	                       written, and a "worker_end" record (the run's
//	                       error, if any)
//	POST /v1/stop?run=ID   ends run ID early; its summary still comes

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/drover/drover/internal/emulator"
	"github.com/drover/drover/internal/emulator/results"
	"github.com/drover/drover/internal/hostinfo"
)

// Worker record types, around the emulator's own.
const (
	typeWorker    = "worker"
	typeWorkerEnd = "worker_end"
)

// WorkerConfig configures a load machine's worker.
type WorkerConfig struct {
	// Token is the shared secret every request must carry as a bearer
	// token; required (at least 16 characters).
	Token string
	// WorkDir keeps the fleet's credentials between a test's phases
	// (registration, then pushes); default: the system's temp dir.
	WorkDir string
	// SourceAddrs are local addresses to dial from (nil: the system's
	// choice).
	SourceAddrs []net.IP
	Version     string
	Logf        func(format string, args ...any) // nil: none
}

// MinTokenLength is the shortest worker token accepted.
const MinTokenLength = 16

// Worker runs the shards a coordinator sends. It is an http.Handler.
type Worker struct {
	cfg  WorkerConfig
	dir  string
	mu   sync.Mutex
	runs map[string]context.CancelFunc // stop, by run ID
	busy bool
}

// NewWorker checks cfg and makes the worker's directory; Close removes it.
func NewWorker(cfg WorkerConfig) (*Worker, error) {
	if len(cfg.Token) < MinTokenLength {
		return nil, fmt.Errorf("a worker needs a token of at least %d characters: the coordinator must prove itself", MinTokenLength)
	}
	dir, err := os.MkdirTemp(cfg.WorkDir, "drover-perf-worker-")
	if err != nil {
		return nil, err
	}
	if cfg.Logf == nil {
		cfg.Logf = func(string, ...any) {}
	}
	return &Worker{cfg: cfg, dir: dir, runs: map[string]context.CancelFunc{}}, nil
}

// Close removes the worker's directory (the credentials of its fleets).
func (w *Worker) Close() error { return os.RemoveAll(w.dir) }

// machineInfo describes a load machine.
type machineInfo struct {
	Host       string  `json:"host"`
	CPUModel   string  `json:"cpu_model"`
	Cores      int     `json:"cores"`
	Threads    int     `json:"threads"`
	RAMMiB     float64 `json:"ram_mib"`
	GOMAXPROCS int     `json:"gomaxprocs"`
	Version    string  `json:"version,omitempty"`
}

// workerInfo is a worker's answer to /v1/info and its first record.
type workerInfo struct {
	Type string `json:"type,omitempty"`
	machineInfo
	Time time.Time `json:"time"` // the worker's clock when it answered
}

func (w *Worker) info() workerInfo {
	h := hostinfo.ReadHost()
	return workerInfo{machineInfo: machineInfo{Host: h.Name, CPUModel: h.CPUModel, Cores: h.Cores, Threads: h.Threads, RAMMiB: mib(h.RAMBytes),
		GOMAXPROCS: runtime.GOMAXPROCS(0), Version: w.cfg.Version}, Time: time.Now().UTC()}
}

// workerJob is one shard of a fleet for a worker.
type workerJob struct {
	RunID            string        `json:"run_id"`
	Shard            string        `json:"shard"` // k/n
	Target           string        `json:"target"`
	EnrollmentSecret string        `json:"enrollment_secret"`
	CACertPEM        []byte        `json:"ca_cert_pem,omitempty"`
	Insecure         bool          `json:"insecure,omitempty"`
	Devices          int           `json:"devices"`
	Seed             string        `json:"seed"`
	Mode             string        `json:"mode"`
	Conn             string        `json:"conn"`
	TLSMaxVersion    string        `json:"tls_max_version,omitempty"`
	TLSKeyExchange   string        `json:"tls_key_exchange,omitempty"`
	Interval         time.Duration `json:"interval"`
	Duration         time.Duration `json:"duration"`
	Workers          int           `json:"workers"`
	Loops            int           `json:"loops"`
	MaxInflight      int           `json:"max_inflight"`
	// Credentials names the fleet's credentials kept by the worker
	// between a test's phases ("": none).
	Credentials string `json:"credentials,omitempty"`
	// StopAfter ends a closed loop after this long (0: its own end).
	StopAfter time.Duration `json:"stop_after,omitempty"`
	// StartAt is when every shard starts (the coordinator's clock).
	StartAt time.Time `json:"start_at"`
}

type workerEnd struct {
	Type    string    `json:"type"`
	Started time.Time `json:"started"` // when the shard started (the worker's clock)
	Err     string    `json:"error,omitempty"`
}

var credName = regexp.MustCompile(`^[A-Za-z0-9._-]{1,100}$`)

func (w *Worker) ServeHTTP(rw http.ResponseWriter, req *http.Request) {
	auth := req.Header.Get("Authorization")
	want := "Bearer " + w.cfg.Token
	if subtle.ConstantTimeCompare([]byte(auth), []byte(want)) != 1 {
		workerError(rw, http.StatusUnauthorized, "a bearer token is required: the worker's --token")
		return
	}
	switch {
	case req.URL.Path == "/v1/info" && req.Method == http.MethodGet:
		rw.Header().Set("Content-Type", "application/json")
		json.NewEncoder(rw).Encode(w.info())
	case req.URL.Path == "/v1/run" && req.Method == http.MethodPost:
		w.run(rw, req)
	case req.URL.Path == "/v1/stop" && req.Method == http.MethodPost:
		w.mu.Lock()
		stop := w.runs[req.URL.Query().Get("run")]
		w.mu.Unlock()
		if stop == nil {
			workerError(rw, http.StatusNotFound, "no such run")
			return
		}
		stop()
		rw.WriteHeader(http.StatusNoContent)
	default:
		workerError(rw, http.StatusNotFound, "no such endpoint: GET /v1/info, POST /v1/run, POST /v1/stop?run=ID")
	}
}

func workerError(rw http.ResponseWriter, status int, msg string) {
	rw.Header().Set("Content-Type", "application/json")
	rw.WriteHeader(status)
	json.NewEncoder(rw).Encode(map[string]string{"error": msg})
}

func (w *Worker) config(job workerJob) (emulator.Config, error) {
	cfg := emulator.DefaultConfig()
	sh, err := emulator.ParseShard(job.Shard)
	if err != nil {
		return cfg, err
	}
	cfg.Target, cfg.EnrollmentSecret, cfg.CACertPEM, cfg.Insecure = job.Target, job.EnrollmentSecret, job.CACertPEM, job.Insecure
	cfg.Devices, cfg.Shard, cfg.Seed, cfg.RunID = job.Devices, sh, job.Seed, job.RunID
	cfg.Mode, cfg.Conn = emulator.Mode(job.Mode), emulator.ConnMode(job.Conn)
	cfg.TLSMaxVersion = job.TLSMaxVersion
	if job.TLSKeyExchange != "" {
		cfg.TLSKeyExchange = job.TLSKeyExchange
	}
	if job.Interval > 0 {
		cfg.Interval = job.Interval
	}
	cfg.Duration, cfg.Loops = job.Duration, job.Loops
	if job.Workers > 0 {
		cfg.Workers = job.Workers
	}
	if job.MaxInflight > 0 {
		cfg.MaxInflight = job.MaxInflight
	}
	cfg.SourceAddrs = w.cfg.SourceAddrs
	if job.Credentials != "" {
		if !credName.MatchString(job.Credentials) {
			return cfg, fmt.Errorf("credentials name %q: want letters, digits, '.', '_' or '-'", job.Credentials)
		}
		cfg.CredentialsFile = filepath.Join(w.dir, job.Credentials)
	}
	if job.RunID == "" {
		return cfg, errors.New("no run ID")
	}
	return cfg, cfg.Validate()
}

func (w *Worker) run(rw http.ResponseWriter, req *http.Request) {
	var job workerJob
	if err := json.NewDecoder(io.LimitReader(req.Body, 1<<20)).Decode(&job); err != nil {
		workerError(rw, http.StatusBadRequest, "bad job: "+err.Error())
		return
	}
	cfg, err := w.config(job)
	if err != nil {
		workerError(rw, http.StatusBadRequest, "bad job: "+err.Error())
		return
	}
	w.mu.Lock()
	if w.busy {
		w.mu.Unlock()
		workerError(rw, http.StatusConflict, "this worker is running another shard: one at a time")
		return
	}
	w.busy = true
	// Stopping is a graceful end (the summary is still written); the
	// request's own context ends it too (the coordinator is gone).
	runCtx, stop := context.WithCancel(req.Context())
	w.runs[job.RunID] = stop
	w.mu.Unlock()
	defer func() {
		stop()
		w.mu.Lock()
		w.busy = false
		delete(w.runs, job.RunID)
		w.mu.Unlock()
	}()
	fl, _ := rw.(http.Flusher)
	out := &flushWriter{w: rw, f: fl}
	rw.Header().Set("Content-Type", "application/x-ndjson")
	rw.WriteHeader(http.StatusOK)
	in := w.info()
	in.Type = typeWorker
	writeLine(out, in)
	w.cfg.Logf("run %s shard %s: %d devices of %s, %s, starting at %s", job.RunID, job.Shard, job.Devices, job.Target, job.Mode, job.StartAt.Format(time.RFC3339Nano))
	if !sleepUntil(runCtx, job.StartAt) {
		writeLine(out, workerEnd{Type: typeWorkerEnd, Err: "stopped before the start"})
		return
	}
	end := workerEnd{Type: typeWorkerEnd, Started: time.Now().UTC()}
	sum, err := emulateFor(runCtx, cfg, out, job.StopAfter)
	if err != nil && (sum == nil || sum.Err == "") {
		end.Err = err.Error()
	}
	writeLine(out, end)
	w.cfg.Logf("run %s shard %s: ended (%v)", job.RunID, job.Shard, err)
}

// emulateFor runs the emulator; a stopAfter > 0 ends it after that long
// by cancellation (a closed loop's duration: once a deadline has passed,
// dials fail at once while the context may not yet report it, and the
// emulator would count them as dropped; cancelled requests count as
// aborted), and that end is no error.
func emulateFor(ctx context.Context, cfg emulator.Config, sink io.Writer, stopAfter time.Duration) (*results.Summary, error) {
	if stopAfter <= 0 {
		return emulator.Run(ctx, cfg, sink)
	}
	dctx, cancel := context.WithCancel(ctx)
	defer cancel()
	t := time.AfterFunc(stopAfter, cancel)
	defer t.Stop()
	sum, err := emulator.Run(dctx, cfg, sink)
	if dctx.Err() != nil && ctx.Err() == nil {
		err = nil // the test's own duration
		if sum != nil {
			sum.Err = ""
		}
	}
	return sum, err
}

func sleepUntil(ctx context.Context, t time.Time) bool {
	if d := time.Until(t); d > 0 {
		return sleepCtx(ctx, d)
	}
	return ctx.Err() == nil
}

func writeLine(w io.Writer, v any) {
	b, _ := json.Marshal(v)
	w.Write(append(b, '\n'))
}

// flushWriter flushes every write: each result record goes out at once.
type flushWriter struct {
	mu sync.Mutex
	w  io.Writer
	f  http.Flusher
}

func (f *flushWriter) Write(p []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	n, err := f.w.Write(p)
	if f.f != nil {
		f.f.Flush()
	}
	return n, err
}

// ---- the coordinator ----

// loadMachine is one load machine of a test, in the protocol.
type loadMachine struct {
	Addr string `json:"addr"`
	machineInfo
	// ClockOffsetMs is the worker's clock minus the coordinator's when it
	// was asked (half the round trip's precision).
	ClockOffsetMs float64 `json:"clock_offset_ms"`
	// The last run's shard and the emulator's costs on this machine.
	Shard   string  `json:"shard,omitempty"`
	Devices int     `json:"devices,omitempty"`
	CPUAvg  float64 `json:"cpu_avg"`
	CPUMax  float64 `json:"cpu_max"`
	RSSMiB  float64 `json:"rss_mib"`
	Started string  `json:"started,omitempty"` // when its shard started (its clock)
}

// loadPool is the coordinator's view of its workers.
type loadPool struct {
	token    string
	timeout  time.Duration // no record for this long: the worker is lost
	client   *http.Client
	machines []loadMachine
}

// defaultWorkerTimeout is how long a worker may send nothing.
const defaultWorkerTimeout = 30 * time.Second

// newLoadPool asks every worker for its machine; a worker that does not
// answer or refuses the token is an error.
func newLoadPool(ctx context.Context, addrs []string, token string, timeout time.Duration) (*loadPool, error) {
	if token == "" {
		return nil, errors.New("load machines need the workers' token")
	}
	if timeout <= 0 {
		timeout = defaultWorkerTimeout
	}
	p := &loadPool{token: token, timeout: timeout, client: &http.Client{Transport: &http.Transport{
		DialContext:           (&net.Dialer{Timeout: 10 * time.Second}).DialContext,
		ResponseHeaderTimeout: timeout,
	}}}
	seen := map[string]bool{}
	for _, a := range addrs {
		a = strings.TrimSpace(a)
		if a == "" || seen[a] {
			return nil, fmt.Errorf("load machine %q: empty or given twice", a)
		}
		seen[a] = true
		sent := time.Now()
		var in workerInfo
		if err := p.get(ctx, a, "/v1/info", &in); err != nil {
			return nil, fmt.Errorf("load machine %s: %w", a, err)
		}
		rtt := time.Since(sent)
		off := in.Time.Sub(sent.Add(rtt / 2))
		p.machines = append(p.machines, loadMachine{Addr: a, machineInfo: in.machineInfo, ClockOffsetMs: ms(off)})
	}
	return p, nil
}

func workerURL(addr, path string) string {
	if strings.HasPrefix(addr, "http://") || strings.HasPrefix(addr, "https://") {
		return strings.TrimSuffix(addr, "/") + path
	}
	return "http://" + addr + path
}

func (p *loadPool) request(ctx context.Context, method, addr, path string, body []byte) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, workerURL(addr, path), bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+p.token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode/100 != 2 {
		defer resp.Body.Close()
		var e struct {
			Error string `json:"error"`
		}
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		if json.Unmarshal(b, &e) != nil || e.Error == "" {
			e.Error = strings.TrimSpace(string(b))
		}
		return nil, fmt.Errorf("HTTP %d: %s", resp.StatusCode, e.Error)
	}
	return resp, nil
}

func (p *loadPool) get(ctx context.Context, addr, path string, v any) error {
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	resp, err := p.request(ctx, http.MethodGet, addr, path, nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return json.NewDecoder(resp.Body).Decode(v)
}

// credentialsName is a worker's name for a coordinator's credentials path:
// the same path names the same fleet in every phase of a test.
func credentialsName(path string) string {
	if path == "" {
		return ""
	}
	h := sha256.Sum256([]byte(path))
	return "cred-" + hex.EncodeToString(h[:8]) + ".jsonl"
}

// run runs cfg split over the workers, all starting at the same time, and
// returns the exact merge of their summaries. stopAfter > 0 ends a closed
// loop after that long (no error). Every worker's figures go to
// p.machines.
func (p *loadPool) run(ctx context.Context, cfg emulator.Config, sink io.Writer, stopAfter time.Duration) (*results.Summary, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	job := workerJob{RunID: cfg.RunID, Target: cfg.Target, EnrollmentSecret: cfg.EnrollmentSecret, CACertPEM: cfg.CACertPEM,
		Insecure: cfg.Insecure, Devices: cfg.Devices, Seed: cfg.Seed, Mode: string(cfg.Mode), Conn: string(cfg.Conn),
		TLSMaxVersion: cfg.TLSMaxVersion, TLSKeyExchange: cfg.TLSKeyExchange,
		Interval: cfg.Interval, Duration: cfg.Duration, Workers: cfg.Workers, Loops: cfg.Loops, MaxInflight: cfg.MaxInflight,
		Credentials: credentialsName(cfg.CredentialsFile), StopAfter: stopAfter}
	// Closed-loop workers and in-flight limits are the whole test's: each
	// shard takes its share.
	n := len(p.machines)
	share := func(v int, i int) int { return max(1, (v+n-i)/n) }
	// Every worker gets its job before the start: a second per worker of
	// lead time (at least 2 s).
	job.StartAt = time.Now().Add(max(2*time.Second, time.Duration(n)*time.Second))
	var (
		mu      sync.Mutex
		cancels []context.CancelFunc
		stopped bool
	)
	ends := make([]workerEnd, n)
	m, err := emulator.RunShards(ctx, cfg, emulator.Shards{
		N:    n,
		Sink: sink,
		Start: func(i int, sh emulator.Shard) (io.ReadCloser, error) {
			lm := &p.machines[i-1]
			j := job
			j.Shard, j.Workers, j.MaxInflight = sh.String(), share(cfg.Workers, i), share(cfg.MaxInflight, i)
			lm.Shard, lm.Devices = j.Shard, (cfg.Devices+sh.N-sh.K)/sh.N
			body, _ := json.Marshal(j)
			rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
			mu.Lock()
			cancels = append(cancels, cancel)
			mu.Unlock()
			resp, err := p.request(rctx, http.MethodPost, lm.Addr, "/v1/run", body)
			if err != nil {
				cancel()
				return nil, fmt.Errorf("load machine %s: %w", lm.Addr, err)
			}
			return p.stream(lm.Addr, resp, cancel, &ends[i-1]), nil
		},
		Stop: func() {
			mu.Lock()
			already := stopped
			stopped = true
			mu.Unlock()
			if already {
				return
			}
			for _, lm := range p.machines {
				go func(addr string) {
					sctx, cancel := context.WithTimeout(context.Background(), p.timeout)
					defer cancel()
					if resp, err := p.request(sctx, http.MethodPost, addr, "/v1/stop?run="+job.RunID, nil); err == nil {
						resp.Body.Close()
					}
				}(lm.Addr)
			}
		},
		Abort: func() {
			mu.Lock()
			defer mu.Unlock()
			for _, c := range cancels {
				c()
			}
		},
	})
	for i := range p.machines {
		if !ends[i].Started.IsZero() {
			p.machines[i].Started = ends[i].Started.Format(time.RFC3339Nano)
		}
	}
	if m == nil {
		return nil, err
	}
	for _, s := range m.Shards {
		for i := range p.machines {
			if p.machines[i].Shard == s.Shard {
				r := s.Resources
				p.machines[i].CPUAvg, p.machines[i].CPUMax, p.machines[i].RSSMiB = r.CPUAvg, r.CPUMax, mib(r.RSSMax)
			}
		}
	}
	if m.Summary == nil {
		if err == nil {
			err = errors.New("no load machine sent a summary")
		}
		return nil, err
	}
	if err != nil && m.Summary.Err == "" {
		m.Summary.Err = err.Error()
	}
	return m.Summary, err
}

// stream passes a worker's result records on, keeps its end record and
// ends the request when the worker sends nothing for p.timeout (a machine
// gone, a cable cut): a clear error, not a hang.
func (p *loadPool) stream(addr string, resp *http.Response, cancel context.CancelFunc, end *workerEnd) io.ReadCloser {
	pr, pw := io.Pipe()
	var idle bool
	var idleMu sync.Mutex
	timer := time.AfterFunc(p.timeout, func() {
		idleMu.Lock()
		idle = true
		idleMu.Unlock()
		cancel()
	})
	go func() {
		defer cancel()
		defer timer.Stop()
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 64<<20)
		var gotEnd bool
		for sc.Scan() {
			timer.Reset(p.timeout)
			line := sc.Bytes()
			var head struct {
				Type string `json:"type"`
			}
			if json.Unmarshal(line, &head) != nil {
				pw.CloseWithError(fmt.Errorf("load machine %s sent a bad record", addr))
				return
			}
			switch head.Type {
			case typeWorker:
				continue
			case typeWorkerEnd:
				json.Unmarshal(line, end)
				gotEnd = true
				continue
			}
			if _, err := pw.Write(append(append([]byte(nil), line...), '\n')); err != nil {
				return
			}
		}
		idleMu.Lock()
		wasIdle := idle
		idleMu.Unlock()
		switch {
		case wasIdle:
			pw.CloseWithError(fmt.Errorf("load machine %s sent nothing for %s: given up", addr, p.timeout))
		case !gotEnd:
			err := sc.Err()
			if err == nil {
				err = io.ErrUnexpectedEOF
			}
			pw.CloseWithError(fmt.Errorf("load machine %s: its stream ended early: %w", addr, err))
		case end.Err != "":
			pw.CloseWithError(fmt.Errorf("load machine %s: %s", addr, end.Err))
		default:
			pw.Close()
		}
	}()
	return &workerStream{pr: pr}
}

// workerStream is a worker's records; Close returns the worker's failure.
type workerStream struct {
	pr  *io.PipeReader
	err error
}

func (w *workerStream) Read(b []byte) (int, error) {
	n, err := w.pr.Read(b)
	if err != nil && err != io.EOF {
		w.err = err
		return n, io.EOF // the failure is Close's
	}
	return n, err
}

func (w *workerStream) Close() error {
	w.pr.CloseWithError(errors.New("closed")) // unblocks the copier if reading stopped early
	return w.err
}

// describe names the load machines in the environment.
func (p *loadPool) describe() string {
	var names []string
	for _, m := range p.machines {
		names = append(names, fmt.Sprintf("%s (%s)", m.Host, m.Addr))
	}
	return fmt.Sprintf("%d load machines (drover perf worker): %s; coordinated by drover perf on this machine; the shards merged exactly",
		len(p.machines), strings.Join(names, ", "))
}
