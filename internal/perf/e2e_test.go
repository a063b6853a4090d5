package perf

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/internal/hostinfo"
	"github.com/drover/drover/internal/server"
)

// droverBin is the real drover, built once: the suite starts its
// `drover serve` as a separate process, as with the installed binary.
var droverBin string

func TestMain(m *testing.M) {
	flag.Parse()
	// The tests that start servers mostly wait (runs of a fixed length,
	// servers settling) and run in parallel: four at a time unless
	// -parallel says otherwise.
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == "test.parallel" })
	if !given {
		flag.Set("test.parallel", "4")
	}
	// scripts/test.sh builds drover once for every package.
	droverBin = os.Getenv("DROVER_TEST_BINARY")
	built := false
	if !testing.Short() && droverBin == "" {
		built = true
		dir, err := os.MkdirTemp("", "drover-perf-e2e")
		if err != nil {
			panic(err)
		}
		droverBin = filepath.Join(dir, "drover")
		build := exec.Command("go", "build", "-o", droverBin, "../../cmd/drover")
		build.Stderr = os.Stderr
		if err := build.Run(); err != nil {
			fmt.Fprintln(os.Stderr, "building drover:", err)
			os.Exit(1)
		}
	}
	code := m.Run()
	if built {
		os.RemoveAll(filepath.Dir(droverBin))
	}
	os.Exit(code)
}

func testOptions(t *testing.T, o override) Options {
	return Options{ServerCmd: []string{droverBin, "serve"}, WorkDir: t.TempDir(),
		Override: o, Version: "test", Command: "go test", ProgressEvery: time.Hour, settle: testSettle}
}

// testSettle is the servers' settle before the pre-test snapshot in these
// tests: nothing they check depends on its length.
const testSettle = 300 * time.Millisecond

func runE2E(t *testing.T, name string, o override) (*Result, Calc) {
	t.Helper()
	p, _ := Lookup(name)
	return runE2EPreset(t, p, o)
}

func runE2EPreset(t *testing.T, p Preset, o override) (*Result, Calc) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts servers")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	r, err := Run(ctx, p, testOptions(t, o))
	if err != nil {
		t.Fatal(err)
	}
	c := Compute(r)
	if c.Verdict != passed {
		t.Errorf("verdict %s: %v; push %+v; log %+v", c.Verdict, c.Reasons, r.Parts[0].Push, r.Parts[0].Log)
	}
	for _, part := range r.Parts {
		if part.Before.RSSMiB <= 0 || part.After.RSSMiB <= 0 || !part.LogReviewed || part.Log.Lines == 0 || len(part.Series) == 0 {
			t.Errorf("part %d: RSS %.1f → %.1f, log %+v, %d points", part.HandlerThreads, part.Before.RSSMiB, part.After.RSSMiB, part.Log, len(part.Series))
		}
	}
	// The reports render from the measured result.
	dir := t.TempDir()
	if _, err := WriteReports(r, dir); err != nil {
		t.Fatal(err)
	}
	back, err := LoadResult(dir + "/" + r.FileBase() + ".json")
	if err != nil || markdownOf(back) != markdownOf(r) {
		t.Errorf("round trip: %v", err)
	}
	if !strings.Contains(markdownOf(r), "(scaled down: ") {
		t.Error("a scaled run's title must say so")
	}
	return r, c
}

