package fleet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// WriteBackOptions configure NewWriteBack.
type WriteBackOptions struct {
	// FlushInterval is how often dirty data is committed (default 5 s).
	FlushInterval time.Duration
	// MaxSamples bounds the history samples held between flushes; beyond
	// it new samples are dropped and counted (default 100,000). Reaching
	// half of it starts a flush early.
	MaxSamples int
	// FlushTimeout bounds one periodic flush's commit (default 2 min).
	FlushTimeout time.Duration
	Observe      CommitObserver
	Logger       *slog.Logger
}

// WriteBack acknowledges a write once it is in memory and commits what
// changed every FlushInterval. Between flushes the latest state of a device
// replaces earlier ones (one row write per device per flush); registrations
// and profiles are kept likewise, keyed by ID, and never dropped. A flush
// swaps the dirty set under a short lock and commits outside it, so writes
// never wait for the store. A failed flush keeps its data and is retried
// merged with what arrived since, newer data winning. Close flushes all.
type WriteBack struct {
	store   Store
	opts    WriteBackOptions
	observe CommitObserver
	log     *slog.Logger

	mu      sync.Mutex
	dirty   *dirtySet
	held    int // samples owned by the flusher (being committed or kept for retry)
	scratch Batch
	closed  bool

	retry *dirtySet // a failed flush's data, kept for the next; flusher goroutine only

	base     context.Context // parent of periodic flushes; canceled when Close runs out of time
	cancel   context.CancelFunc
	kick     chan struct{}
	flushReq chan chan error
	closeReq chan context.Context
	closeErr chan error
	stopped  chan struct{}

	dropped, flushes, failures atomic.Uint64
	lastFlush                  atomic.Int64 // unix ns of the last successful flush
}

// WriteBackStats describe a WriteBack's backlog and history.
type WriteBackStats struct {
	DirtyRegistrations int    // device records changed since the last swap
	DirtyStates        int    // device states changed since the last swap
	DirtyProfiles      int    // profiles changed since the last swap
	BufferedSamples    int    // samples not yet committed
	DroppedSamples     uint64 // samples dropped because the buffer was full
	Flushes            uint64 // successful flushes
	FailedFlushes      uint64
	LastFlush          time.Time // zero before the first successful flush
}

type dirtySet struct {
	profiles map[uint64]Profile
	devices  map[uint64]DeviceRecord
	states   map[uint64]StateRecord
	samples  []Sample
	trust    map[uint64]TrustRecord
}

func newDirtySet(hint *dirtySet) *dirtySet {
	var p, d, s, m int
	if hint != nil {
		p, d, s, m = len(hint.profiles), len(hint.devices), len(hint.states), len(hint.samples)
	}
	return &dirtySet{
		profiles: make(map[uint64]Profile, p), devices: make(map[uint64]DeviceRecord, d),
		states: make(map[uint64]StateRecord, s), samples: make([]Sample, 0, m), trust: map[uint64]TrustRecord{},
	}
}

func (d *dirtySet) empty() bool {
	return len(d.profiles) == 0 && len(d.devices) == 0 && len(d.states) == 0 && len(d.samples) == 0 && len(d.trust) == 0
}

func (d *dirtySet) records() int {
	return len(d.profiles) + len(d.devices) + len(d.states) + len(d.samples) + len(d.trust)
}

// absorb adds newer into d: for each key newer's record wins; newer's
// samples follow d's.
func (d *dirtySet) absorb(newer *dirtySet) {
	for k, v := range newer.profiles {
		d.profiles[k] = v
	}
	for k, v := range newer.devices {
		d.devices[k] = v
	}
	for k, v := range newer.states {
		d.states[k] = v
	}
	d.samples = append(d.samples, newer.samples...)
	for k, v := range newer.trust {
		d.trust[k] = v
	}
}

// batch orders the set by ID, which makes commits deterministic and lets
// lock-based stores take row locks in one order.
func (d *dirtySet) batch() *Batch {
	b := &Batch{
		Profiles: make([]Profile, 0, len(d.profiles)), Devices: make([]DeviceRecord, 0, len(d.devices)),
		States: make([]StateRecord, 0, len(d.states)), Samples: d.samples,
	}
	for _, v := range d.profiles {
		b.Profiles = append(b.Profiles, v)
	}
	for _, v := range d.devices {
		b.Devices = append(b.Devices, v)
	}
	for _, v := range d.states {
		b.States = append(b.States, v)
	}
	slices.SortFunc(b.Profiles, func(x, y Profile) int { return cmpU(x.ID, y.ID) })
	slices.SortFunc(b.Devices, func(x, y DeviceRecord) int { return cmpU(x.ID, y.ID) })
	slices.SortFunc(b.States, func(x, y StateRecord) int { return cmpU(x.DeviceID, y.DeviceID) })
	for _, v := range d.trust {
		b.Trust = append(b.Trust, v)
	}
	slices.SortFunc(b.Trust, func(x, y TrustRecord) int { return cmpU(x.DeviceID, y.DeviceID) })
	return b
}

