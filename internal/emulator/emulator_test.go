package emulator

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/drover/drover/internal/emulator/results"
)

func TestBenchmarkCountsEveryOutcome(t *testing.T) {
	f := newFake(t, false)
	sum, st := run(t, f.cfg(ModeBenchmark, 20))
	push, reg := sum.Op(results.OpPush), sum.Op(results.OpRegister)
	if push.Accepted != 60 || push.Errors() != 0 || f.accepted.Load() != 60 {
		t.Fatalf("pushes accepted %d (server %d), errors %d", push.Accepted, f.accepted.Load(), push.Errors())
	}
	if reg.Accepted != 20 || reg.New != 20 || f.registeredNew.Load() != 20 {
		t.Fatalf("registrations %d new %d (server %d)", reg.Accepted, reg.New, f.registeredNew.Load())
	}
	if push.Latency.Count() != 60 || reg.Latency.Count() != 20 {
		t.Fatalf("latencies %d, %d", push.Latency.Count(), reg.Latency.Count())
	}
	// Keep-alive: one connection per worker.
	if sum.Conns.Dials != 4 || sum.Conns.Requests != 80 || sum.Conns.ReusedConns != 76 {
		t.Fatalf("conns %+v", sum.Conns)
	}
	// The stream: start, intervals that add up to the summary, summary.
	if len(st.Starts) != 1 || len(st.Summaries) != 1 || len(st.Intervals) == 0 {
		t.Fatalf("records: %d starts, %d intervals, %d summaries", len(st.Starts), len(st.Intervals), len(st.Summaries))
	}
	var acc, lat int64
	for _, iv := range st.Intervals {
		if op := iv.Ops[results.OpPush]; op != nil {
			acc += op.Accepted
			lat += op.Latency.Count()
		}
	}
	if acc != 60 || lat != 60 {
		t.Fatalf("intervals add up to %d accepted, %d latencies", acc, lat)
	}
	if sum.Resources.RSSMax == 0 || sum.Resources.CPUSeconds <= 0 {
		t.Fatalf("resources %+v", sum.Resources)
	}
}

func TestConnectionModes(t *testing.T) {
	f := newFake(t, true)
	cfg := f.cfg(ModeBenchmark, 10)
	cfg.Loops = 2
	cfg.Conn = ConnNew
	sum, _ := run(t, cfg)
	if c := sum.Conns; c.Dials != 30 || c.TLSFull != 30 || c.TLSResumed != 0 || c.ReusedConns != 0 {
		t.Fatalf("new: %+v", c)
	}
	cfg.Conn = ConnResume
	cfg.Seed = "resume"
	sum, _ = run(t, cfg)
	if c := sum.Conns; c.Dials != 30 || c.TLSResumed < 20 || c.TLSFull+c.TLSResumed != 30 {
		t.Fatalf("resume: %+v", c)
	}
	cfg.Conn = ConnKeepAlive
	cfg.Seed = "keepalive"
	sum, _ = run(t, cfg)
	if c := sum.Conns; c.Dials != 4 || c.TLSFull != 4 {
		t.Fatalf("keepalive: %+v", c)
	}
	if f.accepted.Load() != 60 {
		t.Fatalf("server accepted %d", f.accepted.Load())
	}
	cfg.CACertPEM = nil // not trusted now
	cfg.Seed = "untrusted"
	sum, _ = run(t, cfg)
	// The storm fails, then every push tries to register first, as an agent would.
	if reg, push := sum.Op(results.OpRegister), sum.Op(results.OpPush); reg.Dropped[DropTLS] != 30 || push.Unregistered != 20 || !hasWarning(sum, "TLS") {
		t.Fatalf("untrusted certificate: %+v, %+v, warnings %q", reg.Counts, push.Counts, sum.Warnings)
	}
}

func TestRetryAfterIsHonoured(t *testing.T) {
	f := newFake(t, false)
	f.onPush = func(w http.ResponseWriter, machine string, call int) bool {
		if call == 1 {
			w.Header().Set("Retry-After", "1")
			fail(w, 503, "overloaded")
			return true
		}
		return false
	}
	cfg := f.cfg(ModeBenchmark, 3)
	cfg.Loops = 1
	sum, _ := run(t, cfg)
	push := sum.Op(results.OpPush)
	if push.Accepted != 3 || push.Retried != 3 || push.RejectedTotal() != 0 || push.RetryAfter["1"] != 3 || len(push.RetryAfter) != 1 {
		t.Fatalf("%+v", push.Counts)
	}
	for m, times := range f.pushTimes {
		if len(times) != 2 {
			t.Fatalf("%s: %d attempts", m, len(times))
		}
		if gap := times[1].Sub(times[0]); gap < time.Second || gap > 2*time.Second {
			t.Fatalf("%s retried after %v, want 1..1.5 s (Retry-After 1 plus jitter)", m, gap)
		}
	}
	if lat := push.Latency.Quantile(0.5); lat < time.Second {
		t.Fatalf("latency %v should include the retry wait", lat)
	}
}