func TestE2EBenchmark(t *testing.T) {
	t.Parallel()
	r, c := runE2E(t, "Bench-6-SSL", override{Devices: 60, Handlers: []int{1, 2}})
	if len(r.Parts) != 2 || r.Parts[0].HandlerThreads != 1 || r.Parts[1].HandlerThreads != 2 {
		t.Fatalf("parts %+v", r.Parts)
	}
	for _, part := range r.Parts {
		if part.Push.Accepted != 600 || part.Register.Accepted != 60 || part.Push.ElapsedSec <= 0 {
			t.Errorf("handlers %d: push %+v register %+v", part.HandlerThreads, part.Push, part.Register)
		}
	}
	if len(c.Rows) != 2 || c.Rows[0].PushesPerSec <= 0 || c.Safe080 <= 0 || c.Safe080 != recommendedMax(idealMaxDevices(c.Lowest, 200), 80) {
		t.Errorf("rows %+v, safe %d", c.Rows, c.Safe080)
	}
	if !r.Setup.TLS || !r.Setup.Local || r.Env.Threads < 1 {
		t.Errorf("setup %+v env %+v", r.Setup, r.Env)
	}
	if r.Env.CPUProbeStartUS <= 0 || r.Env.CPUProbeEndUS <= 0 {
		t.Errorf("CPU probe %v / %v µs, want both measured", r.Env.CPUProbeStartUS, r.Env.CPUProbeEndUS)
	}
	if md := markdownOf(r); !strings.Contains(md, "| CPU probe: µs per JSON round trip") {
		t.Errorf("the protocol has no CPU probe row:\n%s", md)
	}
}

func TestE2EStability(t *testing.T) {
	t.Parallel()
	r, c := runE2E(t, "Stab-2-2", override{Devices: 100, Duration: 8 * time.Second, LoopTime: 2})
	// 100 devices every 2 s for 8 s: 4 loops, 400 pushes (a few may be cut
	// off by the end of the run).
	if c.Performed < 300 || c.Performed > 400 || c.EstPushes != 400 {
		t.Errorf("performed %d, estimated %.0f", c.Performed, c.EstPushes)
	}
	if c.ProcessedLoops < 3 || c.RealLoopTime < 1.9 || c.RealLoopTime > 3 {
		t.Errorf("loops %.2f, real loop time %.2f", c.ProcessedLoops, c.RealLoopTime)
	}
	if c.RAMUtilPct <= 0 || c.MaxSafe <= 0 || c.RAMGrade == "" || len(r.Parts[0].Samples) < 5 {
		t.Errorf("RAM %.2f %%, max safe %d, grade %q, %d samples", c.RAMUtilPct, c.MaxSafe, c.RAMGrade, len(r.Parts[0].Samples))
	}
}

// The fleet test over TLS: each device's first push of the test is a full
// handshake, each later one resumes that device's session; the server's
// CPU per push is measured for both. (Its verdict is not judged here: a
// test machine's CPU per push and RSS projection say nothing.)
func TestE2EFleetTLS(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts a server")
	}
	p, _ := Lookup(fleetTLSPreset)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	r, err := Run(ctx, p, testOptions(t, override{Devices: 100, Duration: 12 * time.Second, LoopTime: 4}))
	if err != nil {
		t.Fatal(err)
	}
	part := r.Parts[0]
	if !r.Setup.TLS || r.Setup.Conn != "resume" || r.Setup.TLSMaxVersion != "1.3" || r.Setup.TLSKeyExchange != "classic" {
		t.Errorf("setup %+v", r.Setup)
	}
	cn := part.Conns
	if cn == nil || cn.TLSFull != 100 || cn.TLSResumed < 100 || cn.TLSResumeFailed != 0 || cn.TLSErrors != 0 {
		t.Fatalf("handshakes %+v, want 100 full (one per device) and the rest resumed", cn)
	}
	if part.Push.Accepted != cn.TLSFull+cn.TLSResumed {
		t.Errorf("%d pushes accepted, %d handshakes", part.Push.Accepted, cn.TLSFull+cn.TLSResumed)
	}
	c := Compute(r)
	if c.CPUPerPushFirstUS <= 0 || c.CPUPerPushLaterUS <= 0 || len(c.Checks) != 6 {
		t.Errorf("CPU per push: first loop %g µs, later %g µs; checks %+v", c.CPUPerPushFirstUS, c.CPUPerPushLaterUS, c.Checks)
	}
}

