package fleet

import (
	"context"
	"errors"
	"sync"
	"time"
)

// Errors a Persister returns; the server answers both with 503.
var (
	ErrOverloaded  = errors.New("too many writes pending")
	ErrClosed      = errors.New("persistence is shut down")
	ErrUnavailable = errors.New("store unavailable")
)

// Persister turns the fleet's writes into store commits according to a
// persistence mode (docs/persistence.md).
type Persister interface {
	// Enqueue adds what fill appends to the pipeline. The ticket's Wait
	// returns when the mode's guarantee holds for it. Enqueue order is
	// commit order.
	Enqueue(fill func(*Batch)) (Ticket, error)
	// Close drains everything accepted so far into the store.
	Close(ctx context.Context) error
}

// Ticket waits for one enqueued write. The zero Ticket is already done.
type Ticket struct{ g *group }

// Wait blocks until the write is done as the mode promises, or ctx ends.
func (t Ticket) Wait(ctx context.Context) error {
	if t.g == nil {
		return nil
	}
	select {
	case <-t.g.done:
		return t.g.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// persist enqueues and waits.
func persist(ctx context.Context, p Persister, fill func(*Batch)) error {
	t, err := p.Enqueue(fill)
	if err != nil {
		return err
	}
	return t.Wait(ctx)
}

// CommitObserver is told about every store commit (for metrics and logs).
type CommitObserver func(records int, took time.Duration, err error)

// UpkeepObserver is told about each step of a store's background work (for
// metrics and logs): work names it (e.g. checkpoint, state_log_merge), items
// is what the step moved (pages, devices, rows), took how long it ran, with
// any wait for the writer included.
type UpkeepObserver func(work string, items int64, took time.Duration, err error)

// Memory is the persistence mode that writes nothing.
type Memory struct{}

func (Memory) Enqueue(func(*Batch)) (Ticket, error) { return Ticket{}, nil }
func (Memory) Close(context.Context) error          { return nil }

// WriteThrough answers a write only after the store committed it. Writes
// that arrive while a commit runs are grouped into the next commit, so many
// concurrent pushes share one transaction and one fsync.
type WriteThrough struct {
	store      Store
	maxPending int
	observe    CommitObserver
	timeout    time.Duration

	// interval is the least time from one commit's start to the next's
	// (WriteThroughOptions.CommitInterval); lastStart is when the last
	// commit started. now and sleep are the clock (tests replace them).
	interval  time.Duration
	batch     int
	lastStart time.Time
	now       func() time.Time
	sleep     func(d time.Duration, stop <-chan struct{})

	// window is how long a commit waits for more writes when fewer are
	// pending than the last commit carried (as PostgreSQL's commit_delay);
	// only without an interval.
	window   time.Duration
	lastSize int

	mu      sync.Mutex
	cur     *group
	spare   *Batch
	closing bool
	wake    chan struct{}
	// hurry ends a wait for the interval: Close, a full batch, or half of
	// maxPending pending.
	hurry   chan struct{}
	stopped chan struct{}
}

type group struct {
	b    *Batch
	done chan struct{}
	err  error
}

// WriteThroughOptions configures NewWriteThroughWith.
type WriteThroughOptions struct {
	// MaxPending bounds the records waiting for the next commit; beyond
	// it Enqueue fails with ErrOverloaded (0: 50,000).
	MaxPending int
	// Observe is told about every commit (nil: nobody).
	Observe CommitObserver
	// CommitInterval is the least time between the starts of two commits
	// (0: a commit starts as soon as the previous one ended). Writes that
	// arrive meanwhile wait and are committed together, so that a server
	// far from saturated makes fewer, larger commits, each cheaper per
	// record (docs/performance.md, "Commit interval and commit batch"). A
	// write that finds the last commit started an interval or more ago is
	// committed at once, and so is everything pending on Close or when
	// half of MaxPending is pending.
	CommitInterval time.Duration
	// CommitBatch ends the wait for CommitInterval once this many records
	// are pending (0: never): a commit this large is about as cheap per
	// record as it gets, and waiting longer only adds latency, which
	// limits clients that wait for each answer before sending again.
	CommitBatch int
}

// NewWriteThrough starts the committer without a commit interval.
// maxPending bounds the records waiting for the next commit; beyond it
// Persist fails with ErrOverloaded.
func NewWriteThrough(store Store, maxPending int, observe CommitObserver) *WriteThrough {
	return NewWriteThroughWith(store, WriteThroughOptions{MaxPending: maxPending, Observe: observe})
}

// NewWriteThroughWith starts the committer with o.
func NewWriteThroughWith(store Store, o WriteThroughOptions) *WriteThrough {
	return newWriteThrough(store, o, time.Now, sleepUnless)
}

func newWriteThrough(store Store, o WriteThroughOptions, now func() time.Time, sleep func(time.Duration, <-chan struct{})) *WriteThrough {
	if o.MaxPending <= 0 {
		o.MaxPending = 50000
	}
	if o.Observe == nil {
		o.Observe = func(int, time.Duration, error) {}
	}
	w := &WriteThrough{
		store: store, maxPending: o.MaxPending, observe: o.Observe, timeout: 30 * time.Second, window: 500 * time.Microsecond,
		interval: max(o.CommitInterval, 0), batch: max(o.CommitBatch, 0), now: now, sleep: sleep,
		cur:  &group{b: &Batch{}, done: make(chan struct{})},
		wake: make(chan struct{}, 1), hurry: make(chan struct{}, 1), stopped: make(chan struct{}),
	}
	go w.run()
	return w
}

// sleepUnless sleeps for d or until stop receives.
func sleepUnless(d time.Duration, stop <-chan struct{}) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-stop:
	}
}

