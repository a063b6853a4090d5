package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/term"

	"github.com/drover/drover/cmd/internal/command"
	"github.com/drover/drover/internal/emulator"
	"github.com/drover/drover/internal/emulator/results"
	"github.com/drover/drover/internal/render"
	"github.com/drover/drover/internal/report"
)

func emulate(ctx context.Context, args []string, env command.Env) error {
	cfg := emulator.DefaultConfig()
	fs := flag.NewFlagSet("drover emulate", flag.ContinueOnError)
	var (
		mode, conn, shard, sources, tplFile, serverDir, caFile, out, progress string
		procs                                                                 int
		logEvery                                                              time.Duration
		printTemplate                                                         bool
		cpuProfile                                                            string
	)
	fs.StringVar(&cfg.Target, "target", "", "server base URL, e.g. https://127.0.0.1:8443 (required)")
	fs.StringVar(&serverDir, "server-dir", "", "a local server's --data-dir: takes the enrollment secret from secrets.json and trusts tls/cert.pem")
	fs.StringVar(&cfg.EnrollmentSecret, "secret", env.Var("DROVER_ENROLLMENT_SECRET"), "enrollment secret (default: $DROVER_ENROLLMENT_SECRET)")
	fs.StringVar(&caFile, "ca-cert", "", "PEM file of the certificate(s) to trust (default: system roots)")
	fs.BoolVar(&cfg.Insecure, "insecure", false, "do not verify the server's certificate")
	fs.StringVar(&cfg.TLSMaxVersion, "tls-max-version", cfg.TLSMaxVersion, "highest TLS version the devices offer: 1.3 (default) or 1.2 (a resumed TLS 1.2 session needs no key exchange)")
	fs.StringVar(&cfg.TLSKeyExchange, "tls-key-exchange", cfg.TLSKeyExchange, "TLS key exchange the devices offer, as the agent's flag: classic (X25519 key share, P-256 and P-384 as fallbacks), x25519, p256, hybrid (also post-quantum X25519MLKEM768) or a comma-separated list")
	fs.IntVar(&cfg.Devices, "devices", cfg.Devices, "devices in the whole fleet (all shards)")
	fs.StringVar(&shard, "shard", "1/1", "this process's share k/n of the fleet: devices whose index % n == k-1")
	fs.StringVar(&cfg.Seed, "seed", cfg.Seed, "identity seed: machine IDs derive from it and the device index")
	fs.StringVar(&cfg.MachineIDs, "machine-ids", emulator.MachineIDsRandom, "machine IDs: random (hashed from the seed and the index) or sequential (a prefix from the seed, then the index zero-padded); both 32 characters")
	fs.StringVar(&mode, "mode", string(cfg.Mode), "load model: fleet (open loop, one push per interval per device), benchmark (closed loop, workers × loops), ramp (closed loop, rising workers until drops or retries), connect (every device holds its persistent connection for --duration; --command-rate measures command delivery)")
	fs.Float64Var(&cfg.CommandRate, "command-rate", 0, "connect: commands per second (whole fleet) sent through the operator API to random connected devices; the time until the device is told is op \"command\"")
	fs.StringVar(&cfg.AdminToken, "admin-token", env.Var("DROVER_ADMIN_TOKEN"), "operator token for connect's --command-rate and for approving --wipe's re-enrollment requests (default: $DROVER_ADMIN_TOKEN; --server-dir takes secrets.json's admin_token)")
	fs.Float64Var(&cfg.Wipe, "wipe", 0, "fleet: share (0..1) of the devices whose agent state is wiped at --wipe-at: they keep their machine ID and register again without credentials; their re-enrollment requests are approved with the admin token, if any (docs/emulator.md)")
	fs.DurationVar(&cfg.WipeAt, "wipe-at", 0, "fleet: when --wipe wipes, from the start of the run (default: half of --duration)")
	fs.StringVar(&conn, "conn", "", "connections: new (TCP+TLS per request), resume (TCP per request, each device resuming its own TLS session, as the agent does), keepalive (default: new in fleet mode, keepalive otherwise)")
	fs.DurationVar(&cfg.Interval, "interval", cfg.Interval, "fleet: each device's push interval")
	fs.DurationVar(&cfg.Duration, "duration", 0, "fleet: run time (default 10m); connect: time connections are held, registration included (default 1m); benchmark, ramp: time limit (default none)")
	fs.IntVar(&cfg.Workers, "workers", cfg.Workers, "benchmark: concurrent workers (T); also the concurrency of the registration storm before benchmark, ramp and connect, and of connect's handshakes")
	fs.IntVar(&cfg.Loops, "loops", cfg.Loops, "benchmark: immediate loops over all devices (L); 0: register only")
	fs.IntVar(&cfg.RampStart, "ramp-start", cfg.RampStart, "ramp: workers of the first step")
	fs.Float64Var(&cfg.RampFactor, "ramp-factor", cfg.RampFactor, "ramp: workers multiply by this each step")
	fs.DurationVar(&cfg.RampStepDuration, "ramp-step", cfg.RampStepDuration, "ramp: length of a step")
	fs.IntVar(&cfg.RampMax, "ramp-max", 0, "ramp: most workers (default: min(devices of the shard, 16384))")
	fs.IntVar(&cfg.MaxInflight, "max-inflight", cfg.MaxInflight, "fleet: operations in flight at most; beyond, sends wait and count as late")
	fs.DurationVar(&cfg.Timeout, "timeout", cfg.Timeout, "per request, connect and TLS handshake included")
	fs.IntVar(&cfg.MaxRetries, "max-retries", cfg.MaxRetries, "retries after 503 or 429 (honouring Retry-After, with backoff and jitter); -1: none")
	fs.DurationVar(&cfg.MaxRetryWait, "max-retry-wait", cfg.MaxRetryWait, "longest wait before a retry; a longer Retry-After ends the operation")
	fs.DurationVar(&cfg.LateAfter, "late-after", cfg.LateAfter, "fleet: a send this far behind its schedule counts as late")
	fs.StringVar(&sources, "source-addrs", "", "local addresses to connect from, round robin: 127.0.0.1,127.0.0.2 or 127.0.0.1-127.0.0.8")
	fs.StringVar(&tplFile, "template", "", "push body template file (default: a cellular router's state; see --print-template)")
	fs.BoolVar(&printTemplate, "print-template", false, "print the default template and the placeholders, and exit")
	fs.StringVar(&cfg.CredentialsFile, "credentials", "", "file to load device IDs and tokens from and save them to, so later runs skip registration")
	fs.StringVar(&cfg.AcksFile, "acks", "", "write one JSON line per accepted push (device_id, seq, node, at_ms) to this file, to compare with what the server stored")
	fs.StringVar(&cfg.DeviceType, "device-type", cfg.DeviceType, "device type to register with")
	fs.StringVar(&cfg.Model, "model", cfg.Model, "model to register with")
	fs.StringVar(&cfg.Firmware, "firmware", cfg.Firmware, "firmware to register with and report")
	fs.Int64Var(&cfg.DownloadRate, "download-rate", cfg.DownloadRate, "fleet: firmware a rollout offers is downloaded at most this many bytes/s per device (the link speed); 0: unlimited")
	fs.Float64Var(&cfg.DownloadFailRate, "download-fail-rate", cfg.DownloadFailRate, "fleet: share (0..1) of firmware download attempts cut at a random point, then resumed with Range")
	fs.DurationVar(&cfg.InstallTime, "install-time", cfg.InstallTime, "fleet: after reporting installing, a device reboots into the new firmware after this")
	fs.StringVar(&out, "out", "drover-emulate.jsonl", "result stream file (JSON lines; '-': stdout; '': none); render it with drover report")
	fs.IntVar(&procs, "procs", 1, "split this shard over this many processes (each has its own open-file limit and source ports)")
	fs.StringVar(&progress, "progress", "auto", "live progress: auto (a status line on a terminal, else log lines), line, log, none")
	fs.DurationVar(&logEvery, "log-every", 10*time.Second, "period of progress log lines")
	fs.StringVar(&cfg.RunID, "run-id", "", "run identifier in the results (default: time and random)")
	fs.StringVar(&cpuProfile, "cpuprofile", "", "write the emulator's CPU profile to this file (go tool pprof)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: drover emulate --target URL [flags]\n\n"+
			"Emulates a fleet of devices against a Drover server and measures it.\n"+
			"Results stream to --out; a summary is printed at the end. Every flag can also\n"+
			"be set as DROVER_<NAME> in the environment or as <name> in the --config file.\n\nflags:\n")
		fs.PrintDefaults()
	}
	command.DefineSecretFiles(fs, "secret", "admin-token")
	if err := command.Load(fs, args, env); err != nil {
		return err
	}
	if err := command.NoArgs(fs); err != nil {
		return err
	}
	if printTemplate {
		fmt.Fprintf(env.Stdout, "%s\n\nplaceholders:\n%s", emulator.DefaultTemplate, emulator.PlaceholderHelp())
		return nil
	}
	cfg.Mode, cfg.Conn = emulator.Mode(mode), emulator.ConnMode(conn)
	var err error
	if cfg.Shard, err = emulator.ParseShard(shard); err != nil {
		return command.Usage(err)
	}
	if cfg.SourceAddrs, err = emulator.ParseSourceAddrs(sources); err != nil {
		return command.Usage(err)
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
		if cfg.Template, err = emulator.ParseTemplate(filepath.Base(tplFile), string(src)); err != nil {
			return err
		}
	}
	if cfg.Target == "" {
		return command.Usage(errors.New("--target is required (e.g. --target https://127.0.0.1:8443)"))
	}
	if procs < 1 {
		return command.Usage(errors.New("--procs must be at least 1"))
	}
	if cfg.EnrollmentSecret == "" && cfg.CredentialsFile == "" {
		fmt.Fprintln(env.Stderr, "drover emulate: no --secret: registrations will be refused")
	}
	if err := cfg.Validate(); err != nil {
		return command.Usage(err)
	}

	var sink io.Writer = io.Discard
	summaryOut := env.Stdout
	switch out {
	case "":
	case "-":
		sink, summaryOut = env.Stdout, env.Stderr
	default:
		f, err := os.Create(out)
		if err != nil {
			return err
		}
		defer f.Close()
		sink = f
	}
	pr := newProgressPrinter(env.Stderr, progress, logEvery)
	if pr == nil {
		return command.Usage(fmt.Errorf("--progress %q: want auto, line, log or none", progress))
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
		m, runErr = emulateProcs(ctx, fs, cfg, procs, sink, pr)
	} else {
		var st results.Stream
		cfg.Records = &st
		_, runErr = emulator.Run(ctx, cfg, sink)
		if len(st.Summaries) > 0 {
			var err error
			if m, err = st.Merge(); err != nil && runErr == nil {
				runErr = err
			}
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

// selfCommand is how a child emulator process is started: the program and
// the arguments before the emulate flags (a variable for tests).
var selfCommand = func() ([]string, error) {
	exe, err := os.Executable()
	return []string{exe, "emulate"}, err
}

// emulateProcs runs the shard over procs children: this program's emulate
// command with the same flags, each with its share of the shard.
func emulateProcs(ctx context.Context, fs *flag.FlagSet, cfg emulator.Config, procs int, sink io.Writer, pr *progressPrinter) (*results.Merged, error) {
	cmd, err := selfCommand()
	if err != nil {
		return nil, fmt.Errorf("--procs: cannot find this program: %w", err)
	}
	skip := map[string]bool{"procs": true, "out": true, "progress": true, "shard": true, "run-id": true, "log-every": true, "secret": true, "config": true, "admin-token": true, "secret-file": true, "admin-token-file": true}
	fs.VisitAll(func(f *flag.Flag) {
		// Every value, also those from the environment or the config file.
		if !skip[f.Name] && f.Value.String() != f.DefValue {
			cmd = append(cmd, "--"+f.Name+"="+f.Value.String())
		}
	})
	cmd = append(cmd, "--run-id="+cfg.RunID, "--out=-", "--progress=none")
	return emulator.RunProcs(ctx, cfg, emulator.Procs{
		N: procs, Command: cmd, Sink: sink, Stderr: pr.println,
		Env: append(os.Environ(), "DROVER_ENROLLMENT_SECRET="+cfg.EnrollmentSecret, "DROVER_ADMIN_TOKEN="+cfg.AdminToken),
	})
}

func readServerDir(dir string, cfg *emulator.Config, caFile *string) error {
	b, err := os.ReadFile(filepath.Join(dir, "secrets.json"))
	if err != nil {
		return fmt.Errorf("--server-dir: %w", err)
	}
	var sec struct {
		EnrollmentSecret string `json:"enrollment_secret"`
		AdminToken       string `json:"admin_token"`
	}
	if err := json.Unmarshal(b, &sec); err != nil {
		return fmt.Errorf("--server-dir: secrets.json: %w", err)
	}
	if cfg.EnrollmentSecret == "" {
		cfg.EnrollmentSecret = sec.EnrollmentSecret
	}
	if cfg.AdminToken == "" {
		cfg.AdminToken = sec.AdminToken
	}
	if *caFile == "" {
		if _, err := os.Stat(filepath.Join(dir, "tls", "cert.pem")); err == nil {
			*caFile = filepath.Join(dir, "tls", "cert.pem")
		}
	}
	return nil
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

func (p *progressPrinter) show(pg emulator.Progress) {
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

func formatProgress(p emulator.Progress) string {
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
			fmt.Fprintf(&b, " | p99 %s", render.Duration(p.PushP99))
		}
	}
	if p.Concurrency > 0 {
		fmt.Fprintf(&b, " | workers %d", p.Concurrency)
	}
	fmt.Fprintf(&b, " | in flight %d | cpu %.2f rss %s", p.Inflight, p.CPU, render.BinaryBytes(p.RSS))
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
