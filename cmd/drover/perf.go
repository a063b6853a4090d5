package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/drover/drover/cmd/internal/command"
	"github.com/drover/drover/internal/buildinfo"
	"github.com/drover/drover/internal/emulator"
	"github.com/drover/drover/internal/perf"
	"github.com/drover/drover/internal/protocol"
	"github.com/dustin/go-humanize"
)

// perf_ is `drover perf`: its servers are this program's serve command.
func perf_(ctx context.Context, args []string, env command.Env) error {
	stdout, stderr := env.Stdout, env.Stderr
	usage := func(w io.Writer) {
		fmt.Fprint(w, `usage: drover perf <command> [flags]

commands:
  list                          the presets of the test matrix
  run [flags] NAME...           run presets and write their protocols
  fleet [flags]                 the fleet test (the Fleet-1M preset): run --scale 0.2 for 200,000 devices;
                                over the server's TLS: run Fleet-TLS-500k
  report RESULT.json...         render protocols again from result files
  compare PREVIOUS CURRENT      version comparison (result files or directories)
  summary DIR...                a Markdown index of results (verdicts, figures, environments, breaking points)
  size --devices N --interval S [--from DIR]
                                whether this machine carries a fleet
  worker --listen ADDR --token-file F
                                a load machine: runs the share of a test that run --workers gives it

Run 'drover perf <command> --help' for a command's flags. docs/perf.md explains the tests.
`)
	}
	if len(args) == 0 {
		usage(stderr)
		return command.Usagef("no perf command given")
	}
	switch args[0] {
	case "list":
		fs := flag.NewFlagSet("drover perf list", flag.ContinueOnError)
		fs.Usage = func() {
			fmt.Fprintf(fs.Output(), "usage: drover perf list\n\nLists the presets: their type, devices, threads, duration and loop time.\n")
		}
		if err := command.Parse(fs, args[1:], env); err != nil {
			return err
		}
		if err := command.NoArgs(fs); err != nil {
			return err
		}
		return perf.List(stdout)
	case "run":
		exe, err := os.Executable()
		if err != nil {
			return err
		}
		return perfRun(ctx, args[1:], env, []string{exe, "serve"})
	case "fleet":
		exe, err := os.Executable()
		if err != nil {
			return err
		}
		return perfRun(ctx, append(args[1:], perf.FleetPreset), env, []string{exe, "serve"})
	case "report":
		return perfReport(args[1:], env)
	case "compare":
		return perfCompare(args[1:], env)
	case "size":
		return perfSize(args[1:], env)
	case "summary":
		return perfSummary(args[1:], env)
	case "worker":
		return perfWorker(ctx, args[1:], env)
	case "-h", "--help", "help":
		usage(stdout)
		return nil
	}
	usage(stderr)
	return command.Usagef("unknown perf command %q", args[0])
}

func parseInts(s string) ([]int, error) {
	if s == "" {
		return nil, nil
	}
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%q: want positive integers separated by commas", s)
		}
		out = append(out, n)
	}
	return out, nil
}

type multi []string

func (m *multi) String() string     { return strings.Join(*m, " ") }
func (m *multi) Set(v string) error { *m = append(*m, v); return nil }

