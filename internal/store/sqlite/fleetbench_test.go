package sqlite

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/drover/drover/internal/fleet"
)

// BenchmarkCommitFleet commits pushes (state + sample) of random devices of a
// fleet whose every device has a state, in batches of 74 (the mean commit of
// the 1,000,000-device fleet test): one op is one push. The fleet's size is
// $DROVER_BENCH_DEVICES (default 100,000); the filled database is built once
// per size in $TMPDIR and copied for each run. It reports the process's CPU
// per push, the slowest commit and the share of commits over 100 ms.
// DROVER_BENCH_CHECKPOINTS=writer lets the writer checkpoint, as before
// checkpoint.go; DROVER_BENCH_ROTATE=N merges the state log every N pushes
// (statelog.go; the merges' CPU is in cpu-µs/op).
//
//	DROVER_BENCH_DEVICES=1000000 go test -run '^$' -bench CommitFleet -benchtime 200000x ./internal/store/sqlite/
func BenchmarkCommitFleet(b *testing.B) {
	oldRate := mergeRate
	mergeRate = 0 // merges run inside the pushes' loop here: their cost, not their pace
	b.Cleanup(func() { mergeRate = oldRate })
	devices := benchEnv(b, "DROVER_BENCH_DEVICES", 100_000)
	ctx := context.Background()
	tmpl := benchDB(b, "fleet", devices, true)
	if os.Getenv("DROVER_BENCH_CHECKPOINTS") == "writer" {
		ownCheckpoints = false
		defer func() { ownCheckpoints = true }()
	}
	if v := os.Getenv("DROVER_BENCH_ROTATE"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 1 {
			b.Fatalf("DROVER_BENCH_ROTATE=%q: want a positive count", v)
		}
		oldRows, oldEvery := logRotateRows, logCheckEvery
		logRotateRows, logCheckEvery = n, time.Second
		defer func() { logRotateRows, logCheckEvery = oldRows, oldEvery }()
	}
	s := openCopy(b, tmpl)
	var bt fleet.Batch
	id := uint64(1)
	var slowest time.Duration
	var commits, slow int
	cpu0 := processCPU()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		id = (id*7919 + 13) % uint64(devices)
		addPush(&bt, id+1, i, "f")
		if len(bt.States) == 74 || i == b.N-1 {
			start := time.Now()
			commitBench(b, s, &bt)
			took := time.Since(start)
			slowest = max(slowest, took)
			commits++
			if took > 100*time.Millisecond {
				slow++
			}
		}
	}
	b.StopTimer()
	if os.Getenv("DROVER_BENCH_ROTATE") != "" {
		start, c0 := time.Now(), processCPU()
		if err := s.MergeStateLog(ctx); err != nil { // the rest: a merge is part of each push's cost
			b.Fatal(err)
		}
		var left int
		s.w.QueryRowContext(ctx, `SELECT count(*) FROM state_logs`).Scan(&left)
		b.Logf("last merge: %v, %v CPU; generations left %d", time.Since(start).Round(time.Millisecond), (processCPU() - c0).Round(time.Millisecond), left)
	}
	b.ReportMetric(float64((processCPU()-cpu0).Microseconds())/float64(b.N), "cpu-µs/op")
	b.ReportMetric(float64(slowest.Microseconds())/1000, "max-commit-ms")
	b.ReportMetric(float64(slow)/float64(commits)*100, "%commits>100ms")
}

// benchDB is the database $TMPDIR/drover-bench-<name>-<n>.db of n devices
// (with states if states, as buildDB), built once.
func benchDB(b *testing.B, name string, n int, states bool) string {
	path := filepath.Join(os.TempDir(), fmt.Sprintf("drover-bench-%s-%d.db", name, n))
	if _, err := os.Stat(path); err != nil {
		buildDB(b, path+".tmp", n, states)
		if err := os.Rename(path+".tmp", path); err != nil {
			b.Fatal(err)
		}
	}
	return path
}

// buildDB writes a database of n registered devices, each with a state in
// the open state-log generation if states, else none (as after registration).
func buildDB(b *testing.B, path string, n int, states bool) {
	ctx := context.Background()
	os.Remove(path)
	s, err := Open(ctx, path, false)
	if err != nil {
		b.Fatal(err)
	}
	now := time.Now()
	for lo := 1; lo <= n; lo += 50_000 {
		var bt fleet.Batch
		for i := lo; i < lo+50_000 && i <= n; i++ {
			bt.Devices = append(bt.Devices, fleet.DeviceRecord{ID: uint64(i), MachineID: fmt.Sprintf("%032x", i*7919), DeviceType: "router",
				Model: "EMU-R1", Firmware: "7.4.2", Serial: fmt.Sprintf("EMU%08d", i), TokenHash: make([]byte, 32), RegisteredAt: now})
			if states {
				bt.States = append(bt.States, fleet.StateRecord{DeviceID: uint64(i), Firmware: "7.4.2", LastSeen: now, Seq: 1, State: json.RawMessage(benchState)})
			}
		}
		if err := s.Commit(ctx, &bt); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := s.w.ExecContext(ctx, `PRAGMA wal_checkpoint(TRUNCATE)`); err != nil {
		b.Fatal(err)
	}
	if err := s.Close(); err != nil {
		b.Fatal(err)
	}
	for _, suffix := range []string{"-wal", "-shm", ".lock"} {
		os.Remove(path + suffix)
	}
	os.Remove(archivePath(path)) // empty: Open makes a new one
}

func copyFile(b *testing.B, from, to string) {
	in, err := os.Open(from)
	if err != nil {
		b.Fatal(err)
	}
	defer in.Close()
	out, err := os.Create(to)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		b.Fatal(err)
	}
	if err := out.Close(); err != nil {
		b.Fatal(err)
	}
}