func TestRetriesRunOut(t *testing.T) {
	t.Parallel()
	f := newFake(t, false)
	f.onPush = func(w http.ResponseWriter, machine string, call int) bool {
		w.Header().Set("Retry-After", "0")
		fail(w, 503, "unavailable")
		return true
	}
	cfg := f.cfg(ModeBenchmark, 2)
	cfg.Loops, cfg.MaxRetries = 1, 1
	sum, _ := run(t, cfg)
	push := sum.Op(results.OpPush)
	// Every 503 is counted by its Retry-After, the last ones (not retried) too.
	if push.Rejected["503"] != 2 || push.Retried != 2 || push.Accepted != 0 || push.RetryAfter["0"] != 4 || !hasWarning(sum, "no push was accepted") {
		t.Fatalf("%+v %q", push.Counts, sum.Warnings)
	}
}

func TestUnauthorizedRegistersAgain(t *testing.T) {
	f := newFake(t, false)
	f.onPush = func(w http.ResponseWriter, machine string, call int) bool {
		if call == 2 { // the server lost the device: forget all its tokens
			f.mu.Lock()
			for tok, m := range f.tokens {
				if m == machine {
					delete(f.tokens, tok)
				}
			}
			f.mu.Unlock()
			fail(w, 401, "unauthorized")
			return true
		}
		return false
	}
	cfg := f.cfg(ModeBenchmark, 5)
	sum, _ := run(t, cfg)
	push, reg := sum.Op(results.OpPush), sum.Op(results.OpRegister)
	if push.Accepted != 15 || push.Reregistered != 5 || push.Errors() != 0 {
		t.Fatalf("push %+v", push.Counts)
	}
	if reg.Accepted != 10 || reg.New != 5 || f.renewed.Load() != 5 {
		t.Fatalf("register %+v, server renewed %d", reg.Counts, f.renewed.Load())
	}
}

func TestWrongSecret(t *testing.T) {
	f := newFake(t, false)
	cfg := f.cfg(ModeBenchmark, 4)
	cfg.EnrollmentSecret = "wrong"
	cfg.Loops = 2
	sum, _ := run(t, cfg)
	push, reg := sum.Op(results.OpPush), sum.Op(results.OpRegister)
	// The storm fails; each push then tries to register again, as an agent would.
	if reg.Rejected["403"] != 12 || push.Unregistered != 8 || push.Done() != 0 {
		t.Fatalf("register %+v push %+v", reg.Counts, push.Counts)
	}
	if !hasWarning(sum, "enrollment secret") {
		t.Fatalf("warnings %q", sum.Warnings)
	}
}

// Seed 000: their emulator never re-registered after a failed registration.
func TestFleetRegistersAgainAfterFailure(t *testing.T) {
	t.Parallel()
	f := newFake(t, false)
	f.onRegister = func(w http.ResponseWriter, machine string, call int) bool {
		if call == 1 {
			fail(w, 500, "internal")
			return true
		}
		return false
	}
	cfg := f.cfg(ModeFleet, 10)
	cfg.Duration = 2500 * time.Millisecond
	sum, _ := run(t, cfg)
	push, reg := sum.Op(results.OpPush), sum.Op(results.OpRegister)
	if reg.Rejected["500"] != 10 || reg.Accepted != 10 {
		t.Fatalf("register %+v", reg.Counts)
	}
	if push.Unregistered != 10 || push.Accepted < 10 {
		t.Fatalf("push %+v", push.Counts)
	}
}

func TestConfigIsApplied(t *testing.T) {
	f := newFake(t, false)
	f.config = 5
	cfg := f.cfg(ModeBenchmark, 3)
	sum, _ := run(t, cfg)
	if push := sum.Op(results.OpPush); push.ConfigsSeen != 3 || push.Accepted != 9 {
		t.Fatalf("%+v", push.Counts)
	}
	for m, v := range f.cfgSeen {
		if v != 5 {
			t.Fatalf("%s reports config_version %d, want 5", m, v)
		}
	}
}