// shellQuote quotes an argument for a POSIX shell when needed.
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./:=,@+") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func perfRun(ctx context.Context, args []string, env command.Env, serverCmd []string) error {
	stdout, stderr := env.Stdout, env.Stderr
	fs := flag.NewFlagSet("drover perf run", flag.ContinueOnError)
	var o perf.Options
	var serverArgs, userNotes multi
	fs.StringVar(&o.URL, "url", "", "test a running server at this URL (default: start `drover serve` for each test)")
	fs.StringVar(&o.EnrollmentSecret, "enrollment-secret", "", "the running server's enrollment secret")
	fs.StringVar(&o.AdminToken, "admin-token", "", "the running server's admin token (PeakF changes the profile; reads /metrics without --metrics-token)")
	fs.StringVar(&o.MetricsToken, "metrics-token", "", "the running server's metrics token, to read its /metrics")
	fs.StringVar(&o.MetricsURL, "metrics-url", "", "the running server's --metrics-listen address as http://host:port (no token needed)")
	fs.StringVar(&o.CAFile, "ca-cert", "", "PEM certificate to trust for the running server")
	fs.BoolVar(&o.Insecure, "insecure", false, "do not verify the running server's certificate")
	fs.StringVar(&o.ServerLog, "server-log", "", "the running server's log file, to review warnings and errors")
	fs.StringVar(&o.Persistence, "persistence", "", "started server: memory, write-through or write-back (default write-through; Registrar-1M: a comma-separated selection, default all three)")
	fs.StringVar(&o.DB, "db", "", "started server: database DSN (default: SQLite in a temporary data dir)")
	fs.Var(&serverArgs, "server-arg", "started server: one more flag for `drover serve` (repeatable)")
	fs.StringVar(&o.WorkDir, "work-dir", "", "where temporary data dirs go (default: the system's temp dir)")
	fs.Float64Var(&o.CPUs, "cpus", 0, "started server: run it in a cgroup with this CPU quota, in CPUs (e.g. 1 or 0.5; needs root)")
	memory := fs.String("memory", "", "started server: run it in a cgroup with this memory limit, e.g. 2GiB (needs root)")
	fs.StringVar(&o.EnvLabel, "env-label", "", "name of this environment in the protocol and perf summary, e.g. C1")
	fs.Float64Var(&o.Override.Scale, "scale", 0, "shorten the test: multiply devices and duration by this (0 < scale < 1)")
	fs.IntVar(&o.Override.Devices, "devices", 0, "replace the number of devices")
	fs.DurationVar(&o.Override.Duration, "duration", 0, "replace the duration (stability, peak)")
	fs.IntVar(&o.Override.LoopTime, "loop-time", 0, "replace the loop time (push interval) in seconds")
	fs.IntVar(&o.Override.Threads, "threads", 0, "replace the number of emulator threads")
	fs.IntVar(&o.Override.Repeats, "repeats", 0, "replace a registrar test's runs per cell (Registrar-1M: 2)")
	handlers := fs.String("handlers", "", "replace the server handler threads of a benchmark, e.g. 1,2")
	conn := fs.String("conn", "", "emulator connections: new (per request, as agents do), resume (per request, each device resuming its own TLS session) or keepalive (default: the preset's, new for most)")
	fs.StringVar(&o.TLSMaxVersion, "tls-max-version", "", "highest TLS version the emulated devices offer, as the agent's flag: 1.3 (default) or 1.2")
	fs.StringVar(&o.TLSKeyExchange, "tls-key-exchange", "", "TLS key exchange the emulated devices offer, as the agent's flag: classic (default), x25519, p256, hybrid or a list; a server started here accepts classic unless --server-arg says otherwise")
	sources := fs.String("source-addrs", "", "local addresses to connect from, e.g. 127.0.0.1-127.0.0.8 (default for a started server)")
	out := fs.String("out", "perf-results", "directory for the protocols (NAME.md, NAME.html, NAME.json)")
	quiet := fs.Bool("quiet", false, "no progress lines")
	fs.Var(&userNotes, "note", "a note for the protocol's Notes (repeatable)")
	workers := fs.String("workers", "", "load machines running `drover perf worker`, host:port separated by commas: the fleet is split over them (needs --url)")
	workerToken := fs.String("worker-token", "", "the workers' shared secret (drover perf worker --token)")
	fs.DurationVar(&o.WorkerTimeout, "worker-timeout", 30*time.Second, "a load machine that sends nothing for this long fails the test")
	secretFiles := command.DefineSecretFiles(fs, "enrollment-secret", "admin-token", "metrics-token", "worker-token")
	if err := command.Load(fs, args, env); err != nil {
		return err
	}
	if err := secretFiles.Read(); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		return command.Usagef("name at least one preset (drover perf list)")
	}
	if *workers != "" {
		o.Workers = strings.Split(*workers, ",")
		if err := checkToken(*workerToken, "--worker-token"); err != nil {
			return err
		}
		o.WorkerToken = *workerToken
		if o.URL == "" {
			return command.Usagef("--workers: load machines need a server they can reach: give its --url")
		}
		if o.WorkerTimeout <= 0 {
			return command.Usagef("--worker-timeout must be positive")
		}
	}
	if *memory != "" {
		b, err := humanize.ParseBytes(*memory)
		if err != nil || b < 64<<20 {
			return command.Usagef("--memory %q: want a size of at least 64MiB, e.g. 2GiB", *memory)
		}
		o.MemoryBytes = int64(b)
	}
	if o.CPUs < 0 {
		return command.Usagef("--cpus %v: want a positive number of CPUs", o.CPUs)
	}
	if o.URL != "" && (o.CPUs > 0 || o.MemoryBytes > 0) {
		return command.Usagef("--cpus and --memory limit a server started by drover perf; a running server (--url) has its own limits")
	}
	var presets []perf.Preset
	for _, n := range fs.Args() {
		p, ok := perf.Lookup(n)
		if !ok {
			return command.Usagef("no preset %q (drover perf list)", n)
		}
		presets = append(presets, p)
	}
	var err error
	if o.Override.Handlers, err = parseInts(*handlers); err != nil {
		return command.Usagef("--handlers %w", err)
	}
	o.Conn = emulator.ConnMode(*conn)
	switch o.Conn {
	case "", emulator.ConnNew, emulator.ConnResume, emulator.ConnKeepAlive:
	default:
		return command.Usagef("--conn %q: want new, resume or keepalive", *conn)
	}
	if _, err := protocol.TLSMaxVersion(o.TLSMaxVersion); err != nil {
		return command.Usage(err)
	}
	if o.TLSKeyExchange != "" {
		if _, err := protocol.KeyExchangeGroups(o.TLSKeyExchange); err != nil {
			return command.Usage(err)
		}
	}
	if *sources != "" {
		if o.SourceAddrs, err = emulator.ParseSourceAddrs(*sources); err != nil {
			return command.Usage(err)
		}
	} else if o.URL != "" {
		o.SourceAddrs = []net.IP{}
	}
	o.ServerArgs = serverArgs
	o.ServerCmd = serverCmd
	o.Version = buildinfo.Version()
	if !*quiet {
		o.Progress = stderr
	}
	quoted := []string{"drover", "perf", "run"}
	for _, a := range args {
		quoted = append(quoted, shellQuote(a))
	}
	o.Command = strings.Join(quoted, " ")
	for _, secret := range []string{o.EnrollmentSecret, o.AdminToken, o.MetricsToken, o.WorkerToken} {
		if secret != "" {
			o.Command = strings.ReplaceAll(o.Command, shellQuote(secret), "***")
		}
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		return err
	}
	var failed []string
	for _, p := range presets {
		if ctx.Err() != nil {
			break
		}
		fmt.Fprintf(stderr, "%s %s: starting\n", time.Now().Format("15:04:05"), p.Name)
		r, err := perf.Run(ctx, p, o)
		if r == nil {
			return err
		}
		r.Notes = append(r.Notes, userNotes...)
		if err != nil {
			r.Notes = append(r.Notes, "The run ended early: "+err.Error())
		}
		paths, werr := perf.WriteReports(r, *out)
		if werr != nil {
			return werr
		}
		c := perf.Compute(r)
		fmt.Fprintf(stdout, "%s: %s — %s\n", r.Title(), c.Verdict, strings.Join(paths, ", "))
		if lines := perf.ChecksText(r); len(lines) > 0 {
			fmt.Fprintln(stdout, strings.Join(lines, "\n"))
		}
		if c.Verdict == perf.Failed {
			failed = append(failed, p.Name)
		}
		if err != nil && ctx.Err() != nil {
			return err
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("failed: %s", strings.Join(failed, ", "))
	}
	return ctx.Err()
}

