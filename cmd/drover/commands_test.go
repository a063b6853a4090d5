package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/cmd/internal/command"
	"github.com/drover/drover/internal/emulator"
	"github.com/drover/drover/internal/emulator/results"
	"github.com/drover/drover/internal/server/servertest"
)

// testEnv is a process environment of buffers and a map.
func testEnv(stdin io.Reader, stdout, stderr io.Writer, vars map[string]string) command.Env {
	return command.Env{Stdin: stdin, Stdout: stdout, Stderr: stderr, Getenv: func(k string) string { return vars[k] }}
}

func TestConfigPrecedence(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "drover.toml")
	os.WriteFile(file, []byte("push-interval = 60\nlisten = \"127.0.0.1:1\"\nlog-format = \"json\"\n"), 0o600)
	env := map[string]string{"DROVER_PUSH_INTERVAL": "90", "DROVER_CONFIG": file}
	cfg, err := serveConfig([]string{"-log-format", "text"}, testEnv(nil, io.Discard, io.Discard, env))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.PushInterval != 90 || cfg.Listen != "127.0.0.1:1" || cfg.LogFormat != "text" {
		t.Fatalf("precedence wrong: %+v", cfg)
	}
	os.WriteFile(file, []byte("no-such-key = 1\n"), 0o600)
	if _, err := serveConfig(nil, testEnv(nil, io.Discard, io.Discard, env)); err == nil || !strings.Contains(err.Error(), "unknown key") {
		t.Fatalf("unknown key: %v", err)
	}
	if _, err := serveConfig([]string{"-persistence", "sometimes"}, testEnv(nil, io.Discard, io.Discard, nil)); err == nil {
		t.Fatal("bad persistence accepted")
	}
}

// A bad duration names where it came from, the key and the form wanted.
func TestConfigBadDuration(t *testing.T) {
	file := filepath.Join(t.TempDir(), "drover.toml")
	os.WriteFile(file, []byte("flush-interval = 5\n"), 0o600)
	_, err := serveConfig([]string{"--config", file}, testEnv(nil, io.Discard, io.Discard, nil))
	if err == nil || !strings.Contains(err.Error(), file) || !strings.Contains(err.Error(), `key "flush-interval"`) ||
		!strings.Contains(err.Error(), `"5" is not a duration`) || !strings.Contains(err.Error(), `"30s"`) {
		t.Fatalf("flush-interval = 5: %v", err)
	}
	if code := command.ExitCode("drover serve", err, io.Discard); code != 2 {
		t.Fatalf("exit code %d, want 2", code)
	}
	_, err = serveConfig(nil, testEnv(nil, io.Discard, io.Discard, map[string]string{"DROVER_SHUTDOWN_TIMEOUT": "soon"}))
	if err == nil || !strings.Contains(err.Error(), "DROVER_SHUTDOWN_TIMEOUT") || !strings.Contains(err.Error(), "not a duration") {
		t.Fatalf("DROVER_SHUTDOWN_TIMEOUT=soon: %v", err)
	}
}

// The upgrade trap: `drover migrate --config prod.toml` must
// migrate the database prod.toml names, not create ./drover-data/drover.db.
func TestMigrateUsesTheConfigFile(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	prodDB := filepath.Join(dir, "prod", "fleet.db")
	file := filepath.Join(dir, "prod.toml")
	// A whole serve configuration: migrate accepts serve's keys.
	os.WriteFile(file, []byte(fmt.Sprintf("db = %q\nlisten = \"127.0.0.1:9443\"\npersistence = \"write-back\"\nflush-interval = \"2s\"\n", "sqlite:"+prodDB)), 0o600)
	for name, c := range map[string]struct {
		args []string
		env  map[string]string
	}{
		"--config":      {[]string{"--config", file}, nil},
		"DROVER_CONFIG": {nil, map[string]string{"DROVER_CONFIG": file}},
	} {
		var out, errOut bytes.Buffer
		if code := run(context.Background(), append([]string{"migrate"}, c.args...), testEnv(nil, &out, &errOut, c.env)); code != 0 {
			t.Fatalf("%s: exit %d: %s", name, code, errOut.String())
		}
		if _, err := os.Stat(prodDB); err != nil {
			t.Fatalf("%s: the configured database was not migrated: %v (said %q)", name, err, out.String())
		}
		if _, err := os.Stat(filepath.Join(dir, "drover-data")); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s: migrate created ./drover-data (%v)", name, err)
		}
		if !strings.HasPrefix(out.String(), "sqlite: applied ") {
			t.Fatalf("%s: said %q", name, out.String())
		}
	}
	// Again: nothing to apply, same schema version, from the environment.
	var out bytes.Buffer
	if code := run(context.Background(), []string{"migrate"}, testEnv(nil, &out, io.Discard, map[string]string{"DROVER_DB": "sqlite:" + prodDB})); code != 0 ||
		!strings.Contains(out.String(), "applied 0 migration(s); schema version ") {
		t.Fatalf("DROVER_DB: exit %d, said %q", code, out.String())
	}
	// A key no command knows is still an error.
	os.WriteFile(file, []byte("dbb = \"sqlite:x.db\"\n"), 0o600)
	var errOut bytes.Buffer
	if code := run(context.Background(), []string{"migrate", "--config", file}, testEnv(nil, io.Discard, &errOut, nil)); code != 2 || !strings.Contains(errOut.String(), `unknown key "dbb"`) {
		t.Fatalf("unknown key: exit %d, %s", code, errOut.String())
	}
}

