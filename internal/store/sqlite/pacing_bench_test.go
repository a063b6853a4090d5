package sqlite

import (
	"context"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/drover/drover/internal/fleet"
)

// BenchmarkPacedCommits offers pushes (state + sample, each of a different
// device of a fleet whose every device has a state, as in loop 2 of the
// fleet test) at a fixed rate, $DROVER_BENCH_RATE a second (default 5,000),
// from many goroutines, to a fleet.WriteThrough over a durable copy of the
// database of BenchmarkCommitFleet ($DROVER_BENCH_DEVICES, default 100,000),
// once per commit interval of $DROVER_BENCH_INTERVALS (comma-separated
// durations, default "0,5ms,20ms"). One op is one push; it reports the
// process's CPU per push (the offering goroutines' included: the same for
// every interval), the mean pushes per commit, the pushes' latency (enqueue
// to acknowledgement), the rate reached and the slowest commit. The state
// log's merger is off: this measures the commits.
//
//	DROVER_BENCH_DEVICES=1000000 DROVER_BENCH_INTERVALS=5ms go test -run '^$' -bench PacedCommits -benchtime 30000x ./internal/store/sqlite/
func BenchmarkPacedCommits(b *testing.B) {
	devices := benchEnv(b, "DROVER_BENCH_DEVICES", 100_000)
	rate := benchEnv(b, "DROVER_BENCH_RATE", 5000)
	intervals := os.Getenv("DROVER_BENCH_INTERVALS")
	if intervals == "" {
		intervals = "0,5ms,20ms"
	}
	tmpl := benchDB(b, "fleet", devices, true)
	oldEvery := logCheckEvery
	logCheckEvery = 0
	b.Cleanup(func() { logCheckEvery = oldEvery })
	for _, v := range strings.Split(intervals, ",") {
		iv, err := time.ParseDuration(v)
		if err != nil || iv < 0 {
			b.Fatalf("DROVER_BENCH_INTERVALS: %q is not a duration", v)
		}
		b.Run("interval="+iv.String(), func(b *testing.B) { benchPaced(b, tmpl, devices, rate, iv) })
	}
}

func benchPaced(b *testing.B, tmpl string, devices, rate int, interval time.Duration) {
	if b.N > devices {
		b.Fatalf("-benchtime %dx: at most one push per device (%d)", b.N, devices)
	}
	s := openCopy(b, tmpl)
	var commits atomic.Int64
	var slowest time.Duration // only the committer writes it
	w := fleet.NewWriteThroughWith(s, fleet.WriteThroughOptions{CommitInterval: interval, Observe: func(n int, took time.Duration, err error) {
		if err != nil {
			b.Error(err)
		}
		commits.Add(1)
		slowest = max(slowest, took)
	}})
	const workers = 2048 // each waits for its push's commit, as a request handler does
	period := time.Second / time.Duration(rate)
	lat := make([]time.Duration, b.N)
	var next atomic.Int64
	var wg sync.WaitGroup
	cpu0 := processCPU()
	b.ResetTimer()
	start := time.Now()
	for range min(workers, b.N) {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= b.N {
					return
				}
				// Paces the load at rate: the load under test.
				time.Sleep(time.Until(start.Add(time.Duration(i) * period)))
				id := uint64(i)*7919%uint64(devices) + 1 // each device once
				t0 := time.Now()
				tk, err := w.Enqueue(func(bt *fleet.Batch) { addPush(bt, id, i, "7.4.2") })
				if err == nil {
					err = tk.Wait(context.Background())
				}
				if err != nil {
					b.Error(err)
					return
				}
				lat[i] = time.Since(t0)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if err := w.Close(context.Background()); err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64((processCPU()-cpu0).Microseconds())/float64(b.N), "cpu-µs/op")
	b.ReportMetric(float64(b.N)/float64(commits.Load()), "push/commit")
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "push/s")
	b.ReportMetric(float64(slowest.Microseconds())/1000, "max-commit-ms")
}