func perfReport(args []string, env command.Env) error {
	fs := flag.NewFlagSet("drover perf report", flag.ContinueOnError)
	out := fs.String("out", "", "directory for the protocols (default: next to each result)")
	if err := command.Load(fs, args, env); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		return command.Usagef("give result files (NAME.json)")
	}
	for _, f := range fs.Args() {
		r, err := perf.LoadResult(f)
		if err != nil {
			return err
		}
		dir := *out
		if dir == "" {
			dir = filepath.Dir(f)
		}
		paths, err := perf.WriteReports(r, dir)
		if err != nil {
			return err
		}
		fmt.Fprintln(env.Stdout, strings.Join(paths, ", "))
	}
	return nil
}

func perfCompare(args []string, env command.Env) error {
	fs := flag.NewFlagSet("drover perf compare", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: drover perf compare PREVIOUS CURRENT\n\nEach is a result file or a directory of them: RSS and KiB per device come from\nthe largest stability test, pushes/s from the lowest SSL benchmark.")
	}
	if err := command.Parse(fs, args, env); err != nil {
		return err
	}
	if fs.NArg() != 2 {
		fs.Usage()
		return command.Usagef("want two arguments")
	}
	prev, err := perf.LoadResults(fs.Arg(0))
	if err != nil {
		return err
	}
	cur, err := perf.LoadResults(fs.Arg(1))
	if err != nil {
		return err
	}
	return perf.Compare(env.Stdout, fs.Arg(0), prev, fs.Arg(1), cur)
}