// Help is asked for: stdout, exit 0. A wrong invocation: stderr, exit 2.
func TestHelpAndUsageErrors(t *testing.T) {
	for _, c := range []string{"serve", "migrate", "user", "agent", "emulate", "report", "perf run", "perf fleet", "perf size", "perf report", "perf compare", "perf summary", "perf worker"} {
		var out, errOut bytes.Buffer
		args := append(strings.Fields(c), "--help")
		if code := run(context.Background(), args, testEnv(nil, &out, &errOut, nil)); code != 0 || out.Len() == 0 || errOut.Len() != 0 {
			t.Errorf("drover %s --help: exit %d, stdout %d bytes, stderr %q", c, code, out.Len(), errOut.String())
		}
		out.Reset()
		errOut.Reset()
		args = append(strings.Fields(c), "--no-such-flag")
		if code := run(context.Background(), args, testEnv(nil, &out, &errOut, nil)); code != 2 || !strings.Contains(errOut.String(), "no-such-flag") {
			t.Errorf("drover %s --no-such-flag: exit %d, stderr %q", c, code, errOut.String())
		}
	}
	var out, errOut bytes.Buffer
	if code := run(context.Background(), []string{"help"}, testEnv(nil, &out, &errOut, nil)); code != 0 || !strings.Contains(out.String(), "migrate") {
		t.Errorf("drover help: %d %q", code, out.String())
	}
	for _, args := range [][]string{{}, {"nonsense"}, {"perf"}, {"perf", "nonsense"}, {"report"}, {"emulate"}, {"serve", "stray"},
		{"perf", "run", "--memory", "10KiB", "Stab-2-2"}, {"perf", "run", "--cpus", "-1", "Stab-2-2"},
		{"perf", "run", "--url", "http://127.0.0.1:1", "--enrollment-secret", "s", "--cpus", "1", "Stab-2-2"},
		{"perf", "run", "--tls-max-version", "1.1", "Fleet-TLS-500k"}, {"perf", "run", "--tls-key-exchange", "pq", "Fleet-TLS-500k"},
		{"perf", "run", "--conn", "reuse", "Fleet-TLS-500k"}} {
		errOut.Reset()
		if code := run(context.Background(), args, testEnv(nil, io.Discard, &errOut, nil)); code != 2 || errOut.Len() == 0 {
			t.Errorf("drover %q: exit %d, stderr %q", args, code, errOut.String())
		}
	}
}

