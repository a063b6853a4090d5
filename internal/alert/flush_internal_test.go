package alert

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"
)

// savesSpy records each SaveSyncEvents call.
type savesSpy struct {
	*MemStore
	calls [][]SyncEvent
}

func (s *savesSpy) SaveSyncEvents(ctx context.Context, evs []SyncEvent) error {
	s.calls = append(s.calls, append([]SyncEvent(nil), evs...))
	return s.MemStore.SaveSyncEvents(ctx, evs)
}

func (s *savesSpy) saved() int {
	n := 0
	for _, c := range s.calls {
		n += len(c)
	}
	return n
}

// The periodic flush writes a few sync events at once, holds many until
// they fill the window or waited syncLinger, and then writes them all
// sorted by device in transactions of syncChunk; Flush writes everything.
func TestFlushGathersSyncEvents(t *testing.T) {
	ctx := context.Background()
	spy := &savesSpy{MemStore: NewMemStore()}
	e := &Engine{store: spy}
	rng := rand.New(rand.NewPCG(1, 2))
	add := func(n int) {
		for range n {
			// Few devices, so that many have several events, in order.
			e.enqueueSync(SyncEvent{DeviceID: rng.Uint64N(3000) + 1, Applied: int64(spy.saved() + len(e.qSync))})
		}
	}

	add(syncChunk)
	if err := e.flush(ctx, false); err != nil || spy.saved() != syncChunk || len(spy.calls) != 1 {
		t.Fatalf("%d queued: %d saved in %d calls (%v), want all at once", syncChunk, spy.saved(), len(spy.calls), err)
	}
	add(syncChunk + 1)
	if err := e.flush(ctx, false); err != nil || spy.saved() != syncChunk {
		t.Fatalf("%d queued: %d more saved (%v), want them held", syncChunk+1, spy.saved()-syncChunk, err)
	}
	add(syncWindow - syncChunk - 2)
	if err := e.flush(ctx, false); err != nil || spy.saved() != syncChunk {
		t.Fatalf("one short of the window: %d more saved (%v), want them held", spy.saved()-syncChunk, err)
	}
	add(1)
	calls := len(spy.calls)
	if err := e.flush(ctx, false); err != nil || spy.saved() != syncChunk+syncWindow {
		t.Fatalf("a full window: %d of %d saved (%v)", spy.saved()-syncChunk, syncWindow, err)
	}
	checkSorted(t, spy.calls[calls:], syncWindow)

	add(syncChunk + 1)
	e.qSyncSince = time.Now().Add(-syncLinger)
	if err := e.flush(ctx, false); err != nil || spy.saved() != 2*syncChunk+syncWindow+1 {
		t.Fatalf("held for syncLinger: %d saved (%v)", spy.saved(), err)
	}
	add(syncChunk + 1)
	if err := e.Flush(ctx); err != nil || spy.saved() != 3*syncChunk+syncWindow+2 || len(e.qSync) != 0 {
		t.Fatalf("Flush: %d saved, %d left (%v)", spy.saved(), len(e.qSync), err)
	}
}

// checkSorted wants calls of at most syncChunk events, n in all, sorted by
// device across the calls, each device's events in the order they came.
func checkSorted(t *testing.T, calls [][]SyncEvent, n int) {
	t.Helper()
	var all []SyncEvent
	for _, c := range calls {
		if len(c) > syncChunk {
			t.Fatalf("a transaction of %d sync events, want at most %d", len(c), syncChunk)
		}
		all = append(all, c...)
	}
	if len(all) != n {
		t.Fatalf("%d events saved, want %d", len(all), n)
	}
	for i := 1; i < len(all); i++ {
		a, b := all[i-1], all[i]
		if a.DeviceID > b.DeviceID || a.DeviceID == b.DeviceID && a.Applied > b.Applied {
			t.Fatalf("event %d (device %d, #%d) saved after device %d, #%d", i, b.DeviceID, b.Applied, a.DeviceID, a.Applied)
		}
	}
}
