package fleet

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/drover/drover/internal/testwait"
)

// paceClock is a clock the test moves: the committer's waits for the commit
// interval are announced on sleeps and end only when the test advances the
// clock (or the committer is hurried).
type paceClock struct {
	mu      sync.Mutex
	t       time.Time
	sleeps  chan time.Duration
	advance chan struct{}
}

func newPaceClock() *paceClock {
	return &paceClock{t: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), sleeps: make(chan time.Duration, 100), advance: make(chan struct{})}
}

func (c *paceClock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }

func (c *paceClock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func (c *paceClock) sleep(d time.Duration, stop <-chan struct{}) {
	c.sleeps <- d
	select {
	case <-c.advance:
	case <-stop:
	}
}

// waitSleep fails unless the committer waits for the interval within 10 s.
func (c *paceClock) waitSleep(t *testing.T) time.Duration {
	t.Helper()
	select {
	case d := <-c.sleeps:
		return d
	case <-time.After(10 * time.Second):
		t.Fatal("the committer did not wait for the commit interval")
		return 0
	}
}

// wake moves the clock by d and ends the committer's wait.
func (c *paceClock) wake(t *testing.T, d time.Duration) {
	t.Helper()
	c.add(d)
	select {
	case c.advance <- struct{}{}:
	case <-time.After(10 * time.Second):
		t.Fatal("the committer is not waiting")
	}
}

// paceStore records when (by its clock) each commit started and how many
// records it carried; with gate set, a commit waits for a value from gate.
type paceStore struct {
	recStore
	now     func() time.Time
	gate    chan struct{}
	cmu     sync.Mutex
	starts  []time.Time
	records []int
}

func (s *paceStore) Commit(ctx context.Context, b *Batch) error {
	s.cmu.Lock()
	s.starts = append(s.starts, s.now())
	s.records = append(s.records, b.Len())
	s.cmu.Unlock()
	if s.gate != nil {
		<-s.gate
	}
	return nil
}

func (s *paceStore) log() ([]time.Time, []int) {
	s.cmu.Lock()
	defer s.cmu.Unlock()
	return append([]time.Time(nil), s.starts...), append([]int(nil), s.records...)
}

// waitCommits waits until n commits have started.
func (s *paceStore) waitCommits(t *testing.T, n int) {
	t.Helper()
	testwait.For(t, 10*time.Second, fmt.Sprintf("%d commits to start", n), func() bool {
		_, recs := s.log()
		return len(recs) >= n
	})
}

func newPaced(t *testing.T, maxPending int, interval time.Duration) (*WriteThrough, *paceClock, *paceStore) {
	t.Helper()
	c := newPaceClock()
	st := &paceStore{now: c.now}
	w := newWriteThrough(st, WriteThroughOptions{MaxPending: maxPending, CommitInterval: interval}, c.now, c.sleep)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		w.Close(ctx)
	})
	return w, c, st
}

func enqueueN(t *testing.T, w *WriteThrough, n int) []Ticket {
	t.Helper()
	var tks []Ticket
	for i := range n {
		tk, err := w.Enqueue(func(b *Batch) { b.Samples = append(b.Samples, Sample{DeviceID: uint64(i + 1)}) })
		if err != nil {
			t.Fatal(err)
		}
		tks = append(tks, tk)
	}
	return tks
}

