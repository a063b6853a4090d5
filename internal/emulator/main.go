package emulator

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/term"

	"github.com/drover/drover/internal/emulator/results"
	"github.com/drover/drover/internal/report"
)

// Main is `drover emulate`.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var cfg Config
	fs := flag.NewFlagSet("drover emulate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		mode, conn, shard, sources, tplFile, serverDir, caFile, out, progress string
		procs                                                                 int
		logEvery                                                              time.Duration
		printTemplate                                                         bool
		cpuProfile                                                            string
	)
	fs.StringVar(&cfg.Target, "target", "", "server base URL, e.g. https://127.0.0.1:8443 (required)")
	fs.StringVar(&serverDir, "server-dir", "", "a local server's --data-dir: takes the enrollment secret from secrets.json and trusts tls/cert.pem")
	fs.StringVar(&cfg.EnrollmentSecret, "secret", os.Getenv("DROVER_ENROLLMENT_SECRET"), "enrollment secret (default: $DROVER_ENROLLMENT_SECRET)")
	fs.StringVar(&caFile, "ca-cert", "", "PEM file of the certificate(s) to trust (default: system roots)")
	fs.BoolVar(&cfg.Insecure, "insecure", false, "do not verify the server's certificate")
	fs.IntVar(&cfg.Devices, "devices", 1000, "devices in the whole fleet (all shards)")
	fs.StringVar(&shard, "shard", "1/1", "this process's share k/n of the fleet: devices whose index % n == k-1")
	fs.StringVar(&cfg.Seed, "seed", "drover", "identity seed: machine IDs derive from it and the device index")
	fs.StringVar(&mode, "mode", "fleet", "load model: fleet (open loop, one push per interval per device), benchmark (closed loop, workers × loops), ramp (closed loop, rising workers until drops or retries)")
	fs.StringVar(&conn, "conn", "", "connections: new (TCP+TLS per request), resume (TCP per request, TLS resumed), keepalive (default: new in fleet mode, keepalive otherwise)")
	fs.DurationVar(&cfg.Interval, "interval", 200*time.Second, "fleet: each device's push interval")
	fs.DurationVar(&cfg.Duration, "duration", 0, "fleet: run time (default 10m); benchmark, ramp: time limit (default none)")
	fs.IntVar(&cfg.Workers, "workers", 8, "benchmark: concurrent workers (T); also the concurrency of the registration storm before benchmark and ramp")
	fs.IntVar(&cfg.Loops, "loops", 10, "benchmark: immediate loops over all devices (L); 0: register only")
	fs.IntVar(&cfg.RampStart, "ramp-start", 8, "ramp: workers of the first step")
	fs.Float64Var(&cfg.RampFactor, "ramp-factor", 2, "ramp: workers multiply by this each step")
	fs.DurationVar(&cfg.RampStepDuration, "ramp-step", 10*time.Second, "ramp: length of a step")
	fs.IntVar(&cfg.RampMax, "ramp-max", 0, "ramp: most workers (default: min(devices of the shard, 16384))")
	fs.IntVar(&cfg.MaxInflight, "max-inflight", 10000, "fleet: operations in flight at most; beyond, sends wait and count as late")
	fs.DurationVar(&cfg.Timeout, "timeout", 30*time.Second, "per request, connect and TLS handshake included")
	fs.IntVar(&cfg.MaxRetries, "max-retries", 5, "retries after 503 or 429 (honouring Retry-After, with backoff and jitter); -1: none")
	fs.DurationVar(&cfg.MaxRetryWait, "max-retry-wait", time.Minute, "longest wait before a retry; a longer Retry-After ends the operation")
	fs.DurationVar(&cfg.LateAfter, "late-after", 100*time.Millisecond, "fleet: a send this far behind its schedule counts as late")
	fs.StringVar(&sources, "source-addrs", "", "local addresses to connect from, round robin: 127.0.0.1,127.0.0.2 or 127.0.0.1-127.0.0.8")
	fs.StringVar(&tplFile, "template", "", "push body template file (default: a cellular router's state; see --print-template)")
	fs.BoolVar(&printTemplate, "print-template", false, "print the default template and the placeholders, and exit")
	fs.StringVar(&cfg.CredentialsFile, "credentials", "", "file to load device IDs and tokens from and save them to, so later runs skip registration")
	fs.StringVar(&cfg.DeviceType, "device-type", "router", "device type to register with")
	fs.StringVar(&cfg.Model, "model", "EMU-R1", "model to register with")
	fs.StringVar(&cfg.Firmware, "firmware", "7.4.2", "firmware to register with and report")
	fs.StringVar(&out, "out", "drover-emulate.jsonl", "result stream file (JSON lines; '-': stdout; '': none); render it with drover report")
	fs.IntVar(&procs, "procs", 1, "split this shard over this many processes (each has its own open-file limit and source ports)")
	fs.StringVar(&progress, "progress", "auto", "live progress: auto (a status line on a terminal, else log lines), line, log, none")
	fs.DurationVar(&logEvery, "log-every", 10*time.Second, "period of progress log lines")
	fs.StringVar(&cfg.RunID, "run-id", "", "run identifier in the results (default: time and random)")
	fs.StringVar(&cpuProfile, "cpuprofile", "", "write the emulator's CPU profile to this file (go tool pprof)")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: drover emulate --target URL [flags]\n\n"+
			"Emulates a fleet of devices against a Drover server and measures it.\n"+
			"Results stream to --out; a summary is printed at the end.\n\nflags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q (flags start with --)", fs.Arg(0))
	}
	if printTemplate {
		fmt.Fprintf(stdout, "%s\n\nplaceholders:\n%s", DefaultTemplate, PlaceholderHelp())
		return nil
	}
	cfg.LoopsSet = true
	cfg.Mode, cfg.Conn = Mode(mode), ConnMode(conn)
	var err error
	if cfg.Shard, err = ParseShard(shard); err != nil {
		return err
	}
	if cfg.SourceAddrs, err = ParseSourceAddrs(sources); err != nil {
		return err
	}
	if serverDir != "" {
		if err := readServerDir(serverDir, &cfg, &caFile); err != nil {
			return err
		}
	}
	if caFile != "" {
		if cfg.CACertPEM, err = os.ReadFile(caFile); err != nil {
			return fmt.Errorf("--ca-cert: %w", err)
		}
	}
	if tplFile != "" {
		src, err := os.ReadFile(tplFile)
		if err != nil {
			return fmt.Errorf("--template: %w", err)
		}
		if cfg.Template, err = ParseTemplate(filepath.Base(tplFile), string(src)); err != nil {
			return err
		}
	}
	if cfg.Target == "" {
		return errors.New("--target is required (e.g. --target https://127.0.0.1:8443)")
	}
	if procs < 1 {
		return errors.New("--procs must be at least 1")
	}
	if cfg.EnrollmentSecret == "" && cfg.CredentialsFile == "" {
		fmt.Fprintln(stderr, "drover emulate: no --secret: registrations will be refused")
	}
	if err := cfg.fill(); err != nil {
		return err
	}

	var sink io.Writer = io.Discard
	summaryOut := stdout
	switch out {
	case "":
	case "-":
		sink, summaryOut = stdout, stderr
	default:
		f, err := os.Create(out)
		if err != nil {
			return err
		}
		defer f.Close()
		sink = f
	}
	pr := newProgressPrinter(stderr, progress, logEvery)
	if pr == nil {
		return fmt.Errorf("--progress %q: want auto, line, log or none", progress)
	}
	cfg.Warn = pr.warn
	cfg.Logf = pr.logf
	cfg.Progress = pr.show

	if cpuProfile != "" {
		f, err := os.Create(cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	var m *results.Merged
	var runErr error
	if procs > 1 {
		m, runErr = runProcs(ctx, fs, cfg, procs, sink, pr)
	} else {
		var st results.Stream
		rec := &recordingWriter{w: sink, s: &st}
		_, runErr = Run(ctx, cfg, rec)
		if rec.err == nil && len(st.Summaries) > 0 {
			m, rec.err = st.Merge()
		}
		if rec.err != nil && runErr == nil {
			runErr = rec.err
		}
	}
	pr.done()
	if m != nil {
		if err := report.Text(summaryOut, m); err != nil && runErr == nil {
			runErr = err
		}
		if out != "" && out != "-" {
			fmt.Fprintf(summaryOut, "\nresults: %s (drover report --format html %s > report.html)\n", out, out)
		}
	}
	return runErr
}

// recordingWriter passes records on and keeps them parsed for the summary.
type recordingWriter struct {
	w   io.Writer
	s   *results.Stream
	err error
}

func (r *recordingWriter) Write(p []byte) (int, error) {
	if r.err == nil {
		r.err = r.s.Read(strings.NewReader(string(p)))
	}
	return r.w.Write(p)
}

func readServerDir(dir string, cfg *Config, caFile *string) error {
	b, err := os.ReadFile(filepath.Join(dir, "secrets.json"))
	if err != nil {
		return fmt.Errorf("--server-dir: %w", err)
	}
	var sec struct {
		EnrollmentSecret string `json:"enrollment_secret"`
	}
	if err := json.Unmarshal(b, &sec); err != nil {
		return fmt.Errorf("--server-dir: secrets.json: %w", err)
	}
	if cfg.EnrollmentSecret == "" {
		cfg.EnrollmentSecret = sec.EnrollmentSecret
	}
	if *caFile == "" {
		if _, err := os.Stat(filepath.Join(dir, "tls", "cert.pem")); err == nil {
			*caFile = filepath.Join(dir, "tls", "cert.pem")
		}
	}
	return nil
}

// ParseSourceAddrs parses "a,b,c" where each item is an IPv4 address or a
// range a-b (the end may be its last byte only: 127.0.0.1-8).
func ParseSourceAddrs(s string) ([]net.IP, error) {
	if s == "" {
		return nil, nil
	}
	var out []net.IP
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		lo, hi, isRange := strings.Cut(item, "-")
		a := net.ParseIP(lo)
		if a == nil {
			return nil, fmt.Errorf("--source-addrs: %q is not an IP address", lo)
		}
		if !isRange {
			out = append(out, a)
			continue
		}
		a4 := a.To4()
		if a4 == nil {
			return nil, fmt.Errorf("--source-addrs: ranges are for IPv4 only (%q)", item)
		}
		var b4 net.IP
		if n, err := strconv.Atoi(hi); err == nil && n >= 0 && n <= 255 {
			b4 = net.IPv4(a4[0], a4[1], a4[2], byte(n)).To4()
		} else if b := net.ParseIP(hi); b != nil && b.To4() != nil {
			b4 = b.To4()
		} else {
			return nil, fmt.Errorf("--source-addrs: %q: bad range end", item)
		}
		if !a4[:3].Equal(b4[:3]) || b4[3] < a4[3] {
			return nil, fmt.Errorf("--source-addrs: %q: a range stays within one /24 and goes up", item)
		}
		for x := int(a4[3]); x <= int(b4[3]); x++ {
			out = append(out, net.IPv4(a4[0], a4[1], a4[2], byte(x)))
		}
	}
	return out, nil
}

