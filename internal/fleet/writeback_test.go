package fleet

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/drover/drover/internal/testwait"
)

// wbStore is a Store that records the batches committed to it and can fail
// or block commits.
type wbStore struct {
	mu      sync.Mutex
	batches []Batch
	states  map[uint64]StateRecord
	samples []Sample
	failN   atomic.Int64 // fail this many commits, then succeed (-1: always)
	entered chan struct{}
	release chan struct{}
}

func newWBStore() *wbStore { return &wbStore{states: map[uint64]StateRecord{}} }

func (s *wbStore) Load(context.Context, LoadOptions, func(DeviceRecord) error) (LoadResult, error) {
	return LoadResult{}, nil
}
func (s *wbStore) History(context.Context, uint64, HistoryQuery) ([]Sample, error) { return nil, nil }
func (s *wbStore) PruneHistory(context.Context, time.Time, int) (int64, error)     { return 0, nil }
func (s *wbStore) Close() error                                                    { return nil }

func (s *wbStore) Commit(ctx context.Context, b *Batch) error {
	if s.entered != nil {
		s.entered <- struct{}{}
		<-s.release
	}
	if n := s.failN.Load(); n != 0 {
		if n > 0 {
			s.failN.Add(-1)
		}
		return errors.New("database restarting")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.batches = append(s.batches, Batch{
		Profiles: append([]Profile(nil), b.Profiles...), Devices: append([]DeviceRecord(nil), b.Devices...),
		States: append([]StateRecord(nil), b.States...), Samples: append([]Sample(nil), b.Samples...),
	})
	for _, r := range b.States {
		s.states[r.DeviceID] = r
	}
	s.samples = append(s.samples, b.Samples...)
	return nil
}

func (s *wbStore) committed() []Batch {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Batch(nil), s.batches...)
}

func enqueueState(t *testing.T, w Persister, id, seq uint64) {
	t.Helper()
	tk, err := w.Enqueue(func(b *Batch) {
		b.States = append(b.States, StateRecord{DeviceID: id, Seq: seq, State: []byte(fmt.Sprintf(`{"seq":%d}`, seq))})
		b.Samples = append(b.Samples, Sample{DeviceID: id, Seq: seq})
	})
	if err != nil {
		t.Fatal(err)
	}
	if tk.g != nil {
		t.Fatal("write-back returned a pending ticket")
	}
}

func TestWriteBackCoalesces(t *testing.T) {
	st := newWBStore()
	w := NewWriteBack(st, WriteBackOptions{FlushInterval: time.Hour})
	defer w.Close(context.Background())
	w.Enqueue(func(b *Batch) {
		b.Profiles = append(b.Profiles, Profile{ID: 1, Version: 0})
		b.Devices = append(b.Devices, DeviceRecord{ID: 1, MachineID: "a"}, DeviceRecord{ID: 2, MachineID: "b"})
	})
	for seq := uint64(1); seq <= 100; seq++ {
		enqueueState(t, w, 1, seq)
	}
	enqueueState(t, w, 2, 7)
	w.Enqueue(func(b *Batch) { b.Profiles = append(b.Profiles, Profile{ID: 1, Version: 1}) })
	if s := w.Stats(); s.DirtyStates != 2 || s.DirtyRegistrations != 2 || s.DirtyProfiles != 1 || s.BufferedSamples != 101 {
		t.Fatalf("stats before flush: %+v", s)
	}
	if err := w.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	bs := st.committed()
	if len(bs) != 1 {
		t.Fatalf("%d commits, want 1", len(bs))
	}
	b := bs[0]
	if len(b.States) != 2 || b.States[0].DeviceID != 1 || b.States[0].Seq != 100 || b.States[1].Seq != 7 {
		t.Fatalf("states committed: %+v", b.States)
	}
	if len(b.Devices) != 2 || len(b.Profiles) != 1 || b.Profiles[0].Version != 1 {
		t.Fatalf("devices %+v profiles %+v", b.Devices, b.Profiles)
	}
	if len(b.Samples) != 101 || b.Samples[0].Seq != 1 || b.Samples[99].Seq != 100 || b.Samples[100].DeviceID != 2 {
		t.Fatalf("%d samples, not in enqueue order", len(b.Samples))
	}
	if s := w.Stats(); s.DirtyStates != 0 || s.BufferedSamples != 0 || s.Flushes != 1 || s.LastFlush.IsZero() {
		t.Fatalf("stats after flush: %+v", s)
	}
	// Nothing new: no commit.
	if err := w.Flush(context.Background()); err != nil || len(st.committed()) != 1 {
		t.Fatalf("empty flush: %v, %d commits", err, len(st.committed()))
	}
}