func TestE2EPeakFullCycle(t *testing.T) {
	t.Parallel()
	r, _ := runE2E(t, "PeakF-64-max", override{Devices: 100, Threads: 8, Duration: 7 * time.Second})
	part := r.Parts[0]
	if part.ConfigChanges < 1 || part.Push.ConfigsSeen < 100 || part.Register.Accepted != 100 {
		t.Errorf("config changes %d, configs seen %d, registered %d", part.ConfigChanges, part.Push.ConfigsSeen, part.Register.Accepted)
	}
	// The last change came a third of the test before its end: the fleet
	// acknowledged it since.
	if part.SyncStates["synchronized"] < 90 {
		t.Errorf("devices by sync state at the end: %v; want the fleet synchronized", part.SyncStates)
	}
}

func TestE2EPeakDataAgainstRunningServer(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts a server")
	}
	// A server this test runs in-process, given to perf by URL: samples come
	// from its /metrics.
	srv := startRunning(t, "")

	p, _ := Lookup("PeakD-64-max")
	o := testOptions(t, override{Devices: 100, Threads: 4, Duration: 4 * time.Second})
	o.ServerCmd, o.URL, o.EnrollmentSecret, o.MetricsToken = nil, "http://"+srv.HTTPAddr(), "perf-secret", "perf-metrics-token"
	rctx, rcancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer rcancel()
	r, err := Run(rctx, p, o)
	if err != nil {
		t.Fatal(err)
	}
	part := r.Parts[0]
	if part.Push.Accepted < 100 || part.Register.Accepted != 0 || part.Before.RSSMiB <= 0 || part.After.CPUSecs <= part.Before.CPUSecs || part.Before.Machine {
		t.Errorf("push %+v register %+v before %+v after %+v", part.Push, part.Register, part.Before, part.After)
	}
	if part.LogReviewed || r.Setup.Local || r.Setup.TLS {
		t.Errorf("remote setup %+v, log reviewed %v", r.Setup, part.LogReviewed)
	}
	if c := Compute(r); c.Verdict != passed {
		t.Errorf("verdict %s %v", c.Verdict, c.Reasons)
	}
}