func cmpU(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// NewWriteBack starts the flusher.
func NewWriteBack(store Store, o WriteBackOptions) *WriteBack {
	if o.FlushInterval <= 0 {
		o.FlushInterval = 5 * time.Second
	}
	if o.MaxSamples <= 0 {
		o.MaxSamples = 100000
	}
	if o.FlushTimeout <= 0 {
		o.FlushTimeout = 2 * time.Minute
	}
	w := &WriteBack{
		store: store, opts: o, observe: o.Observe, log: o.Logger,
		dirty: newDirtySet(nil),
		kick:  make(chan struct{}, 1), flushReq: make(chan chan error),
		closeReq: make(chan context.Context), closeErr: make(chan error, 1), stopped: make(chan struct{}),
	}
	w.base, w.cancel = context.WithCancel(context.Background())
	if w.observe == nil {
		w.observe = func(int, time.Duration, error) {}
	}
	if w.log == nil {
		w.log = slog.New(slog.DiscardHandler)
	}
	go w.run()
	return w
}

// Enqueue records the write in the dirty set and returns a done Ticket.
func (w *WriteBack) Enqueue(fill func(*Batch)) (Ticket, error) {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return Ticket{}, ErrClosed
	}
	b := &w.scratch
	fill(b)
	d := w.dirty
	for _, p := range b.Profiles {
		d.profiles[p.ID] = p
	}
	for _, r := range b.Devices {
		d.devices[r.ID] = r
	}
	for _, s := range b.States {
		d.states[s.DeviceID] = s
	}
	for _, t := range b.Trust {
		d.trust[t.DeviceID] = t
	}
	for _, m := range b.Samples {
		if len(d.samples)+w.held >= w.opts.MaxSamples {
			w.dropped.Add(1)
			continue
		}
		d.samples = append(d.samples, m)
	}
	early := len(d.samples) >= w.opts.MaxSamples/2
	b.Reset()
	clear(b.Samples[:cap(b.Samples)])
	w.mu.Unlock()
	if early {
		select {
		case w.kick <- struct{}{}:
		default:
		}
	}
	return Ticket{}, nil
}

// Flush commits everything enqueued before the call.
func (w *WriteBack) Flush(ctx context.Context) error {
	reply := make(chan error, 1)
	select {
	case w.flushReq <- reply:
	case <-w.stopped:
		return ErrClosed
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-reply:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Close stops accepting writes and flushes everything, retrying a failing
// store until ctx ends. Data still unflushed then is lost and reported.
func (w *WriteBack) Close(ctx context.Context) error {
	w.mu.Lock()
	first := !w.closed
	w.closed = true
	w.mu.Unlock()
	if !first {
		<-w.stopped
		return nil
	}
	// A periodic flush stuck on a dead database must not outlive ctx.
	defer context.AfterFunc(ctx, w.cancel)()
	w.closeReq <- ctx
	err := <-w.closeErr
	w.cancel()
	return err
}

// Stats returns the current backlog and counters.
func (w *WriteBack) Stats() WriteBackStats {
	w.mu.Lock()
	st := WriteBackStats{
		DirtyRegistrations: len(w.dirty.devices), DirtyStates: len(w.dirty.states), DirtyProfiles: len(w.dirty.profiles),
		BufferedSamples: len(w.dirty.samples) + w.held,
	}
	w.mu.Unlock()
	st.DroppedSamples, st.Flushes, st.FailedFlushes = w.dropped.Load(), w.flushes.Load(), w.failures.Load()
	if ns := w.lastFlush.Load(); ns != 0 {
		st.LastFlush = time.Unix(0, ns)
	}
	return st
}

func (w *WriteBack) run() {
	defer close(w.stopped)
	t := time.NewTicker(w.opts.FlushInterval)
	defer t.Stop()
	var reported uint64
	periodic := func() {
		ctx, cancel := context.WithTimeout(w.base, w.opts.FlushTimeout)
		w.flush(ctx)
		cancel()
		if d := w.dropped.Load(); d != reported {
			w.log.Warn("write-back dropped history samples: buffer full", "dropped", d-reported, "max_samples", w.opts.MaxSamples)
			reported = d
		}
	}
	for {
		select {
		case <-t.C:
			periodic()
		case <-w.kick:
			periodic()
		case reply := <-w.flushReq:
			ctx, cancel := context.WithTimeout(w.base, w.opts.FlushTimeout)
			reply <- w.flush(ctx)
			cancel()
		case ctx := <-w.closeReq:
			w.closeErr <- w.drain(ctx)
			return
		}
	}
}

// drain flushes until nothing is left, retrying failures until ctx ends.
func (w *WriteBack) drain(ctx context.Context) error {
	backoff := 50 * time.Millisecond
	for {
		err := w.flush(ctx)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			left := w.retry
			err = fmt.Errorf("write-back: %d profiles, %d devices, %d states and %d samples not flushed: %w",
				len(left.profiles), len(left.devices), len(left.states), len(left.samples), err)
			w.log.Error("shutdown lost unflushed writes", "err", err)
			return err
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

// flush commits the dirty set together with a previously failed one. Only
// the swap holds the lock; merging and committing run outside it.
func (w *WriteBack) flush(ctx context.Context) error {
	w.mu.Lock()
	swapped := time.Now()
	cur := w.dirty
	empty := cur.empty()
	if !empty {
		w.dirty = newDirtySet(cur)
	}
	set := cur
	if w.retry != nil {
		w.held = len(w.retry.samples) + len(cur.samples)
	} else {
		w.held = len(cur.samples)
	}
	w.mu.Unlock()
	if w.retry != nil {
		if !empty {
			w.retry.absorb(cur)
		}
		set = w.retry
	} else if empty {
		return nil
	}

	b := set.batch()
	n := b.Len()
	start := time.Now()
	err := w.store.Commit(ctx, b)
	w.observe(n, time.Since(start), err)
	if err != nil {
		w.failures.Add(1)
		w.retry = set
		return errors.Join(ErrUnavailable, err)
	}
	w.retry = nil
	w.mu.Lock()
	w.held = 0
	w.mu.Unlock()
	w.flushes.Add(1)
	w.lastFlush.Store(time.Now().UnixNano())
	// Everything acknowledged before swapped is now durable.
	w.log.Debug("write-back flushed", "swapped", swapped, "took", time.Since(swapped), "devices", len(b.Devices),
		"states", len(b.States), "samples", len(b.Samples))
	return nil
}
