package sqlite

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/drover/drover/internal/fleet"
)

const benchState = `{"uptime":3600,"cpu":12.5,"load1":0.31,"mem_total":268435456,"mem_used":98304000,"disk_total":134217728,"disk_used":41943040,"temperature":47.5,"firmware":"6.3.5","interfaces":[{"name":"eth0","rx_bytes":1234567,"tx_bytes":7654321},{"name":"wwan0","rx_bytes":987654321,"tx_bytes":123456789}],"signal":{"rssi":-67,"rsrp":-95,"rsrq":-10,"sinr":12.4,"operator":"Vodafone CZ","technology":"LTE"},"extra":{"iccid":"8942031019123456789"}}`

// BenchmarkCommitPushes commits batches of 256 pushes (state + sample) of
// random devices out of 100,000, durably; one op is one push.
func BenchmarkCommitPushes(b *testing.B) { benchCommitPushes(b, 256) }

// BenchmarkCommitPushesSmall is BenchmarkCommitPushes with batches of 16,
// as a server that is far from saturated commits them.
func BenchmarkCommitPushesSmall(b *testing.B) { benchCommitPushes(b, 16) }

func benchCommitPushes(b *testing.B, batch int) {
	ctx := context.Background()
	s, err := Open(ctx, filepath.Join(b.TempDir(), "d.db"), true)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	const devices = 100000
	var reg fleet.Batch
	for i := 1; i <= devices; i++ {
		reg.Devices = append(reg.Devices, fleet.DeviceRecord{ID: uint64(i), MachineID: fmt.Sprintf("m-%d", i), DeviceType: "t",
			Firmware: "f", TokenHash: make([]byte, 32), RegisteredAt: time.Now()})
	}
	if err := s.Commit(ctx, &reg); err != nil {
		b.Fatal(err)
	}
	var bt fleet.Batch
	id := uint64(1)
	cpu0 := processCPU()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		id = (id*7919 + 13) % devices
		addPush(&bt, id+1, i, "f")
		if len(bt.States) == batch || i == b.N-1 {
			commitBench(b, s, &bt)
		}
	}
	b.StopTimer()
	// CPU time is what the shared 2-core machine lets us compare: the wall
	// time includes every fsync's wait and other processes' load.
	b.ReportMetric(float64((processCPU()-cpu0).Microseconds())/float64(b.N), "cpu-µs/op")
}

// processCPU is this process's user and system CPU time so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

var (
	benchCPU, benchTemp       = 12.5, 47.5
	benchUptime         int64 = 3600
)

// addPush appends a push of device id (state and sample) to bt.
func addPush(bt *fleet.Batch, id uint64, seq int, firmware string) {
	now := time.Now()
	bt.States = append(bt.States, fleet.StateRecord{DeviceID: id, Firmware: firmware, LastSeen: now, Seq: uint64(seq), State: json.RawMessage(benchState)})
	bt.Samples = append(bt.Samples, fleet.Sample{DeviceID: id, At: now, Seq: uint64(seq), CPU: &benchCPU, Temperature: &benchTemp, Uptime: &benchUptime})
}

// commitBench commits bt as fleet.WriteThrough does (with a timeout) and
// empties it.
func commitBench(b *testing.B, s *Store, bt *fleet.Batch) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	err := s.Commit(ctx, bt)
	cancel()
	if err != nil {
		b.Fatal(err)
	}
	bt.Reset()
}

// benchEnv is the positive integer in $name, or def when it is unset.
func benchEnv(b *testing.B, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		b.Fatalf("%s=%q: want a positive count", name, v)
	}
	return n
}

// openCopy opens a durable copy of the database tmpl, closed at the end.
func openCopy(b *testing.B, tmpl string) *Store {
	path := filepath.Join(b.TempDir(), "d.db")
	copyFile(b, tmpl, path)
	s, err := Open(context.Background(), path, true)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	return s
}