// startRunning starts an in-process server on plain HTTP (secret
// "perf-secret", admin token "perf-admin", metrics token
// "perf-metrics-token") and stops it when the test ends.
func startRunning(t *testing.T, metricsListen string) *server.Server {
	cfg := server.DefaultConfig()
	cfg.DataDir, cfg.Listen, cfg.HTTPListen, cfg.MetricsListen = t.TempDir(), "", "127.0.0.1:0", metricsListen
	cfg.EnrollmentSecret, cfg.AdminToken, cfg.MetricsToken = "perf-secret", "perf-admin", "perf-metrics-token"
	// A server measured by URL runs without per-device quotas, as the
	// servers perf starts do (docs/perf.md).
	cfg.QuotaPushRate, cfg.QuotaHistorySamples, cfg.QuotaHistoryBytes = 0, 0, 0
	ctx, cancel := context.WithCancel(context.Background())
	srv, err := server.New(ctx, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return srv
}

// A running server's /metrics needs a credential on its device port; perf
// sends the metrics or admin token, or reads the separate listener.
func TestRemoteMetricsAccess(t *testing.T) {
	srv := startRunning(t, "127.0.0.1:0")

	p, _ := Lookup("PeakD-64-max")
	base := Options{URL: "http://" + srv.HTTPAddr(), EnrollmentSecret: "perf-secret"}
	cases := []struct {
		name    string
		set     func(*Options)
		wantErr string
	}{
		{"no credential", func(*Options) {}, "--metrics-token"},
		{"wrong token", func(o *Options) { o.MetricsToken = "perf-metrics-tokenX" }, "HTTP 401"},
		{"metrics token", func(o *Options) { o.MetricsToken = "perf-metrics-token" }, ""},
		{"admin token", func(o *Options) { o.AdminToken = "perf-admin" }, ""},
		{"separate listener", func(o *Options) { o.MetricsURL = "http://" + srv.MetricsAddr() }, ""},
	}
	for _, tc := range cases {
		o := base
		tc.set(&o)
		tg, err := openTarget(context.Background(), p, 0, o)
		if tc.wantErr == "" {
			if err != nil {
				t.Errorf("%s: %v", tc.name, err)
				continue
			}
			s, err := tg.snapshot()
			tg.close()
			if err != nil || s.RSSMiB <= 0 {
				t.Errorf("%s: snapshot %+v, %v", tc.name, s, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("%s: error %v, want one naming %q", tc.name, err, tc.wantErr)
			if err == nil {
				tg.close()
			}
		}
	}
}

// The rollout test, shrunk: 30 devices take a 1 MiB artifact over 2 MiB/s
// links that drop 30 % of the attempts; every device is verified, the
// waves and bytes served are measured and the server's RSS judged.
func TestE2ERollout(t *testing.T) {
	t.Parallel()
	p, _ := Lookup("Rollout-10k")
	spec := *p.Rollout
	spec.ArtifactMiB, spec.LinkBps, spec.FailRate, spec.MaxDownloads = 1, 2<<20, 0.3, 10
	p.Rollout = &spec
	r, c := runE2EPreset(t, p, override{Devices: 30, LoopTime: 2})
	f := r.Parts[0].Rollout
	if f == nil || f.State != "done" || f.Counts["verified"] != 30 || len(f.Waves) != 3 || f.Downloads == nil ||
		f.Downloads.Completed != 30 || f.Downloads.Bytes < 30<<20 || f.Downloads.MaxActive > 10 || len(f.Timeline) == 0 {
		var dl any
		if f != nil && f.Downloads != nil {
			dl = *f.Downloads
		}
		t.Fatalf("rollout figures %+v; downloads %+v", f, dl)
	}
	if len(c.Checks) != 5 || f.RSSMaxMiB <= 0 {
		t.Fatalf("checks %+v", c.Checks)
	}
	for _, want := range []string{"## Rollout test criteria", "| 3 |", "Firmware bytes served"} {
		if !strings.Contains(markdownOf(r)+htmlProtocol(r), want) {
			t.Errorf("protocol lacks %q", want)
		}
	}
	// A server that copied files through memory fails the RSS criterion.
	f.RSSMaxMiB = r.Parts[0].Before.RSSMiB + float64(spec.ArtifactMiB*spec.MaxDownloads) + rolloutRSSBase + 10*rolloutRSSPerDownload + 1
	if c := Compute(r); c.Verdict != Failed {
		t.Errorf("RSS growth of %.0f MiB passed", f.RSSMaxMiB-r.Parts[0].Before.RSSMiB)
	}
}

// With --admin-token, a running server's machine comes from its GET
// /api/v1/server: its CPUs, memory, cgroup limits, versions and store,
// and the machine's memory in every snapshot; the load machine is only
// where the emulator ran.
func TestRemoteServerDescribed(t *testing.T) {
	t.Parallel()
	srv := startRunning(t, "")
	p, _ := Lookup("Stab-2-2")
	o := testOptions(t, override{Devices: 20, Threads: 2, Duration: 3 * time.Second, LoopTime: 1})
	o.ServerCmd, o.URL, o.EnrollmentSecret, o.AdminToken = nil, "http://"+srv.HTTPAddr(), "perf-secret", "perf-admin"
	o.EnvLabel = "R1"
	rctx, rcancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer rcancel()
	r, err := Run(rctx, p, o)
	if err != nil {
		t.Fatal(err)
	}
	part := r.Parts[0]
	if r.Env.Source != "the server's GET /api/v1/server" || r.Env.Label != "R1" || !strings.Contains(r.Env.Emulator, "load machine") {
		t.Errorf("environment %+v", r.Env)
	}
	if r.Setup.Backend != "sqlite" || r.Setup.Persistence != "write-through" {
		t.Errorf("setup %+v", r.Setup)
	}
	if !part.Before.Machine || !part.After.Machine || part.After.UsedMiB <= 0 || part.After.RSSMiB <= 0 || part.After.CPUSecs <= part.Before.CPUSecs {
		t.Errorf("snapshots before %+v after %+v", part.Before, part.After)
	}
	if c := Compute(r); c.RAMUtilPct <= 0 || c.MaxSafe <= 0 {
		t.Errorf("RAM utilisation %v, max safe %v: want them measured", c.RAMUtilPct, c.MaxSafe)
	}

	// A server on another machine: its threads and its cgroup's quota,
	// not this machine's, divide its CPU time.
	far := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer adm" {
			w.WriteHeader(401)
			return
		}
		io.WriteString(w, `{"host":"far","cpu_model":"Big","cores":16,"threads":32,"memory_bytes":68719476736,"memory_used_bytes":1073741824,
			"cgroup":{"version":2,"path":"/drover","cpus":4,"memory_max_bytes":8589934592,"memory_current_bytes":2147483648},
			"go_version":"go1.99","drover_version":"v9","backend":"postgres","persistence":"write-back","gomaxprocs":4,"rss_bytes":104857600,"cpu_seconds":12}`)
	}))
	defer far.Close()
	tg := &target{url: far.URL, admin: "adm", client: far.Client()}
	res := &Result{Env: readEnvironment("local")}
	tg.describe(res)
	e := res.Env
	if e.Host != "far" || e.Threads != 32 || e.cpus() != 4 || e.ram() != 8192 || e.DroverVersion != "v9" || res.Setup.Backend != "postgres" {
		t.Errorf("far environment %+v setup %+v", e, res.Setup)
	}
	s, err := tg.snapshot()
	if err != nil || !s.Machine || s.UsedMiB != 2048 || s.AvailMiB != 6144 || s.RSSMiB != 100 || s.CPUSecs != 12 {
		t.Errorf("far snapshot %+v %v", s, err)
	}
}

