package perf

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/internal/server"
)

// droverBin is the real drover, built once: the suite starts its
// `drover serve` as a separate process, as with the installed binary.
var droverBin string

func TestMain(m *testing.M) {
	flag.Parse()
	if !testing.Short() {
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
	if droverBin != "" {
		os.RemoveAll(filepath.Dir(droverBin))
	}
	os.Exit(code)
}

func testOptions(t *testing.T, o override) Options {
	return Options{ServerCmd: []string{droverBin, "serve"}, WorkDir: t.TempDir(),
		Override: o, Version: "test", Command: "go test", ProgressEvery: time.Hour}
}

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
}

func TestE2EStability(t *testing.T) {
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

func TestE2EPeakFullCycle(t *testing.T) {
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
	p, _ := Lookup("Rollout-10k")
	spec := *p.Rollout
	spec.ArtifactMiB, spec.LinkBps, spec.FailRate, spec.MaxDownloads = 1, 2<<20, 0.3, 10
	p.Rollout = &spec
	r, c := runE2EPreset(t, p, override{Devices: 30, LoopTime: 2})
	f := r.Parts[0].Rollout
	if f == nil || f.State != "done" || f.Counts["verified"] != 30 || len(f.Waves) != 3 || f.Downloads == nil ||
		f.Downloads.Completed != 30 || f.Downloads.Bytes < 30<<20 || f.Downloads.MaxActive > 10 || len(f.Timeline) == 0 {
		t.Fatalf("rollout figures %+v", f)
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