// A load machine's worker refuses to start without its shared secret, and
// the coordinator refuses --workers without it: usage errors (exit 2).
func TestPerfWorkerNeedsToken(t *testing.T) {
	short := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(short, []byte("short\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"perf", "worker", "--listen", "127.0.0.1:0"},
		{"perf", "worker", "--listen", "127.0.0.1:0", "--token", "short"},
		{"perf", "worker", "--listen", "127.0.0.1:0", "--token-file", short},
		{"perf", "worker", "--token", "a-long-enough-token-0123"},
		{"perf", "run", "--url", "http://127.0.0.1:1", "--enrollment-secret", "s", "--workers", "127.0.0.1:2", "Stab-2-2"},
		{"perf", "run", "--workers", "127.0.0.1:2", "--worker-token", "a-long-enough-token-0123", "Stab-2-2"},
	} {
		var errOut bytes.Buffer
		if code := run(context.Background(), args, testEnv(nil, io.Discard, &errOut, nil)); code != 2 || errOut.Len() == 0 {
			t.Errorf("drover %q: exit %d, stderr %q", args, code, errOut.String())
		}
	}
	if code := run(context.Background(), []string{"perf", "worker", "--listen", "127.0.0.1:0", "--token-file", "/nonexistent/token"}, testEnv(nil, io.Discard, io.Discard, nil)); code == 0 {
		t.Error("a worker with an unreadable token file started")
	}
}

func TestReportCommand(t *testing.T) {
	dir := t.TempDir()
	fixture, err := os.ReadFile("../../internal/report/testdata/ramp.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	in := filepath.Join(dir, "r.jsonl")
	os.WriteFile(in, fixture, 0o644)
	var out, errOut bytes.Buffer
	if err := report_(context.Background(), []string{"--format", "markdown", in}, testEnv(nil, &out, &errOut, nil)); err != nil || !strings.HasPrefix(out.String(), "# Drover emulator report") {
		t.Fatalf("%v: %s", err, out.String())
	}
	html := filepath.Join(dir, "r.html")
	if err := report_(context.Background(), []string{"--format", "html", "--out", html, "-"}, testEnv(bytes.NewReader(fixture), &out, &errOut, nil)); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(html); !bytes.Contains(b, []byte("<svg")) {
		t.Fatal("no plot in the HTML file")
	}
	for args, want := range map[string]string{
		"":                         "no results file",
		"--format pdf x":           "--format",
		filepath.Join(dir, "none"): "no such file",
	} {
		if err := report_(context.Background(), strings.Fields(args), testEnv(nil, &out, &errOut, nil)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", args, err, want)
		}
	}
	if err := report_(context.Background(), []string{"--help"}, testEnv(nil, &out, &errOut, nil)); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("--help: %v", err)
	}
}

// --procs runs children of the real binary against a real server; the
// merged stream and summary count what the server counted.
func TestEmulateProcs(t *testing.T) {
	srv := servertest.Start(t, servertest.Options{HTTP: true})
	selfCommand = func() ([]string, error) { return []string{droverBin, "emulate"}, nil }
	out := filepath.Join(t.TempDir(), "r.jsonl")
	var stdout, stderr bytes.Buffer
	err := emulate(context.Background(), []string{"--target", srv.HTTPURL, "--secret", srv.EnrollmentSecret, "--mode", "benchmark",
		"--devices", "12", "--workers", "2", "--loops", "2", "--procs", "2", "--out", out, "--progress", "none"}, testEnv(nil, &stdout, &stderr, nil))
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	accepted := srv.Metric("drover_pushes_total", map[string]string{"outcome": "accepted"})
	registered := srv.Metric("drover_registrations_total", map[string]string{"outcome": "new"})
	if accepted != 24 || registered != 12 {
		t.Fatalf("server accepted %v, registered %v", accepted, registered)
	}
	fh, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	var st results.Stream
	if err := st.Read(bufio.NewReader(fh)); err != nil {
		t.Fatal(err)
	}
	if len(st.Starts) != 2 || len(st.Summaries) != 2 || st.Starts[0].RunID != st.Starts[1].RunID {
		t.Fatalf("%d starts, %d summaries", len(st.Starts), len(st.Summaries))
	}
	if !strings.Contains(stdout.String(), "2: 1/2, 2/2") || !strings.Contains(stdout.String(), "Shards") {
		t.Fatalf("summary:\n%s", stdout.String())
	}
}

// --machine-ids sequential registers devices under the counter IDs, which
// the server accepts; the saved credentials show them in index order.
func TestEmulateSequentialMachineIDs(t *testing.T) {
	srv := servertest.Start(t, servertest.Options{HTTP: true})
	cred := filepath.Join(t.TempDir(), "cred.jsonl")
	var stdout, stderr bytes.Buffer
	err := emulate(context.Background(), []string{"--target", srv.HTTPURL, "--secret", srv.EnrollmentSecret, "--mode", "benchmark",
		"--devices", "6", "--workers", "2", "--loops", "0", "--seed", "seq-test", "--machine-ids", "sequential", "--credentials", cred,
		"--out=", "--progress", "none"}, testEnv(nil, &stdout, &stderr, nil))
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	if n := srv.Metric("drover_registrations_total", map[string]string{"outcome": "new"}); n != 6 {
		t.Fatalf("server registered %v devices, want 6", n)
	}
	b, err := os.ReadFile(cred)
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var c struct {
			I         int    `json:"i"`
			MachineID string `json:"machine_id"`
		}
		if err := json.Unmarshal([]byte(line), &c); err != nil || c.MachineID != emulator.SequentialMachineID("seq-test", c.I) {
			t.Fatalf("credential %s: %v, want machine ID %s", line, err, emulator.SequentialMachineID("seq-test", c.I))
		}
		ids[c.MachineID] = true
	}
	if len(ids) != 6 {
		t.Fatalf("%d distinct machine IDs saved, want 6", len(ids))
	}
}