// signal wakes the receiver of c unless a wake-up is already waiting.
func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

func (w *WriteThrough) Enqueue(fill func(*Batch)) (Ticket, error) {
	w.mu.Lock()
	if w.closing {
		w.mu.Unlock()
		return Ticket{}, ErrClosed
	}
	before := w.cur.b.Len()
	if before >= w.maxPending {
		w.mu.Unlock()
		return Ticket{}, ErrOverloaded
	}
	fill(w.cur.b)
	g := w.cur
	after := g.b.Len()
	full := before < w.maxPending/2 && after >= w.maxPending/2 || w.batch > 0 && before < w.batch && after >= w.batch
	w.mu.Unlock()
	signal(w.wake)
	if full && w.interval > 0 {
		signal(w.hurry)
	}
	return Ticket{g}, nil
}

func (w *WriteThrough) run() {
	defer close(w.stopped)
	for {
		<-w.wake
		for {
			if n, closing := w.pending(); n == 0 {
				if closing {
					return
				}
				break
			}
			w.pace()
			w.gather()
			w.mu.Lock()
			g := w.cur // not empty: only this goroutine takes writes out
			next := w.spare
			if next == nil {
				next = &Batch{}
			}
			w.spare = nil
			w.cur = &group{b: next, done: make(chan struct{})}
			w.mu.Unlock()

			w.lastSize = g.b.Len()
			w.lastStart = w.now()
			g.err = w.commit(g.b)
			g.b.Reset()
			w.mu.Lock()
			w.spare = g.b
			w.mu.Unlock()
			close(g.done)
		}
	}
}

// pending is how many records wait for the next commit, and whether Close
// was called.
func (w *WriteThrough) pending() (int, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.cur.b.Len(), w.closing
}

// pace waits until the interval since the last commit's start has passed,
// unless Close was called, a batch or half of maxPending is pending. A write that
// arrives after the committer was idle longer than the interval never waits.
func (w *WriteThrough) pace() {
	if w.interval <= 0 || w.lastStart.IsZero() {
		return
	}
	for {
		n, closing := w.pending()
		d := w.interval - w.now().Sub(w.lastStart)
		if d <= 0 || closing || n >= w.maxPending/2 || w.batch > 0 && n >= w.batch {
			return
		}
		w.sleep(d, w.hurry)
	}
}

// gather waits up to window while the pending group is less than half as
// large as the last commit: under load, writers released by the last commit
// are about to send their next writes, and one commit for all of them beats
// one commit for the first and another for the rest. Idle, it never waits.
// With a commit interval the interval does this, and gather never waits.
func (w *WriteThrough) gather() {
	n, closing := w.pending()
	if w.interval > 0 || closing || n == 0 || n*2 >= w.lastSize {
		return
	}
	time.Sleep(w.window)
}

func (w *WriteThrough) commit(b *Batch) error {
	ctx, cancel := context.WithTimeout(context.Background(), w.timeout)
	defer cancel()
	start := time.Now()
	n := b.Len()
	err := w.store.Commit(ctx, b)
	w.observe(n, time.Since(start), err)
	if err != nil {
		return errors.Join(ErrUnavailable, err)
	}
	return nil
}

// Close commits what is pending at once, without waiting for the commit
// interval, and stops the committer.
func (w *WriteThrough) Close(ctx context.Context) error {
	w.mu.Lock()
	w.closing = true
	w.mu.Unlock()
	signal(w.wake)
	signal(w.hurry)
	select {
	case <-w.stopped:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