func waitAll(t *testing.T, tks []Ticket) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, tk := range tks {
		if err := tk.Wait(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// At a steady arrival rate, commits start at least the interval apart and
// each carries what arrived meanwhile.
func TestWriteThroughPacesCommits(t *testing.T) {
	const interval = 10 * time.Millisecond
	w, c, st := newPaced(t, 0, interval)
	waitAll(t, enqueueN(t, w, 1)) // idle: committed at once
	for round := range 5 {
		c.add(time.Millisecond)
		tks := enqueueN(t, w, 20)
		if d := c.waitSleep(t); d != interval-time.Millisecond {
			t.Fatalf("round %d: waits %v, want %v", round, d, interval-time.Millisecond)
		}
		if _, recs := st.log(); len(recs) != round+1 {
			t.Fatalf("round %d: %d commits before the interval ended, want %d", round, len(recs), round+1)
		}
		c.wake(t, interval-time.Millisecond)
		waitAll(t, tks)
	}
	starts, recs := st.log()
	if len(recs) != 6 {
		t.Fatalf("%d commits (%v), want 6", len(recs), recs)
	}
	for i := 1; i < len(recs); i++ {
		if recs[i] != 20 {
			t.Errorf("commit %d carried %d records, want 20", i, recs[i])
		}
		if gap := starts[i].Sub(starts[i-1]); gap < interval {
			t.Errorf("commit %d started %v after the one before, want at least %v", i, gap, interval)
		}
	}
}

// A write after the committer was idle longer than the interval is committed
// at once; so is the very first one.
func TestWriteThroughLoneWriteNotDelayed(t *testing.T) {
	w, c, st := newPaced(t, 0, time.Hour)
	waitAll(t, enqueueN(t, w, 1))
	c.add(time.Hour + time.Millisecond)
	waitAll(t, enqueueN(t, w, 1))
	if len(c.sleeps) != 0 {
		t.Fatalf("the committer waited %v", <-c.sleeps)
	}
	if _, recs := st.log(); len(recs) != 2 {
		t.Fatalf("%d commits, want 2", len(recs))
	}
}

// Close commits what is pending without waiting for the interval.
func TestWriteThroughCloseDoesNotWait(t *testing.T) {
	c := newPaceClock()
	st := &paceStore{now: c.now}
	w := newWriteThrough(st, WriteThroughOptions{CommitInterval: time.Hour}, c.now, c.sleep)
	waitAll(t, enqueueN(t, w, 1))
	tks := enqueueN(t, w, 3)
	c.waitSleep(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := w.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	waitAll(t, tks)
	if _, recs := st.log(); len(recs) != 2 || recs[1] != 3 {
		t.Fatalf("commits %v, want [1 3]", recs)
	}
	if _, err := w.Enqueue(func(*Batch) {}); !errors.Is(err, ErrClosed) {
		t.Fatalf("after Close: %v", err)
	}
}

// Half of maxPending pending ends the wait for the interval, and beyond
// maxPending writes are still refused.
func TestWriteThroughPacedOverload(t *testing.T) {
	const maxPending = 10
	w, c, st := newPaced(t, maxPending, time.Hour)
	st.gate = make(chan struct{})
	first := enqueueN(t, w, 1)
	st.gate <- struct{}{}
	waitAll(t, first)
	tks := enqueueN(t, w, maxPending/2-1)
	c.waitSleep(t)
	tks = append(tks, enqueueN(t, w, 1)...) // half: committed without the clock moving
	select {
	case st.gate <- struct{}{}: // the commit of the first half is let through
	case <-time.After(10 * time.Second):
		t.Fatal("half of max pending did not start a commit")
	}
	waitAll(t, tks)
	// The next commit waits for the interval, then blocks in the store.
	tks = enqueueN(t, w, maxPending/2-1)
	c.waitSleep(t)
	c.wake(t, time.Hour)
	st.waitCommits(t, 3)
	more := enqueueN(t, w, maxPending)
	if _, err := w.Enqueue(func(b *Batch) { b.Samples = append(b.Samples, Sample{}) }); !errors.Is(err, ErrOverloaded) {
		t.Fatalf("beyond max pending: %v, want ErrOverloaded", err)
	}
	close(st.gate)
	waitAll(t, append(tks, more...))
	if _, recs := st.log(); len(recs) != 4 || recs[1] != maxPending/2 || recs[2] != maxPending/2-1 || recs[3] != maxPending {
		t.Fatalf("commits %v, want [1 %d %d %d]", recs, maxPending/2, maxPending/2-1, maxPending)
	}
}

// With the real clock, commits under a steady stream of writes are at most
// one per interval.
func TestWriteThroughPacedRealClock(t *testing.T) {
	const interval = 20 * time.Millisecond
	st := &paceStore{now: time.Now}
	w := NewWriteThroughWith(st, WriteThroughOptions{CommitInterval: interval})
	defer w.Close(context.Background())
	start := time.Now()
	var tks []Ticket
	for time.Since(start) < 300*time.Millisecond {
		tks = append(tks, enqueueN(t, w, 1)...)
		time.Sleep(200 * time.Microsecond) // paces the stream of writes: the load under test
	}
	waitAll(t, tks)
	elapsed := time.Since(start)
	_, recs := st.log()
	if limit := int(elapsed/interval) + 2; len(recs) > limit {
		t.Fatalf("%d commits in %v, want at most %d at one per %v", len(recs), elapsed, limit, interval)
	}
	sum := 0
	for _, n := range recs {
		sum += n
	}
	if sum != len(tks) {
		t.Fatalf("committed %d records, enqueued %d", sum, len(tks))
	}
}

// A full batch ends the wait for the interval; fewer records keep waiting.
func TestWriteThroughCommitBatch(t *testing.T) {
	const batch = 8
	c := newPaceClock()
	st := &paceStore{now: c.now}
	w := newWriteThrough(st, WriteThroughOptions{CommitInterval: time.Hour, CommitBatch: batch}, c.now, c.sleep)
	defer w.Close(context.Background())
	waitAll(t, enqueueN(t, w, 1)) // idle: committed at once
	tks := enqueueN(t, w, batch-1)
	c.waitSleep(t)
	// Time for a wrong commit to happen before asserting that none did.
	time.Sleep(20 * time.Millisecond)
	if _, recs := st.log(); len(recs) != 1 {
		t.Fatalf("%d commits before the batch was full, want 1", len(recs))
	}
	tks = append(tks, enqueueN(t, w, 1)...) // full: committed without the clock moving
	waitAll(t, tks)
	// A batch that is already pending when the committer looks is not
	// waited for either.
	st.gate = make(chan struct{})
	slow := enqueueN(t, w, batch)
	st.waitCommits(t, 3) // the committer may have waited while slow filled up
	for len(c.sleeps) > 0 {
		<-c.sleeps
	}
	more := enqueueN(t, w, batch+1)
	close(st.gate)
	waitAll(t, append(slow, more...))
	if _, recs := st.log(); len(recs) != 4 || recs[1] != batch || recs[2] != batch || recs[3] != batch+1 {
		t.Fatalf("commits %v, want [1 %d %d %d]", recs, batch, batch, batch+1)
	}
	if len(c.sleeps) != 0 {
		t.Fatalf("the committer waited for the interval with a full batch pending after a commit")
	}
}
