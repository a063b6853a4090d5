package server

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/drover/drover/internal/store"
)

func TestNeedsCheckpointRoom(t *testing.T) {
	for _, tc := range []struct {
		devices int
		maxWAL  int64
		want    bool
	}{
		{1_000_000, 1 << 30, true},   // the defaults under the fleet test
		{100_000, 1 << 30, true},     // from largeFleet on
		{99_999, 1 << 30, false},     // a smaller fleet: the defaults will do
		{1_000_000, 16 << 30, false}, // the advice followed
		{1_000_000, 4 << 30, false},  // roomyWAL itself is enough
		{1_000_000, 4<<30 - 1, true},
	} {
		if got := needsCheckpointRoom(tc.devices, tc.maxWAL); got != tc.want {
			t.Errorf("needsCheckpointRoom(%d, %d) = %v, want %v", tc.devices, tc.maxWAL, got, tc.want)
		}
	}
}

func TestNeedsBufferPool(t *testing.T) {
	for _, tc := range []struct {
		devices int
		pool    int64
		want    bool
	}{
		{1_000_000, 128 << 20, true},      // MariaDB's default under the fleet test
		{100_000, 128 << 20, true},        // from largeFleet on
		{99_999, 128 << 20, false},        // a smaller fleet: the default will do
		{1_000_000, 6 << 30, false},       // the pool of the passing run
		{1_000_000, 2000000 << 10, false}, // 2 KiB per device exactly
		{1_000_000, 2000000<<10 - 1, true},
	} {
		if got := needsBufferPool(tc.devices, tc.pool); got != tc.want {
			t.Errorf("needsBufferPool(%d, %d) = %v, want %v", tc.devices, tc.pool, got, tc.want)
		}
	}
}

// poolStore is a store whose database reports a buffer pool (as MariaDB's).
type poolStore struct {
	store.Store // not called
	pool        int64
}

func (p poolStore) BufferPool(context.Context) (int64, error) { return p.pool, nil }

// The warning is logged at start for a large fleet on a small pool, with
// the advised size, and not otherwise.
func TestAdviseBufferPool(t *testing.T) {
	for _, tc := range []struct {
		devices int
		pool    int64
		warn    bool
	}{
		{1_000_000, 128 << 20, true},
		{1_000_000, 2 << 30, false},
		{10_000, 128 << 20, false},
	} {
		var out bytes.Buffer
		s := &Server{store: poolStore{pool: tc.pool}, log: slog.New(slog.NewTextHandler(&out, nil))}
		s.adviseDatabase(context.Background(), tc.devices)
		got := strings.Contains(out.String(), "MariaDB buffer pool too small for this fleet")
		if got != tc.warn {
			t.Errorf("%d devices, pool %d: warned %v, want %v; log: %s", tc.devices, tc.pool, got, tc.warn, out.String())
		}
		if tc.warn && !strings.Contains(out.String(), "advice_mb=1953") {
			t.Errorf("the warning does not give the advised size (2 KiB per device): %s", out.String())
		}
	}
}
