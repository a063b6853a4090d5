package sqlite

import (
	"cmp"
	"context"
	"slices"
	"testing"
	"time"

	"github.com/drover/drover/internal/alert"
	"github.com/drover/drover/internal/fleet"
)

// BenchmarkFirstPush compares the store's cost of a device's first push
// after registration (the fleet test's first loop) with a later push, in
// batches of 74 as BenchmarkCommitFleet ($DROVER_BENCH_BATCH: another
// size); one op is one push, each of a different device (b.N at most the
// fleet's size, $DROVER_BENCH_DEVICES, default 100,000). In "steady" every
// device already has a row in the open state-log generation, which the push
// rewrites (loops 2 and later); in "first" the devices are registered
// without a state and the push appends the device's row; "first+sync" adds
// the sync event each first push causes (arriving → synchronized), saved as
// the alert engine's Flush does: sorted, 500 per transaction.
//
//	go test -run '^$' -bench FirstPush -benchtime 50000x ./internal/store/sqlite/
func BenchmarkFirstPush(b *testing.B) {
	devices := benchEnv(b, "DROVER_BENCH_DEVICES", 100_000)
	withStates := benchDB(b, "fleet", devices, true)
	registered := benchDB(b, "registered", devices, false)
	batch := benchEnv(b, "DROVER_BENCH_BATCH", 74)
	b.Run("steady", func(b *testing.B) { benchPushes(b, withStates, devices, batch, false) })
	b.Run("first", func(b *testing.B) { benchPushes(b, registered, devices, batch, false) })
	b.Run("first+sync", func(b *testing.B) { benchPushes(b, registered, devices, batch, true) })
}

func benchPushes(b *testing.B, tmpl string, devices, batch int, syncEvents bool) {
	if b.N > devices {
		b.Fatalf("-benchtime %dx: at most one push per device (%d)", b.N, devices)
	}
	ctx := context.Background()
	s := openCopy(b, tmpl)
	var bt fleet.Batch
	var syncs []alert.SyncEvent
	cpu0 := processCPU()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		id := uint64(i)*7919%uint64(devices) + 1 // each device once
		addPush(&bt, id, i, "7.4.2")
		if syncEvents {
			syncs = append(syncs, alert.SyncEvent{DeviceID: id, At: time.Now(), State: "synchronized", Applied: 1, Desired: 1})
		}
		if len(bt.States) == batch || i == b.N-1 {
			commitBench(b, s, &bt)
		}
		if len(syncs) == 500 || i == b.N-1 && len(syncs) > 0 {
			slices.SortStableFunc(syncs, func(a, b alert.SyncEvent) int { return cmp.Compare(a.DeviceID, b.DeviceID) })
			if err := s.SaveSyncEvents(ctx, syncs); err != nil {
				b.Fatal(err)
			}
			syncs = syncs[:0]
		}
	}
	b.StopTimer()
	b.ReportMetric(float64((processCPU()-cpu0).Microseconds())/float64(b.N), "cpu-µs/op")
}
