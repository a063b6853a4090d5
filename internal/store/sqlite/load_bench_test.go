package sqlite

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/drover/drover/internal/fleet"
)

// BenchmarkLoad reads a fleet of $DROVER_BENCH_DEVICES devices (default
// 100,000), each with a state, as a server does at start; one op is one
// whole Load. Half the states are in the devices table (merged), half in
// the state log.
//
//	go test -run '^$' -bench Load -benchmem ./internal/store/sqlite/
func BenchmarkLoad(b *testing.B) {
	ctx := context.Background()
	n := benchEnv(b, "DROVER_BENCH_DEVICES", 100000)
	path := filepath.Join(b.TempDir(), "d.db")
	s, err := Open(ctx, path, false)
	if err != nil {
		b.Fatal(err)
	}
	var bt fleet.Batch
	now := time.Now()
	bt.Profiles = append(bt.Profiles, fleet.Profile{ID: 1, DeviceType: "t", Firmware: "f", Version: 1, Config: json.RawMessage(`{"a":1}`),
		PushInterval: 60, CreatedAt: now, UpdatedAt: now})
	for i := 1; i <= n; i++ {
		bt.Devices = append(bt.Devices, fleet.DeviceRecord{ID: uint64(i), MachineID: fmt.Sprintf("m-%d", i), DeviceType: "t",
			Model: "x", Firmware: "f", Serial: fmt.Sprintf("SN%d", i), TokenHash: make([]byte, 32), RegisteredAt: now})
		if i == n/2 {
			commitLoadBench(b, s, &bt)
			if err := s.MergeStateLog(ctx); err != nil {
				b.Fatal(err)
			}
		}
		addPush(&bt, uint64(i), i, "f")
	}
	commitLoadBench(b, s, &bt)
	if err := s.Close(); err != nil {
		b.Fatal(err)
	}
	if s, err = Open(ctx, path, false); err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	b.ResetTimer()
	for range b.N {
		got := 0
		if _, err := s.Load(ctx, fleet.LoadOptions{}, func(d fleet.DeviceRecord) error {
			if len(d.State.State) == 0 {
				return fmt.Errorf("device %d: no state", d.ID)
			}
			got++
			return nil
		}); err != nil {
			b.Fatal(err)
		}
		if got != n {
			b.Fatalf("loaded %d devices, want %d", got, n)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/device")
}

func commitLoadBench(b *testing.B, s *Store, bt *fleet.Batch) {
	if err := s.Commit(context.Background(), bt); err != nil {
		b.Fatal(err)
	}
	bt.Reset()
}
