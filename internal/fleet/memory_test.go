package fleet

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"runtime"
	"runtime/metrics"
	"slices"
	"testing"
	"time"
	"unsafe"

	"github.com/drover/drover/internal/protocol"
)

// emulatorLikeRegistration is device i's registration with a machine ID and
// serial like the emulator's.
func emulatorLikeRegistration(i int) protocol.RegisterRequest {
	h := sha256.Sum256(fmt.Appendf(nil, "drover-%d", i))
	return protocol.RegisterRequest{MachineID: hex.EncodeToString(h[:16]), DeviceType: "router", Model: "EMU-R1",
		Firmware: "7.4.2", Serial: fmt.Sprintf("EMU%08d", i), EnrollmentSecret: "sesame"}
}

// BenchmarkRegistryMemory registers b.N devices (emulator-like machine IDs
// and serials) in memory mode and reports the live heap per device: the
// registry's own cost, without the store, connections or GC headroom.
func BenchmarkRegistryMemory(b *testing.B) {
	ctx := context.Background()
	s, err := New(ctx, Stores{}, nil, Options{EnrollmentSecret: "sesame"})
	if err != nil {
		b.Fatal(err)
	}
	reqs := make([]protocol.RegisterRequest, b.N)
	for i := range reqs {
		reqs[i] = emulatorLikeRegistration(i)
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	b.ResetTimer()
	for i := range reqs {
		if _, err := s.Register(ctx, reqs[i]); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	runtime.GC()
	runtime.ReadMemStats(&after)
	b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/float64(b.N), "heap-bytes/device")
	runtime.KeepAlive(s)
	runtime.KeepAlive(reqs)
}

// BenchmarkRegistryGC registers b.N devices (memory mode, as
// BenchmarkRegistryMemory) and reports what one full collection costs with
// them live: the collector's CPU time and the wall time of runtime.GC, the
// median of 5. The registry is most of a server's live heap, so this is most
// of the mark work every cycle does at fleet scale.
func BenchmarkRegistryGC(b *testing.B) {
	ctx := context.Background()
	s, err := New(ctx, Stores{}, nil, Options{EnrollmentSecret: "sesame"})
	if err != nil {
		b.Fatal(err)
	}
	for i := range b.N {
		if _, err := s.Register(ctx, emulatorLikeRegistration(i)); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	sample := []metrics.Sample{{Name: "/cpu/classes/gc/total:cpu-seconds"}}
	var cpu, wall []float64
	for range 5 {
		metrics.Read(sample)
		before, start := sample[0].Value.Float64(), time.Now()
		runtime.GC()
		wall = append(wall, float64(time.Since(start).Microseconds())/1000)
		metrics.Read(sample)
		cpu = append(cpu, (sample[0].Value.Float64()-before)*1000)
	}
	slices.Sort(cpu)
	slices.Sort(wall)
	b.ReportMetric(cpu[2], "gc-cpu-ms")
	b.ReportMetric(wall[2], "gc-wall-ms")
	b.ReportMetric(0, "ns/op")
	runtime.KeepAlive(s)
}

// The registry holds one device struct per device: 256 bytes is a Go size
// class, 264 would take 288 (32 MB more for a million devices). A new field
// must make room.
func TestDeviceStructFitsItsSizeClass(t *testing.T) {
	if n := unsafe.Sizeof(device{}); n > 256 {
		t.Fatalf("device is %d bytes: more than the 256-byte size class", n)
	}
}