func perfSummary(args []string, env command.Env) error {
	fs := flag.NewFlagSet("drover perf summary", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: drover perf summary DIR|FILE...\n\nA Markdown index of the results in the given directories or JSON files: verdicts, figures,\ncommands, environments, the benchmark table across versions, and where the Peak\ntests' and emulator ramps' (*.jsonl) drops begin.")
	}
	if err := command.Load(fs, args, env); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		return command.Usagef("give result files or directories")
	}
	ramps, err := perf.LoadRamps(fs.Args()...)
	if err != nil {
		return err
	}
	rs, err := perf.LoadResults(fs.Args()...)
	if err != nil && len(ramps) == 0 {
		return err
	}
	return perf.Summary(env.Stdout, rs, ramps...)
}

func perfSize(args []string, env command.Env) error {
	fs := flag.NewFlagSet("drover perf size", flag.ContinueOnError)
	devices := fs.Int("devices", 0, "devices in the fleet")
	interval := fs.Float64("interval", 200, "push interval in seconds")
	from := fs.String("from", "perf-results", "results (a directory or files separated by commas)")
	noSSL := fs.Bool("no-ssl", false, "TLS is terminated in front of Drover: size from the noSSL benchmarks")
	if err := command.Load(fs, args, env); err != nil {
		return err
	}
	if err := command.NoArgs(fs); err != nil {
		return err
	}
	if *devices <= 0 {
		return command.Usagef("--devices is required")
	}
	rs, err := perf.LoadResults(strings.Split(*from, ",")...)
	if err != nil {
		return err
	}
	s, err := perf.Size(rs, *devices, *interval, !*noSSL)
	if err != nil {
		return err
	}
	s.Write(env.Stdout)
	return nil
}

// checkToken refuses a missing or short shared secret; name is its
// flag's name for messages.
func checkToken(value, name string) error {
	if len(value) < perf.MinTokenLength {
		return command.Usagef("%s or %s-file is required: a shared secret of at least %d characters (the workers refuse requests without it)", name, name, perf.MinTokenLength)
	}
	return nil
}

// perfWorker is `drover perf worker`: a load machine.
func perfWorker(ctx context.Context, args []string, env command.Env) error {
	fs := flag.NewFlagSet("drover perf worker", flag.ContinueOnError)
	listen := fs.String("listen", "", "address to listen on for the coordinator, e.g. 0.0.0.0:7070")
	token := fs.String("token", "", "the shared secret the coordinator sends (drover perf run --worker-token)")
	secretFiles := command.DefineSecretFiles(fs, "token")
	workDir := fs.String("work-dir", "", "where the fleet's credentials are kept during a test (default: the system's temp dir)")
	sources := fs.String("source-addrs", "", "local addresses to connect from, e.g. 10.0.0.5-10.0.0.8")
	if err := command.Load(fs, args, env); err != nil {
		return err
	}
	if err := secretFiles.Read(); err != nil {
		return err
	}
	if err := command.NoArgs(fs); err != nil {
		return err
	}
	if *listen == "" {
		return command.Usagef("--listen is required")
	}
	if err := checkToken(*token, "--token"); err != nil {
		return err
	}
	cfg := perf.WorkerConfig{Token: *token, WorkDir: *workDir, Version: buildinfo.Version(), Logf: func(f string, a ...any) {
		fmt.Fprintf(env.Stderr, "%s %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(f, a...))
	}}
	if *sources != "" {
		var err error
		if cfg.SourceAddrs, err = emulator.ParseSourceAddrs(*sources); err != nil {
			return command.Usage(err)
		}
	}
	w, err := perf.NewWorker(cfg)
	if err != nil {
		return err
	}
	defer w.Close()
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: w, ReadHeaderTimeout: 10 * time.Second}
	fmt.Fprintf(env.Stderr, "drover perf worker listening on %s\n", ln.Addr())
	stop := context.AfterFunc(ctx, func() { srv.Close() })
	defer stop()
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