// A flush in progress, however slow, does not hold up writes.
func TestWriteBackFlushDoesNotBlockWrites(t *testing.T) {
	st := newWBStore()
	st.entered, st.release = make(chan struct{}), make(chan struct{})
	w := NewWriteBack(st, WriteBackOptions{FlushInterval: time.Hour})
	enqueueState(t, w, 1, 1)
	flushed := make(chan error, 1)
	go func() { flushed <- w.Flush(context.Background()) }()
	<-st.entered // the commit is running and will not return until released
	start := time.Now()
	for seq := uint64(2); seq <= 10000; seq++ {
		enqueueState(t, w, seq%50+1, seq)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("10,000 writes during a stuck flush took %v", d)
	}
	st.release <- struct{}{}
	if err := <-flushed; err != nil {
		t.Fatal(err)
	}
	go func() {
		for range st.entered {
			st.release <- struct{}{}
		}
	}()
	if err := w.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	close(st.entered)
	bs := st.committed()
	if len(bs) != 2 || len(bs[0].States) != 1 || len(bs[1].States) != 50 || len(bs[1].Samples) != 9999 {
		t.Fatalf("commits: %d (second: %d states, %d samples)", len(bs), len(bs[1].States), len(bs[1].Samples))
	}
}

// A failed flush keeps its data and is retried with newer writes, the
// newer version of a key winning.
func TestWriteBackRetriesAndNewerWins(t *testing.T) {
	st := newWBStore()
	var observed atomic.Int64
	w := NewWriteBack(st, WriteBackOptions{FlushInterval: time.Hour, Observe: func(n int, _ time.Duration, err error) {
		if err != nil {
			observed.Add(1)
		}
	}})
	defer w.Close(context.Background())
	st.failN.Store(-1)
	w.Enqueue(func(b *Batch) {
		b.Profiles = append(b.Profiles, Profile{ID: 1, Version: 0})
		b.Devices = append(b.Devices, DeviceRecord{ID: 3, MachineID: "c"})
	})
	enqueueState(t, w, 1, 1)
	enqueueState(t, w, 2, 1)
	if err := w.Flush(context.Background()); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("flush to a failing store: %v", err)
	}
	enqueueState(t, w, 1, 2)
	w.Enqueue(func(b *Batch) { b.Profiles = append(b.Profiles, Profile{ID: 1, Version: 5}) })
	if err := w.Flush(context.Background()); err == nil {
		t.Fatal("second flush succeeded against a failing store")
	}
	enqueueState(t, w, 1, 3)
	st.failN.Store(0)
	if err := w.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	bs := st.committed()
	if len(bs) != 1 {
		t.Fatalf("%d commits", len(bs))
	}
	b := bs[0]
	if len(b.States) != 2 || b.States[0].Seq != 3 || b.States[1].Seq != 1 || len(b.Devices) != 1 || b.Profiles[0].Version != 5 {
		t.Fatalf("committed %+v", b)
	}
	var seqs []uint64
	for _, m := range b.Samples {
		seqs = append(seqs, m.DeviceID*10+m.Seq)
	}
	if fmt.Sprint(seqs) != "[11 21 12 13]" {
		t.Fatalf("samples (device*10+seq) %v, want enqueue order [11 21 12 13]", seqs)
	}
	if s := w.Stats(); s.FailedFlushes != 2 || s.Flushes != 1 || observed.Load() != 2 {
		t.Fatalf("stats %+v, observed failures %d", s, observed.Load())
	}
}

