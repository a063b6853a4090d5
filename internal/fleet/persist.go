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

	// window is how long a commit waits for more writes when fewer are
	// pending than the last commit carried (as PostgreSQL's commit_delay).
	window   time.Duration
	lastSize int

	mu      sync.Mutex
	cur     *group
	spare   *Batch
	closing bool
	wake    chan struct{}
	stopped chan struct{}
}

type group struct {
	b    *Batch
	done chan struct{}
	err  error
}

// NewWriteThrough starts the committer. maxPending bounds the records
// waiting for the next commit; beyond it Persist fails with ErrOverloaded.
func NewWriteThrough(store Store, maxPending int, observe CommitObserver) *WriteThrough {
	if maxPending <= 0 {
		maxPending = 50000
	}
	if observe == nil {
		observe = func(int, time.Duration, error) {}
	}
	w := &WriteThrough{
		store: store, maxPending: maxPending, observe: observe, timeout: 30 * time.Second, window: 500 * time.Microsecond,
		cur:  &group{b: &Batch{}, done: make(chan struct{})},
		wake: make(chan struct{}, 1), stopped: make(chan struct{}),
	}
	go w.run()
	return w
}

func (w *WriteThrough) Enqueue(fill func(*Batch)) (Ticket, error) {
	w.mu.Lock()
	if w.closing {
		w.mu.Unlock()
		return Ticket{}, ErrClosed
	}
	if w.cur.b.Len() >= w.maxPending {
		w.mu.Unlock()
		return Ticket{}, ErrOverloaded
	}
	fill(w.cur.b)
	g := w.cur
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
	return Ticket{g}, nil
}

func (w *WriteThrough) run() {
	defer close(w.stopped)
	for {
		<-w.wake
		for {
			w.gather()
			w.mu.Lock()
			g := w.cur
			if g.b.Len() == 0 {
				closing := w.closing
				w.mu.Unlock()
				if closing {
					return
				}
				break
			}
			next := w.spare
			if next == nil {
				next = &Batch{}
			}
			w.spare = nil
			w.cur = &group{b: next, done: make(chan struct{})}
			w.mu.Unlock()

			w.lastSize = g.b.Len()
			g.err = w.commit(g.b)
			g.b.Reset()
			w.mu.Lock()
			w.spare = g.b
			w.mu.Unlock()
			close(g.done)
		}
	}
}

// gather waits up to window while the pending group is less than half as
// large as the last commit: under load, writers released by the last commit
// are about to send their next writes, and one commit for all of them beats
// one commit for the first and another for the rest. Idle, it never waits.
func (w *WriteThrough) gather() {
	w.mu.Lock()
	n, closing := w.cur.b.Len(), w.closing
	w.mu.Unlock()
	if closing || n == 0 || n*2 >= w.lastSize {
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

// Close commits what is pending and stops the committer.
func (w *WriteThrough) Close(ctx context.Context) error {
	w.mu.Lock()
	w.closing = true
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
	select {
	case <-w.stopped:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
