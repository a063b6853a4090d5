// Package samplegen makes history samples like those the emulator's default
// template pushes (internal/emulator: a cellular router every push
// interval): uptime in seconds since a boot up to 30 days before, random walks for CPU and
// temperature with one decimal, memory
// following CPU in MiB, disk used uniform in 41–42 MB, traffic counters
// growing by random amounts, signal values uniform, push times jittered by
// a few hundred milliseconds. The store's size and speed tests load them.
package samplegen

import (
	"math"
	"math/rand/v2"
	"time"

	"github.com/drover/drover/internal/fleet"
)

// Device returns n samples of device id, the first after start, every
// interval; seed fixes the walks.
func Device(id uint64, start time.Time, interval time.Duration, n int, seed uint64) []fleet.Sample {
	r := rand.New(rand.NewPCG(seed, id))
	at := start.Add(time.Duration(r.Int64N(int64(interval))))
	cpu, temp := 5+float64(r.IntN(30)), 38+float64(r.IntN(12))
	rx, tx := uint64(r.IntN(1<<30)), uint64(r.IntN(1<<28))
	boot := at.Add(-time.Duration(r.IntN(30*24*3600)) * time.Second)
	ptr := func(v int64) *int64 { return &v }
	tenths := func(v float64) *float64 { x := math.Round(v*10) / 10; return &x }
	out := make([]fleet.Sample, n)
	for i := range out {
		cpu = min(max(cpu+(r.Float64()-0.5)*10, 1), 99)
		temp = min(max(temp+(r.Float64()-0.5)*1.5+(40+cpu/4-temp)*0.1, 35), 85)
		rx += 2000 + uint64(r.IntN(400_000))
		tx += 1000 + uint64(r.IntN(100_000))
		at = at.Add(interval + time.Duration(r.IntN(400)-200)*time.Millisecond)
		up := int64(at.Sub(boot) / time.Second)
		rxs, txs := 2*rx, 2*tx // eth0 and wwan0
		out[i] = fleet.Sample{DeviceID: id, At: at.Truncate(time.Millisecond), Seq: uint64(i + 1), Uptime: ptr(up),
			CPU: tenths(cpu), MemUsed: ptr(80<<20 + int64(cpu)<<20), MemTotal: ptr(268435456),
			DiskUsed: ptr(41_000_000 + r.Int64N(1_000_001)), DiskTotal: ptr(134217728),
			Temperature: tenths(temp), RxBytes: &rxs, TxBytes: &txs,
			RSSI: tenths(float64(-85 + r.IntN(31))), RSRP: tenths(float64(-115 + r.IntN(36))), RSRQ: tenths(float64(-15 + r.IntN(11))),
			SINR: tenths(float64(r.IntN(251)) / 10)}
	}
	return out
}
