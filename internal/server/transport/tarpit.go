package transport

import (
	"context"
	"sync"
	"time"
)

// The tarpit's bounds: held answers per device and in all. Beyond them an
// over-quota answer closes its connection instead of waiting.
const (
	HeldPerDevice = 4
	HeldTotal     = 10_000
)

// Tarpit counts the over-quota answers held until their Retry-After (the
// server's push admission decides which): a held answer is a timer, no
// CPU, and the bounds keep a flood of connections from holding memory.
type Tarpit struct {
	// Stop is closed when the server drains: held answers go out at once;
	// nil: never.
	Stop <-chan struct{}
	// MaxHold is the longest hold; 0: none held.
	MaxHold time.Duration

	mu       sync.Mutex
	byDevice map[uint64]int
	total    int
}

// Enter takes a held place for device id; false when none is free.
func (t *Tarpit) Enter(id uint64) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.total >= HeldTotal || t.byDevice[id] >= HeldPerDevice {
		return false
	}
	if t.byDevice == nil {
		t.byDevice = map[uint64]int{}
	}
	t.byDevice[id]++
	t.total++
	return true
}

// Leave gives back the place Enter took.
func (t *Tarpit) Leave(id uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.byDevice[id]--; t.byDevice[id] <= 0 {
		delete(t.byDevice, id)
	}
	t.total--
}

// Hold waits d, or less when ctx ends or the server drains; it returns how
// long it waited.
func (t *Tarpit) Hold(ctx context.Context, d time.Duration) time.Duration {
	start := time.Now()
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C:
	case <-ctx.Done():
	case <-t.Stop:
	}
	return time.Since(start)
}