// progressPrinter shows live progress on a terminal, or log lines.
type progressPrinter struct {
	mu       sync.Mutex
	w        io.Writer
	line     bool // redraw a status line
	log      bool
	every    time.Duration
	lastLog  time.Time
	drawn    bool
	lastText string
}

func newProgressPrinter(w io.Writer, mode string, every time.Duration) *progressPrinter {
	p := &progressPrinter{w: w, every: every}
	switch mode {
	case "auto":
		if f, ok := w.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
			p.line = true
		} else {
			p.log = true
		}
	case "line":
		p.line = true
	case "log":
		p.log = true
	case "none":
	default:
		return nil
	}
	return p
}

func (p *progressPrinter) show(pg Progress) {
	p.mu.Lock()
	defer p.mu.Unlock()
	text := formatProgress(pg)
	switch {
	case p.line:
		fmt.Fprintf(p.w, "\r\033[K%s", text)
		p.drawn = true
	case p.log:
		if pg.Final || time.Since(p.lastLog) >= p.every {
			p.lastLog = time.Now()
			fmt.Fprintf(p.w, "%s emulate: %s\n", time.Now().Format("15:04:05"), text)
		}
	}
	p.lastText = text
}

func (p *progressPrinter) clearLine() {
	if p.drawn {
		fmt.Fprint(p.w, "\r\033[K")
	}
}