func TestDropsAreClassified(t *testing.T) {
	f := newFake(t, false)
	f.onPush = func(w http.ResponseWriter, machine string, call int) bool {
		switch call {
		case 1: // connection closed without an answer
			c, _, _ := w.(http.Hijacker).Hijack()
			c.Close()
			return true
		case 3: // too slow: past the 300 ms timeout under test
			time.Sleep(700 * time.Millisecond)
		}
		return false
	}
	cfg := f.cfg(ModeBenchmark, 2)
	cfg.Timeout = 300 * time.Millisecond
	cfg.Workers = 2
	cfg.Conn = ConnNew
	sum, _ := run(t, cfg)
	push := sum.Op(results.OpPush)
	if push.Dropped[DropEOF] != 2 || push.Dropped[DropTimeout] != 2 || push.Accepted != 2 {
		t.Fatalf("%+v", push.Counts)
	}
	if push.Latency.Count() != 2 {
		t.Fatalf("dropped operations must have no latency: %d", push.Latency.Count())
	}
}

func TestClosedKeepAliveIsResent(t *testing.T) {
	f := newFake(t, false)
	f.onPush = func(w http.ResponseWriter, machine string, call int) bool {
		// Answer, then close the connection without saying so: the next
		// request on it finds it closed.
		c, buf, _ := w.(http.Hijacker).Hijack()
		buf.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 20\r\n\r\n{\"push_interval\":20}")
		buf.Flush()
		f.accepted.Add(1)
		time.AfterFunc(20*time.Millisecond, func() { c.Close() })
		return true
	}
	cfg := f.cfg(ModeBenchmark, 1)
	cfg.Workers = 1
	sum, _ := run(t, cfg)
	push := sum.Op(results.OpPush)
	if push.Accepted != 3 || push.Errors() != 0 || push.Resent == 0 || f.accepted.Load() != 3 {
		t.Fatalf("%+v, server accepted %d", push.Counts, f.accepted.Load())
	}
}

func TestFleetSchedule(t *testing.T) {
	f := newFake(t, false)
	cfg := f.cfg(ModeFleet, 40)
	cfg.Duration = 3 * time.Second
	sum, st := run(t, cfg)
	push, reg := sum.Op(results.OpPush), sum.Op(results.OpRegister)
	// Every device is due at its phase (< 1 s) and then every second: 3 pushes.
	if push.Accepted != 120 || reg.Accepted != 40 {
		t.Fatalf("push %+v reg %+v", push.Counts, reg.Counts)
	}
	for m, times := range f.pushTimes {
		for i := 1; i < len(times); i++ {
			if gap := times[i].Sub(times[i-1]); gap < 700*time.Millisecond || gap > 1300*time.Millisecond {
				t.Fatalf("%s: pushes %v apart, want about 1 s", m, gap)
			}
		}
	}
	if sum.SendLag.Count() != 80 { // first pushes register first and have no schedule lag
		t.Fatalf("send lag count %d", sum.SendLag.Count())
	}
	if st.Starts[0].Interval != 1 || st.Starts[0].Conn != "new" || sum.Conns.Dials != 160 {
		t.Fatalf("start %+v conns %+v", st.Starts[0], sum.Conns)
	}
}

func TestFleetCountsLateSends(t *testing.T) {
	f := newFake(t, false)
	f.delay = 150 * time.Millisecond
	cfg := f.cfg(ModeFleet, 8)
	cfg.Duration = 1500 * time.Millisecond
	cfg.MaxInflight = 1
	cfg.Conn = ConnKeepAlive
	sum, _ := run(t, cfg)
	push := sum.Op(results.OpPush)
	if push.Late == 0 || !hasWarning(sum, "max-inflight") {
		t.Fatalf("late %d, warnings %q", push.Late, sum.Warnings)
	}
	if sum.SendLag.Max() < 300*time.Millisecond {
		t.Fatalf("send lag max %v", sum.SendLag.Max())
	}
	// Open loop: latency counts from the intended time, so the queueing shows.
	if push.Latency.Max() < sum.SendLag.Max() {
		t.Fatalf("latency max %v below send lag max %v", push.Latency.Max(), sum.SendLag.Max())
	}
}

func TestRampFindsBreakingPoint(t *testing.T) {
	f := newFake(t, false)
	var mu sync.Mutex
	busy := 0
	f.onPush = func(w http.ResponseWriter, machine string, call int) bool {
		mu.Lock()
		busy++
		n := busy
		mu.Unlock()
		defer func() { mu.Lock(); busy--; mu.Unlock() }()
		if n > 6 {
			w.Header().Set("Retry-After", "1")
			fail(w, 503, "overloaded")
			return true
		}
		time.Sleep(5 * time.Millisecond) // the work that keeps the server busy
		return false
	}
	cfg := f.cfg(ModeRamp, 64)
	cfg.RampStart, cfg.RampFactor, cfg.RampStepDuration, cfg.RampMax = 2, 2, time.Second, 32
	cfg.Workers = 8
	sum, st := run(t, cfg)
	r := sum.Ramp
	if r == nil || r.BreakingConcurrency != 8 || r.BestConcurrency != 4 || r.BestRate <= 0 {
		t.Fatalf("ramp %+v", r)
	}
	if len(st.Steps) != 3 || st.Steps[0].Concurrency != 2 || !st.Steps[2].Broke || st.Steps[1].Broke {
		t.Fatalf("steps %+v", st.Steps)
	}
}