// --cpus and --memory: the started server runs in a cgroup of its own,
// and the protocol's limits, CPU share and memory are the cgroup's.
func TestE2ELimitedServer(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts a server")
	}
	if lim, err := hostinfo.NewLimits(fmt.Sprintf("drover-perf-probe-%d", os.Getpid()), 1, 256<<20); err != nil {
		t.Skipf("cannot limit a server here (needs root or a delegated cgroup v2 subtree with cpu and memory, or the v1 cpu and memory hierarchies): %v", err)
	} else {
		lim.Remove()
	}
	p, _ := Lookup("Stab-2-2")
	o := testOptions(t, override{Devices: 20, Threads: 2, Duration: 3 * time.Second, LoopTime: 1})
	o.CPUs, o.MemoryBytes, o.EnvLabel = 0.5, 384<<20, "C0.5"
	rctx, rcancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer rcancel()
	r, err := Run(rctx, p, o)
	if err != nil {
		t.Fatal(err)
	}
	e := r.Env
	if e.CPULimit != 0.5 || e.MemLimitMiB != 384 || e.cpus() != 0.5 || e.ram() != 384 || !strings.Contains(e.Cgroup, "0.5 CPU, 384 MiB") {
		t.Errorf("environment %+v", e)
	}
	part := r.Parts[0]
	if !part.After.Machine || part.After.UsedMiB <= 0 || part.After.UsedMiB+part.After.AvailMiB > 384.5 {
		t.Errorf("memory is not the cgroup's: %+v", part.After)
	}
	c := Compute(r)
	if c.RAMUtilPct <= 0 || c.RAMUtilPct > 100 {
		t.Errorf("RAM utilisation %v %% of the limit", c.RAMUtilPct)
	}
	md := markdownOf(r)
	for _, want := range []string{"| environment | C0.5 |", "server CPU limit (cgroup), CPUs | 0.50", "server memory limit (cgroup), MiB | 384"} {
		if !strings.Contains(md, want) {
			t.Errorf("protocol lacks %q", want)
		}
	}
	if left, _ := filepath.Glob("/sys/fs/cgroup/*/drover-perf-*"); len(left) > 0 {
		t.Errorf("cgroups left behind: %v", left)
	}
}
