package sqlite

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/drover/drover/internal/fleet"
	"github.com/drover/drover/internal/protocol"
)

// BenchmarkFleetMemory registers b.N devices (emulator-like machine IDs and
// serials) into a fleet on SQLite in write-through mode, 64 at a time, has
// each push one router state, and reports the live heap and the process's
// RSS per device (both as increases over the empty fleet): the server's
// memory per device without its HTTP connections. One op is one device.
func BenchmarkFleetMemory(b *testing.B) {
	ctx := context.Background()
	st, err := Open(ctx, filepath.Join(b.TempDir(), "d.db"), true)
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	wt := fleet.NewWriteThrough(st, 0, nil)
	defer wt.Close(ctx)
	s, err := fleet.New(ctx, fleet.StoresOf(st), wt, fleet.Options{EnrollmentSecret: "sesame"})
	if err != nil {
		b.Fatal(err)
	}
	state, err := protocol.DecodePush([]byte(`{"seq":1,"config_version":0,"state":` + benchState + `}`))
	if err != nil {
		b.Fatal(err)
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	rss0 := rss(b)
	b.ResetTimer()
	var next atomic.Int64
	var wg sync.WaitGroup
	var failed atomic.Pointer[error]
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1) - 1
				if i >= int64(b.N) || failed.Load() != nil {
					return
				}
				h := sha256.Sum256(fmt.Appendf(nil, "drover-%d", i))
				resp, err := s.Register(ctx, protocol.RegisterRequest{MachineID: hex.EncodeToString(h[:16]), DeviceType: "router",
					Model: "EMU-R1", Firmware: "7.4.2", Serial: fmt.Sprintf("EMU%08d", i), EnrollmentSecret: "sesame"})
				if err == nil {
					_, err = s.Push(ctx, resp.Token, state)
				}
				if err != nil {
					failed.Store(&err)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	if p := failed.Load(); p != nil {
		b.Fatal(*p)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/float64(b.N), "heap-bytes/device")
	b.ReportMetric(float64(rss(b)-rss0)/float64(b.N), "rss-bytes/device")
	runtime.KeepAlive(s)
}

// rss is this process's resident set size in bytes.
func rss(b *testing.B) int64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		b.Skip("no /proc/self/status:", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				b.Fatal(err)
			}
			return kb << 10
		}
	}
	b.Skip("no VmRSS")
	return 0
}