func (p *progressPrinter) warn(msg string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.clearLine()
	fmt.Fprintf(p.w, "\n*** WARNING: %s ***\n\n", msg)
	if p.drawn {
		fmt.Fprint(p.w, p.lastText)
	}
}

// println prints a line of text (always), keeping the status line below it.
func (p *progressPrinter) println(s string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.clearLine()
	fmt.Fprintln(p.w, s)
	if p.drawn {
		fmt.Fprint(p.w, p.lastText)
	}
}

func (p *progressPrinter) logf(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.line && !p.log {
		return
	}
	p.clearLine()
	fmt.Fprintf(p.w, "emulate: "+format+"\n", args...)
	if p.drawn {
		fmt.Fprint(p.w, p.lastText)
	}
}

func (p *progressPrinter) done() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.drawn {
		fmt.Fprintln(p.w)
		p.drawn = false
	}
}

func formatProgress(p Progress) string {
	var b strings.Builder
	fmt.Fprintf(&b, "[%s] %s", p.Phase, clock(p.Elapsed))
	if p.Remaining >= 0 {
		fmt.Fprintf(&b, " left %s", clock(p.Remaining))
	}
	if p.Phase == "register" || p.Reg.Done() > 0 && p.Push.Done() == 0 {
		fmt.Fprintf(&b, " | %s reg/s | new %d ok %d", rate(p.RegRate), p.Reg.New, p.Reg.Accepted)
		fmt.Fprintf(&b, " rejected %d dropped %d retried %d", p.Reg.RejectedTotal(), p.Reg.DroppedTotal(), p.Reg.Retried)
	} else {
		fmt.Fprintf(&b, " | %s push/s | ok %d", rate(p.PushRate), p.Push.Accepted)
		fmt.Fprintf(&b, " rejected %d dropped %d retried %d rereg %d", p.Push.RejectedTotal(), p.Push.DroppedTotal(), p.Push.Retried, p.Push.Reregistered)
		if p.Push.Late > 0 {
			fmt.Fprintf(&b, " late %d", p.Push.Late)
		}
		if p.PushP99 > 0 {
			fmt.Fprintf(&b, " | p99 %s", report.Dur(p.PushP99))
		}
	}
	if p.Concurrency > 0 {
		fmt.Fprintf(&b, " | workers %d", p.Concurrency)
	}
	fmt.Fprintf(&b, " | in flight %d | cpu %.2f rss %s", p.Inflight, p.CPU, report.Bytes(p.RSS))
	return b.String()
}

func rate(r float64) string {
	if r >= 100 {
		return strconv.FormatFloat(r, 'f', 0, 64)
	}
	return strconv.FormatFloat(r, 'f', 1, 64)
}

func clock(d time.Duration) string {
	s := int64(d.Round(time.Second) / time.Second)
	if s >= 3600 {
		return fmt.Sprintf("%d:%02d:%02d", s/3600, s/60%60, s%60)
	}
	return fmt.Sprintf("%02d:%02d", s/60, s%60)
}
