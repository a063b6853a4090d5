package emulator

import (
	"net/http"
	"testing"
	"time"

	"github.com/drover/drover/internal/emulator/results"
)

// A 429 over a device's quota is retried after Retry-After and counted as
// a retry, as a 503 is.
func TestQuota429IsRetriedAndCounted(t *testing.T) {
	t.Parallel()
	f := newFake(t, false)
	f.onPush = func(w http.ResponseWriter, machine string, call int) bool {
		if call == 1 {
			w.Header().Set("Retry-After", "1")
			fail(w, 429, "quota_exceeded")
			return true
		}
		return false
	}
	cfg := f.cfg(ModeBenchmark, 3)
	cfg.Loops = 1
	sum, _ := run(t, cfg)
	push := sum.Op(results.OpPush)
	if push.Accepted != 3 || push.Retried != 3 || push.RejectedTotal() != 0 {
		t.Fatalf("%+v", push.Counts)
	}
	for m, times := range f.pushTimes {
		if len(times) != 2 {
			t.Fatalf("%s: %d attempts", m, len(times))
		}
		if gap := times[1].Sub(times[0]); gap < time.Second {
			t.Fatalf("%s retried after %v, before Retry-After: 1", m, gap)
		}
	}
}

// Retries running out on 429 end as rejected 429s.
func TestQuota429RetriesRunOut(t *testing.T) {
	t.Parallel()
	f := newFake(t, false)
	f.onPush = func(w http.ResponseWriter, machine string, call int) bool {
		w.Header().Set("Retry-After", "0")
		fail(w, 429, "quota_exceeded")
		return true
	}
	cfg := f.cfg(ModeBenchmark, 2)
	cfg.Loops, cfg.MaxRetries = 1, 1
	sum, _ := run(t, cfg)
	push := sum.Op(results.OpPush)
	if push.Rejected["429"] != 2 || push.Retried != 2 || push.Accepted != 0 {
		t.Fatalf("%+v", push.Counts)
	}
}
