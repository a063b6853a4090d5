package storetest

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/drover/drover/internal/protocol"
)

// Bench measures registrations/s and pushes/s through fleet.Service on a
// backend, in write-through and write-back mode, with 32 concurrent
// callers per CPU. Write-back also reports how long the final flush took.
//
//	go test -run '^$' -bench Service -benchtime 20000x ./internal/store/sqlite/
func Bench(b *testing.B, newDB NewDB) {
	for _, mode := range []string{"write-through", "write-back"} {
		b.Run(mode+"/register", func(b *testing.B) { benchRegister(b, newDB(b), mode) })
		b.Run(mode+"/push", func(b *testing.B) { benchPush(b, newDB(b), mode) })
	}
}

func benchRegister(b *testing.B, open Opener, mode string) {
	e := newEnvEvery(b, open, mode, 5*time.Second)
	var n atomic.Int64
	b.SetParallelism(32)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := n.Add(1)
			_, err := e.svc.Register(e.ctx, protocol.RegisterRequest{MachineID: fmt.Sprintf("bench-%d", i), DeviceType: "rut-x11",
				Firmware: "7.04", Serial: fmt.Sprintf("SN%d", i), EnrollmentSecret: "s"})
			if err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	report(b, e, "regs/s")
}

const benchDevices = 10000

func benchPush(b *testing.B, open Opener, mode string) {
	// Registering through write-back is fastest; the restart flushes.
	e := newEnvEvery(b, open, "write-back", 5*time.Second)
	tokens := make([]string, benchDevices)
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := g; i < benchDevices; i += 16 {
				tokens[i] = e.register(fmt.Sprintf("bench-%d", i), "rut-x11", "7.04").Token
			}
		}()
	}
	wg.Wait()
	e.mode = mode
	e.restart()
	reqs := make([]protocol.PushRequest, 64)
	for i := range reqs {
		reqs[i] = pushReq(b, uint64(i), 0, "bench")
	}
	var n atomic.Int64
	b.SetParallelism(32)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := n.Add(1)
			p := reqs[i%int64(len(reqs))]
			p.Seq = uint64(i)
			if _, err := e.svc.Push(e.ctx, tokens[i%benchDevices], p); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	report(b, e, "pushes/s")
}

func report(b *testing.B, e *env, unit string) {
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), unit)
	start := time.Now()
	e.stop()
	b.ReportMetric(float64(time.Since(start).Milliseconds()), "close-ms")
}
