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

// The InnoDB advice: the buffer pool by devices, the redo log fixed.
func TestNeedsInnoDBRoom(t *testing.T) {
	pool, redo := needsBufferPool, needsRedoLog
	for _, tc := range []struct {
		name    string
		needs   func(devices int, size int64) bool
		devices int
		size    int64
		want    bool
	}{
		{"pool", pool, 1_000_000, 128 << 20, true},      // MariaDB's default under the fleet test
		{"pool", pool, 100_000, 128 << 20, true},        // from largeFleet on
		{"pool", pool, 99_999, 128 << 20, false},        // a smaller fleet: the default will do
		{"pool", pool, 1_000_000, 6 << 30, false},       // more than enough
		{"pool", pool, 1_000_000, 2000000 << 10, false}, // 2 KiB per device exactly
		{"pool", pool, 1_000_000, 2000000<<10 - 1, true},
		{"redo log", redo, 1_000_000, 96 << 20, true}, // MariaDB's default under the fleet test
		{"redo log", redo, 100_000, 96 << 20, true},   // from largeFleet on
		{"redo log", redo, 99_999, 96 << 20, false},   // a smaller fleet: the default will do
		{"redo log", redo, 1_000_000, 2 << 30, false}, // the redo log of the runs without drops
		{"redo log", redo, 1_000_000, 2<<30 - 1, true},
	} {
		if got := tc.needs(tc.devices, tc.size); got != tc.want {
			t.Errorf("%s: needs(%d devices, %d bytes) = %v, want %v", tc.name, tc.devices, tc.size, got, tc.want)
		}
	}
}

// innodbStore is a store on InnoDB (as MariaDB's).
type innodbStore struct {
	store.Store // not called
	pool, log   int64
}

func (i innodbStore) InnoDBSizes(context.Context) (int64, int64, error) { return i.pool, i.log, nil }

func (i innodbStore) Extras() store.Extras { return store.Extras{InnoDBSizes: i.InnoDBSizes} }

// Each warning is logged at start for a large fleet on a small setting,
// the buffer pool's with the advised size, and not otherwise.
func TestAdviseInnoDB(t *testing.T) {
	const poolWarning, logWarning = "MariaDB buffer pool too small for this fleet", "MariaDB redo log too small for this fleet"
	for _, tc := range []struct {
		devices           int
		pool, log         int64
		warnPool, warnLog bool
	}{
		{1_000_000, 128 << 20, 96 << 20, true, true}, // the defaults
		{1_000_000, 2 << 30, 96 << 20, false, true},
		{1_000_000, 128 << 20, 2 << 30, true, false},
		{1_000_000, 2 << 30, 2 << 30, false, false},
		{10_000, 128 << 20, 96 << 20, false, false},
	} {
		var out bytes.Buffer
		s := &Server{store: innodbStore{pool: tc.pool, log: tc.log}, log: slog.New(slog.NewTextHandler(&out, nil))}
		s.adviseDatabase(context.Background(), tc.devices)
		logged := out.String()
		if got := strings.Contains(logged, poolWarning); got != tc.warnPool {
			t.Errorf("%d devices, pool %d: warned %v, want %v; log: %s", tc.devices, tc.pool, got, tc.warnPool, logged)
		}
		if got := strings.Contains(logged, logWarning); got != tc.warnLog {
			t.Errorf("%d devices, redo log %d: warned %v, want %v; log: %s", tc.devices, tc.log, got, tc.warnLog, logged)
		}
		if tc.warnPool && !strings.Contains(logged, "advice_mb=1953") {
			t.Errorf("the warning does not give the advised size (2 KiB per device): %s", logged)
		}
	}
}
