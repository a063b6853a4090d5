package perf

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/drover/drover/internal/emulator"
)

const testWorkerToken = "worker-token-0123456789"

// startWorker runs a worker in this process (an HTTP test server) and
// returns its address.
func startWorker(t *testing.T) string {
	t.Helper()
	w, err := NewWorker(WorkerConfig{Token: testWorkerToken, WorkDir: t.TempDir(), Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(w)
	t.Cleanup(func() { srv.Close(); w.Close() })
	return strings.TrimPrefix(srv.URL, "http://")
}

// serverCounter reads a counter of a server's /metrics with the label
// outcome=outcome.
func serverCounter(t *testing.T, base, token, name, outcome string) int64 {
	t.Helper()
	// A server just started may answer 503 with Retry-After (a loaded
	// machine); a client retries then, as this one does for 10 s.
	var resp *http.Response
	for deadline := time.Now().Add(10 * time.Second); ; {
		req, _ := http.NewRequest("GET", base+"/metrics", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		var err error
		if resp, err = http.DefaultClient.Do(req); err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusServiceUnavailable || time.Now().After(deadline) {
			break
		}
		resp.Body.Close()
		time.Sleep(200 * time.Millisecond)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("%s/metrics: HTTP %d %s", base, resp.StatusCode, b)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if f := families[name]; f != nil {
		for _, m := range f.Metric {
			for _, l := range m.Label {
				if l.GetName() == "outcome" && l.GetValue() == outcome {
					return int64(sampleValue(m))
				}
			}
		}
	}
	return 0
}

// The fleet split over two in-process workers: the protocol's counts are
// the server's, each load machine ran its half, and the protocol names
// them.
func TestWorkersSplitOneTest(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts a server")
	}
	srv := startRunning(t, "")
	base := "http://" + srv.HTTPAddr()
	a, b := startWorker(t), startWorker(t)
	p, _ := Lookup("Bench-6-noSSL")
	o := testOptions(t, override{Devices: 300, Threads: 6})
	o.ServerCmd, o.URL, o.EnrollmentSecret, o.MetricsToken = nil, base, "perf-secret", "perf-metrics-token"
	o.Workers, o.WorkerToken, o.WorkerTimeout = []string{a, b}, testWorkerToken, 10*time.Second
	pushes := serverCounter(t, base, "perf-metrics-token", "drover_pushes_total", "accepted")
	regs := serverCounter(t, base, "perf-metrics-token", "drover_registrations_total", "new")
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	r, err := Run(ctx, p, o)
	if err != nil {
		t.Fatal(err)
	}
	checkSplit(t, r, 300, 10, []string{a, b},
		serverCounter(t, base, "perf-metrics-token", "drover_pushes_total", "accepted")-pushes,
		serverCounter(t, base, "perf-metrics-token", "drover_registrations_total", "new")-regs)
	md := markdownOf(r)
	if !strings.Contains(md, "## Load machines") || !strings.Contains(md, a) || !strings.Contains(md, b) {
		t.Errorf("the protocol does not name the load machines:\n%s", md)
	}
}

// checkSplit checks a benchmark run over load machines: every push of
// every loop accepted, the counts equal to the server's counters, and each
// machine named with its shard.
func checkSplit(t *testing.T, r *Result, devices, loops int, addrs []string, serverPushes, serverRegs int64) {
	t.Helper()
	part := r.Parts[0]
	if part.Push.Accepted != int64(devices*loops) || part.Register.Accepted != int64(devices) {
		t.Errorf("merged push %+v register %+v, want %d pushes and %d registrations", part.Push, part.Register, devices*loops, devices)
	}
	if part.Push.Accepted != serverPushes || part.Register.Accepted != serverRegs {
		t.Errorf("merged counts %d pushes, %d registrations; the server counted %d and %d", part.Push.Accepted, part.Register.Accepted, serverPushes, serverRegs)
	}
	ms := r.Env.LoadMachines
	t.Logf("merged: %d pushes, %d registrations accepted; the server: %d, %d; load machines %+v", part.Push.Accepted, part.Register.Accepted, serverPushes, serverRegs, ms)
	if len(ms) != len(addrs) {
		t.Fatalf("%d load machines in the protocol, want %d", len(ms), len(addrs))
	}
	total := 0
	for i, m := range ms {
		if m.Addr != addrs[i] || m.Shard == "" || m.Host == "" || m.Threads <= 0 || m.RAMMiB <= 0 || m.Started == "" {
			t.Errorf("load machine %d: %+v", i, m)
		}
		total += m.Devices
	}
	if total != devices {
		t.Errorf("the shards hold %d devices, want %d", total, devices)
	}
	if c := Compute(r); c.Verdict != passed {
		t.Errorf("verdict %s %v", c.Verdict, c.Reasons)
	}
}

// A load machine that stops sending fails the test with an error naming
// it, after the worker timeout: no hang.
func TestWorkerSilentFailsClearly(t *testing.T) {
	t.Parallel()
	good := startWorker(t)
	w, err := NewWorker(WorkerConfig{Token: testWorkerToken, WorkDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	hang := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, req *http.Request) {
		if req.URL.Path != "/v1/run" {
			w.ServeHTTP(rw, req)
			return
		}
		rw.WriteHeader(200)
		rw.(http.Flusher).Flush()
		<-req.Context().Done() // says nothing more
	}))
	defer hang.Close()
	hangAddr := strings.TrimPrefix(hang.URL, "http://")
	pool, err := newLoadPool(context.Background(), []string{good, hangAddr}, testWorkerToken, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	srv := startRunning(t, "")
	cfg := emulator.DefaultConfig()
	cfg.Target, cfg.EnrollmentSecret, cfg.Devices, cfg.Mode, cfg.Loops = "http://"+srv.HTTPAddr(), "perf-secret", 20, emulator.ModeBenchmark, 1
	start := time.Now()
	_, err = pool.run(context.Background(), cfg, nil, 0)
	if err == nil || !strings.Contains(err.Error(), hangAddr) || !strings.Contains(err.Error(), "sent nothing") {
		t.Errorf("a silent load machine: %v, want an error naming %s", err, hangAddr)
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("the failure took %s", d)
	}
	// A load machine that is not there fails at once.
	if _, err := newLoadPool(context.Background(), []string{"127.0.0.1:1"}, testWorkerToken, 2*time.Second); err == nil || !strings.Contains(err.Error(), "127.0.0.1:1") {
		t.Errorf("an absent load machine: %v", err)
	}
}

func TestWorkerRefusesWithoutToken(t *testing.T) {
	if _, err := NewWorker(WorkerConfig{}); err == nil {
		t.Fatal("a worker without a token started")
	}
	if _, err := NewWorker(WorkerConfig{Token: "short"}); err == nil {
		t.Fatal("a worker with a 5-character token started")
	}
	addr := startWorker(t)
	for _, tok := range []string{"", "wrong-token-0123456789"} {
		req, _ := http.NewRequest("GET", "http://"+addr+"/v1/info", nil)
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("token %q: HTTP %d, want 401", tok, resp.StatusCode)
		}
	}
	_, err := newLoadPool(context.Background(), []string{addr}, "wrong-token-0123456789", time.Second)
	if err == nil || !strings.Contains(err.Error(), "401") {
		t.Errorf("a coordinator with the wrong token: %v, want HTTP 401", err)
	}
}

// Interrupting the coordinator stops every load machine's shard early,
// and their summaries still come: the figures so far, merged.
func TestWorkersStopEarlyWithSummaries(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts a server")
	}
	srv := startRunning(t, "")
	pool, err := newLoadPool(context.Background(), []string{startWorker(t), startWorker(t)}, testWorkerToken, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	cfg := emulator.DefaultConfig()
	cfg.Target, cfg.EnrollmentSecret, cfg.Devices = "http://"+srv.HTTPAddr(), "perf-secret", 100
	cfg.Mode, cfg.Interval, cfg.Duration = emulator.ModeFleet, time.Second, time.Minute
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(6*time.Second, cancel)
	start := time.Now()
	sum, err := pool.run(ctx, cfg, nil, 0)
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("stopping took %s", d)
	}
	if sum == nil {
		t.Fatalf("no summary after an interrupt: %v", err)
	}
	if sum.Op("push").Accepted == 0 || len(pool.machines) != 2 || pool.machines[0].Started == "" || pool.machines[1].Started == "" {
		t.Errorf("after an interrupt: push %+v, machines %+v (err %v)", sum.Op("push").Counts, pool.machines, err)
	}
}
