package fleet

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"runtime"
	"testing"
	"unsafe"

	"github.com/drover/drover/internal/protocol"
)

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
		h := sha256.Sum256(fmt.Appendf(nil, "drover-%d", i))
		reqs[i] = protocol.RegisterRequest{MachineID: hex.EncodeToString(h[:16]), DeviceType: "router", Model: "EMU-R1",
			Firmware: "7.4.2", Serial: fmt.Sprintf("EMU%08d", i), EnrollmentSecret: "sesame"}
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

// The registry holds one device struct per device: 256 bytes is a Go size
// class, 264 would take 288 (32 MB more for a million devices). A new field
// must make room.
func TestDeviceStructFitsItsSizeClass(t *testing.T) {
	if n := unsafe.Sizeof(device{}); n > 256 {
		t.Fatalf("device is %d bytes: more than the 256-byte size class", n)
	}
}
