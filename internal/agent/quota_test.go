package agent

import (
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/drover/drover/internal/protocol"
)

// A push over the device's quota gets 429 with Retry-After: the Go agent
// waits that long (plus its spread), then pushes on its interval.
func TestAgentHonours429RetryAfter(t *testing.T) {
	f := newFakeServer(t)
	f.onPush = func(n int, _ protocol.PushRequest) *answer {
		if n == 1 {
			return &answer{status: 429, retryAfter: "95", body: protocol.ErrorBody{Error: protocol.ErrorDetail{Code: "quota_exceeded", Message: "push again in 95 s"}}}
		}
		return nil
	}
	cfg := testConfig(t, f)
	sleeps := runRecorded(t, cfg, 2)
	if !within(sleeps[0], 95*time.Second, 143*time.Second) {
		t.Fatalf("after 429 Retry-After: 95 the agent waited %v", sleeps[0])
	}
	if !within(sleeps[1], 58*time.Second, 60*time.Second) {
		t.Fatalf("then %v, want the interval", sleeps[1])
	}
	if _, pushes := f.snapshot(); len(pushes) != 2 {
		t.Fatalf("%d pushes", len(pushes))
	}
}

// The sh agent waits out a 429's Retry-After too.
func testShellAgentQuota(t *testing.T, sh shellEnv) {
	f := newFakeServer(t)
	var mu sync.Mutex
	var times []time.Time
	f.onPush = func(n int, p protocol.PushRequest) *answer {
		mu.Lock()
		times = append(times, time.Now())
		mu.Unlock()
		if n == 1 {
			return &answer{status: 429, retryAfter: "3"}
		}
		return &answer{status: 200, body: protocol.PushResponse{PushInterval: 1}}
	}
	dir := t.TempDir()
	a := startShellAgent(t, sh, filepath.Join(dir, "state"), "--server", f.srv.URL, "--enroll-secret", "s3cret",
		"--ca-cert", f.caFile, "--root", "testdata/root", "--device-type", "ICR-3241")
	waitFor(t, 30*time.Second, "two pushes", func() bool {
		_, pushes := f.snapshot()
		return len(pushes) >= 2
	})
	a.stop()
	mu.Lock()
	defer mu.Unlock()
	if gap := times[1].Sub(times[0]); gap < 3*time.Second {
		t.Errorf("pushed again %v after 429 with Retry-After: 3", gap)
	}
}