func TestRampWithoutBreakingPoint(t *testing.T) {
	f := newFake(t, false)
	cfg := f.cfg(ModeRamp, 8)
	cfg.RampStart, cfg.RampFactor, cfg.RampStepDuration, cfg.RampMax = 2, 4, time.Second, 8
	sum, st := run(t, cfg)
	if r := sum.Ramp; r == nil || r.BreakingConcurrency != 0 || !strings.Contains(r.Reason, "no breaking point") || r.BestConcurrency == 0 {
		t.Fatalf("ramp %+v", r)
	}
	if len(st.Steps) != 2 {
		t.Fatalf("%d steps", len(st.Steps))
	}
}

func TestCredentialsAreSavedAndReused(t *testing.T) {
	f := newFake(t, false)
	dir := t.TempDir()
	creds := filepath.Join(dir, "creds.jsonl")
	cfg := f.cfg(ModeBenchmark, 10)
	cfg.Loops = 1
	cfg.CredentialsFile = creds
	for k := 1; k <= 2; k++ { // two shards write their own files
		cfg.Shard = Shard{k, 2}
		run(t, cfg)
	}
	if _, err := os.Stat(creds + ".1-of-2"); err != nil {
		t.Fatal(err)
	}
	cfg.Shard = Shard{}
	sum, _ := run(t, cfg)
	if reg := sum.Op(results.OpRegister); reg.Done() != 0 {
		t.Fatalf("registered again: %+v", reg.Counts)
	}
	if push := sum.Op(results.OpPush); push.Accepted != 10 {
		t.Fatalf("push %+v", push.Counts)
	}
	if f.registeredNew.Load() != 10 {
		t.Fatalf("server registered %d", f.registeredNew.Load())
	}
	// A different seed is a different fleet: nothing to reuse.
	cfg.Seed = "other"
	sum, _ = run(t, cfg)
	if reg := sum.Op(results.OpRegister); reg.New != 10 {
		t.Fatalf("other seed: %+v", reg.Counts)
	}
}

func TestSourceAddresses(t *testing.T) {
	f := newFake(t, false)
	cfg := f.cfg(ModeBenchmark, 8)
	cfg.Conn = ConnNew
	cfg.Loops = 1
	cfg.SourceAddrs = []net.IP{net.ParseIP("127.0.0.2"), net.ParseIP("127.0.0.3")}
	run(t, cfg)
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.remotes["127.0.0.2"] != 8 || f.remotes["127.0.0.3"] != 8 || len(f.remotes) != 2 {
		t.Fatalf("remotes %v", f.remotes)
	}
}

func TestShardsMergeToTheWholeFleet(t *testing.T) {
	f := newFake(t, false)
	var all bytes.Buffer
	var mu sync.Mutex
	var wg sync.WaitGroup
	for k := 1; k <= 3; k++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cfg := f.cfg(ModeBenchmark, 31)
			cfg.Shard, cfg.RunID = Shard{k, 3}, "r"
			var buf bytes.Buffer
			if _, err := Run(context.Background(), cfg, &buf); err != nil {
				t.Error(err)
			}
			mu.Lock()
			all.Write(buf.Bytes())
			mu.Unlock()
		}()
	}
	wg.Wait()
	var st results.Stream
	if err := st.Read(&all); err != nil {
		t.Fatal(err)
	}
	m, err := st.Merge()
	if err != nil {
		t.Fatal(err)
	}
	push := m.Summary.Op(results.OpPush)
	if push.Accepted != 93 || push.Latency.Count() != 93 || f.accepted.Load() != 93 || len(f.ids) != 31 {
		t.Fatalf("merged %d (%d latencies), server %d, devices %d", push.Accepted, push.Latency.Count(), f.accepted.Load(), len(f.ids))
	}
}

// At a benchmark's time limit, cut-off dials are aborted, not dropped, and
// what the server accepted is what the emulator counted.
func TestDurationLimitEndsCleanly(t *testing.T) {
	f := newFake(t, false)
	cfg := f.cfg(ModeBenchmark, 20)
	cfg.Conn, cfg.Loops, cfg.Duration = ConnNew, 1000000, 700*time.Millisecond
	sum, _ := run(t, cfg)
	push := sum.Op(results.OpPush)
	if push.DroppedTotal() != 0 || push.Accepted == 0 || push.Accepted != f.accepted.Load() {
		t.Fatalf("%+v, server accepted %d", push.Counts, f.accepted.Load())
	}
}
