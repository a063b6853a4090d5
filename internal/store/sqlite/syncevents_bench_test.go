package sqlite

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/drover/drover/internal/alert"
)

// BenchmarkSyncEvents is the store's cost of a sync event (the first loop
// of the fleet test writes one per device) by how many events are sorted
// together before they are cut into transactions of 500, as the alert
// engine's Flush does: window 1,250 is 250 ms of a million devices' first
// pushes, 25,000 is 5 s. The table already holds $DROVER_BENCH_DEVICES
// events (default 500,000: the middle of the first loop), each of another
// device; one op is one event of a random device.
//
//	go test -run '^$' -bench SyncEvents -benchtime 100000x ./internal/store/sqlite/
func BenchmarkSyncEvents(b *testing.B) {
	devices := benchEnv(b, "DROVER_BENCH_DEVICES", 500_000)
	tmpl := syncEventsDB(b, devices)
	for _, window := range []int{500, 1250, 5000, 25_000, 100_000} {
		b.Run(fmt.Sprintf("window=%d", window), func(b *testing.B) {
			ctx := context.Background()
			s := openCopy(b, tmpl)
			rng := rand.New(rand.NewPCG(1, uint64(window)))
			var evs []alert.SyncEvent
			cpu0 := processCPU()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				evs = append(evs, alert.SyncEvent{DeviceID: rng.Uint64N(uint64(2*devices)) + 1, At: time.Now(), State: "synchronized", Applied: 1, Desired: 1})
				if len(evs) < window && i < b.N-1 {
					continue
				}
				slices.SortStableFunc(evs, func(a, b alert.SyncEvent) int { return cmp.Compare(a.DeviceID, b.DeviceID) })
				for part := range slices.Chunk(evs, 500) {
					if err := s.SaveSyncEvents(ctx, part); err != nil {
						b.Fatal(err)
					}
				}
				evs = evs[:0]
			}
			b.StopTimer()
			b.ReportMetric(float64((processCPU()-cpu0).Microseconds())/float64(b.N), "cpu-µs/op")
		})
	}
}

// syncEventsDB is a database holding one sync event for each of n devices
// (every other ID, so that new events fall between them), built once.
func syncEventsDB(b *testing.B, n int) string {
	path := filepath.Join(os.TempDir(), fmt.Sprintf("drover-bench-syncevents-%d.db", n))
	if _, err := os.Stat(path); err == nil {
		return path
	}
	ctx := context.Background()
	os.Remove(path + ".tmp")
	s, err := Open(ctx, path+".tmp", false)
	if err != nil {
		b.Fatal(err)
	}
	at := time.Now().Add(-time.Hour)
	for lo := 0; lo < n; lo += 50_000 {
		var evs []alert.SyncEvent
		for i := lo; i < lo+50_000 && i < n; i++ {
			evs = append(evs, alert.SyncEvent{DeviceID: uint64(2*i + 1), At: at, State: "synchronized", Applied: 1, Desired: 1})
		}
		if err := s.SaveSyncEvents(ctx, evs); err != nil {
			b.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		b.Fatal(err)
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		b.Fatal(err)
	}
	return path
}