// One process: the summary printed comes from the values the run
// produced, and equals what `drover report` makes of the stream file.
func TestEmulateSummaryMatchesReport(t *testing.T) {
	srv := servertest.Start(t, servertest.Options{HTTP: true})
	out := filepath.Join(t.TempDir(), "r.jsonl")
	var stdout, stderr bytes.Buffer
	err := emulate(context.Background(), []string{"--target", srv.HTTPURL, "--secret", srv.EnrollmentSecret, "--mode", "benchmark",
		"--devices", "5", "--workers", "2", "--loops", "2", "--out", out, "--progress", "none"}, testEnv(nil, &stdout, &stderr, nil))
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	var rep bytes.Buffer
	if err := report_(context.Background(), []string{out}, testEnv(nil, &rep, io.Discard, nil)); err != nil {
		t.Fatal(err)
	}
	summary, _, _ := strings.Cut(stdout.String(), "\nresults: ")
	if summary != rep.String() || !strings.Contains(summary, "10") {
		t.Fatalf("emulate printed:\n%s\ndrover report printed:\n%s", summary, rep.String())
	}
}

func TestEmulateFlags(t *testing.T) {
	var out, errOut bytes.Buffer
	env := testEnv(nil, &out, &errOut, nil)
	if err := emulate(context.Background(), []string{"--help"}, env); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("--help: %v", err)
	}
	for _, f := range []string{"-target", "-mode", "-conn", "-shard", "-procs", "-source-addrs", "-template", "-credentials", "-ramp-max", "-late-after"} {
		if !strings.Contains(out.String(), f) {
			t.Errorf("--help does not show %s", f)
		}
	}
	for args, want := range map[string]string{
		"":                                                           "--target is required",
		"--target http://x --mode fast":                              "mode",
		"--target http://x --conn pooled":                            "conn",
		"--target http://x --machine-ids serial":                     "machine IDs",
		"--target http://x --shard 3/2":                              "shard",
		"--target http://x --source-addrs bogus":                     "source-addrs",
		"--target ftp://x":                                           "scheme",
		"--target http://x --procs 0":                                "procs",
		"--target http://x --template /nonexist":                     "template",
		"--target http://x --progress fancy":                         "progress",
		"--target http://x stray":                                    "unexpected argument",
		"--target http://x --mode ramp --ramp-max 5000 --devices 10": "ramp max",
	} {
		err := emulate(context.Background(), strings.Fields(args+" --out="), env)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", args, err, want)
		}
	}
	out.Reset()
	if err := emulate(context.Background(), []string{"--print-template"}, env); err != nil || !strings.Contains(out.String(), "{{rx_bytes}}") {
		t.Fatalf("--print-template: %v", err)
	}
}

func TestProgressLine(t *testing.T) {
	s := formatProgress(emulator.Progress{Phase: "push", Elapsed: 75 * time.Second, Remaining: 3725 * time.Second, PushRate: 1234.4,
		Push: results.Counts{Accepted: 10, Late: 2}, PushP99: 3 * time.Millisecond, Inflight: 4, CPU: 0.5, RSS: 10 << 20})
	for _, want := range []string{"[push] 01:15", "left 1:02:05", "1234 push/s", "ok 10", "late 2", "p99 3.00ms", "in flight 4", "10.0 MiB"} {
		if !strings.Contains(s, want) {
			t.Errorf("%q lacks %q", s, want)
		}
	}
	var buf bytes.Buffer
	p := newProgressPrinter(&buf, "log", time.Hour)
	p.show(emulator.Progress{Phase: "push"})
	p.show(emulator.Progress{Phase: "push"}) // within the period: not logged
	p.show(emulator.Progress{Phase: "done", Final: true})
	p.warn("careful")
	if n := strings.Count(buf.String(), "emulate: ["); n != 2 || !strings.Contains(buf.String(), "*** WARNING: careful ***") {
		t.Fatalf("log output:\n%s", buf.String())
	}
}
