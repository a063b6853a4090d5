package testwait

import (
	"sync/atomic"
	"testing"
	"time"
)

func TestUntil(t *testing.T) {
	t.Parallel()
	var n atomic.Int32
	start := time.Now()
	if !Until(5*time.Second, func() bool { return n.Add(1) >= 3 }) {
		t.Fatal("a condition that holds on the third check: not seen")
	}
	if n.Load() != 3 {
		t.Fatalf("checked %d times, want 3", n.Load())
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("returned after %v, not as soon as the condition held", d)
	}
	if Until(50*time.Millisecond, func() bool { return false }) {
		t.Fatal("a condition that never holds: reported as held")
	}
	// The first check outlasts the deadline; the condition holds on the
	// second.
	calls := 0
	if !Until(50*time.Millisecond, func() bool { calls++; time.Sleep(100 * time.Millisecond); return calls == 2 }) {
		t.Fatal("the last check after the deadline was not made")
	}
}

type recorder struct {
	testing.TB
	failed string
}

func (r *recorder) Helper() {}
func (r *recorder) Fatalf(format string, args ...any) {
	r.failed = format
}

func TestForFails(t *testing.T) {
	t.Parallel()
	r := &recorder{TB: t}
	For(r, 30*time.Millisecond, "nothing", func() bool { return false })
	if r.failed == "" {
		t.Fatal("For did not fail on a condition that never held")
	}
	r.failed = ""
	For(r, time.Second, "at once", func() bool { return true })
	if r.failed != "" {
		t.Fatal("For failed on a condition that held")
	}
}

// A Buffer is read while another goroutine writes it (go test -race).
func TestBufferReadWhileWritten(t *testing.T) {
	t.Parallel()
	var b Buffer
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 100 {
			b.Write([]byte("x"))
		}
	}()
	For(t, 5*time.Second, "100 bytes written", func() bool { return len(b.String()) == 100 })
	<-done
}