// Samples beyond MaxSamples are dropped and counted; states and
// registrations never are.
func TestWriteBackSampleBound(t *testing.T) {
	st := newWBStore()
	st.entered, st.release = make(chan struct{}, 100), make(chan struct{}, 100)
	w := NewWriteBack(st, WriteBackOptions{FlushInterval: time.Hour, MaxSamples: 10})
	for seq := uint64(1); seq <= 25; seq++ {
		enqueueState(t, w, seq, seq) // the 5th starts an early flush, which blocks in Commit
	}
	if s := w.Stats(); s.DroppedSamples != 15 || s.BufferedSamples != 10 {
		t.Fatalf("stats %+v, want 15 dropped and 10 buffered", s)
	}
	for range 100 {
		st.release <- struct{}{}
	}
	if err := w.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	states, samples := 0, 0
	for _, b := range st.committed() {
		states += len(b.States)
		samples += len(b.Samples)
	}
	if states != 25 || samples != 10 {
		t.Fatalf("committed %d states and %d samples, want 25 and 10", states, samples)
	}
}

func TestWriteBackPeriodicFlushAndClose(t *testing.T) {
	st := newWBStore()
	w := NewWriteBack(st, WriteBackOptions{FlushInterval: 10 * time.Millisecond})
	enqueueState(t, w, 1, 1)
	testwait.For(t, 5*time.Second, "a periodic flush", func() bool { return len(st.committed()) > 0 })
	// Close retries a failing store until it succeeds.
	st.failN.Store(3)
	enqueueState(t, w, 1, 2)
	if err := w.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if st.states[1].Seq != 2 {
		t.Fatalf("after close the store has seq %d", st.states[1].Seq)
	}
	if _, err := w.Enqueue(func(*Batch) {}); !errors.Is(err, ErrClosed) {
		t.Fatalf("enqueue after close: %v", err)
	}
	if err := w.Close(context.Background()); err != nil {
		t.Fatalf("second close: %v", err)
	}
}

func TestWriteBackCloseReportsLoss(t *testing.T) {
	st := newWBStore()
	st.failN.Store(-1)
	w := NewWriteBack(st, WriteBackOptions{FlushInterval: time.Hour})
	enqueueState(t, w, 1, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	err := w.Close(ctx)
	if err == nil || !errors.Is(err, ErrUnavailable) {
		t.Fatalf("close against a dead store: %v", err)
	}
}

// Writers and the flusher at full speed: every device ends with its last
// write, every sample arrives once.
func TestWriteBackConcurrent(t *testing.T) {
	st := newWBStore()
	w := NewWriteBack(st, WriteBackOptions{FlushInterval: time.Millisecond, MaxSamples: 1 << 20})
	const writers, writes = 16, 2000
	var wg sync.WaitGroup
	for g := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for seq := uint64(1); seq <= writes; seq++ {
				enqueueState(t, w, uint64(g+1), seq)
				if seq%500 == 0 {
					w.Stats()
				}
			}
		}()
	}
	wg.Wait()
	if err := w.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(st.samples) != writers*writes {
		t.Fatalf("%d samples, want %d", len(st.samples), writers*writes)
	}
	last := map[uint64]uint64{}
	for _, m := range st.samples {
		if m.Seq != last[m.DeviceID]+1 {
			t.Fatalf("device %d: sample %d after %d", m.DeviceID, m.Seq, last[m.DeviceID])
		}
		last[m.DeviceID] = m.Seq
	}
	for g := range writers {
		if s := st.states[uint64(g+1)]; s.Seq != writes {
			t.Fatalf("device %d ends at seq %d", g+1, s.Seq)
		}
	}
	if s := w.Stats(); s.Flushes < 2 || s.DroppedSamples != 0 {
		t.Fatalf("stats %+v", s)
	}
}

// Close gives up when its context ends even while a periodic flush hangs on
// a database that does not answer.
func TestWriteBackCloseDoesNotWaitForHungFlush(t *testing.T) {
	st := newWBStore()
	st.entered, st.release = make(chan struct{}, 10), make(chan struct{})
	hung := &hangingStore{wbStore: st}
	w := NewWriteBack(hung, WriteBackOptions{FlushInterval: 5 * time.Millisecond})
	enqueueState(t, w, 1, 1)
	<-st.entered // a periodic flush is now stuck
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := w.Close(ctx)
	if err == nil || time.Since(start) > 5*time.Second {
		t.Fatalf("close returned %v after %v", err, time.Since(start))
	}
}

// hangingStore blocks commits until their context ends.
type hangingStore struct{ *wbStore }

func (h *hangingStore) Commit(ctx context.Context, b *Batch) error {
	h.entered <- struct{}{}
	<-ctx.Done()
	return ctx.Err()
}
