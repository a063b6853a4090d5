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

const benchState = `{"uptime":3600,"cpu":12.5,"load1":0.31,"mem_total":268435456,"mem_used":98304000,"disk_total":134217728,"disk_used":41943040,"temperature":47.5,"firmware":"6.3.5","interfaces":[{"name":"eth0","rx_bytes":1234567,"tx_bytes":7654321},{"name":"wwan0","rx_bytes":987654321,"tx_bytes":123456789}],"signal":{"rssi":-67,"rsrp":-95,"rsrq":-10,"sinr":12.4,"operator":"Vodafone CZ","technology":"LTE"},"extra":{"iccid":"8942031019123456789"}}`

// BenchmarkCommitPushes commits batches of 256 pushes (state + sample) of
// random devices out of 100,000, durably; one op is one push.
func BenchmarkCommitPushes(b *testing.B) {
	ctx := context.Background()
	s, err := Open(ctx, filepath.Join(b.TempDir(), "d.db"), true)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	const devices, batch = 100000, 256
	var reg fleet.Batch
	for i := 1; i <= devices; i++ {
		reg.Devices = append(reg.Devices, fleet.DeviceRecord{ID: uint64(i), MachineID: fmt.Sprintf("m-%d", i), DeviceType: "t",
			Firmware: "f", TokenHash: make([]byte, 32), RegisteredAt: time.Now()})
	}
	if err := s.Commit(ctx, &reg); err != nil {
		b.Fatal(err)
	}
	cpu, temp := 12.5, 47.5
	var uptime int64 = 3600
	var bt fleet.Batch
	id := uint64(1)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		id = (id*7919 + 13) % devices
		now := time.Now()
		bt.States = append(bt.States, fleet.StateRecord{DeviceID: id + 1, Firmware: "f", LastSeen: now, Seq: uint64(i), State: json.RawMessage(benchState)})
		bt.Samples = append(bt.Samples, fleet.Sample{DeviceID: id + 1, At: now, Seq: uint64(i), CPU: &cpu, Temperature: &temp, Uptime: &uptime})
		if len(bt.States) == batch || i == b.N-1 {
			if err := s.Commit(ctx, &bt); err != nil {
				b.Fatal(err)
			}
			bt.Reset()
		}
	}
}
