package postgres

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/internal/fleet"
	"github.com/drover/drover/internal/store/dbtest"
	"github.com/drover/drover/internal/store/internal/samplegen"
)

// pushState is a push's state as the emulator's default template renders
// it (internal/emulator), with the sample's values.
func pushState(m *fleet.Sample, idx int) []byte {
	rx, tx := *m.RxBytes/2, *m.TxBytes/2
	return fmt.Appendf(nil, `{"uptime":%d,"cpu":%.1f,"load1":%.2f,"mem_total":268435456,"mem_used":%d,"disk_total":134217728,`+
		`"disk_used":%d,"temperature":%.1f,"firmware":"1.0.0","interfaces":[`+
		`{"name":"eth0","rx_bytes":%d,"tx_bytes":%d,"rx_packets":%d,"tx_packets":%d},`+
		`{"name":"eth1","rx_bytes":0,"tx_bytes":0,"rx_packets":0,"tx_packets":0},`+
		`{"name":"wwan0","rx_bytes":%d,"tx_bytes":%d,"rx_packets":%d,"tx_packets":%d}],`+
		`"signal":{"rssi":%.0f,"rsrp":%.0f,"rsrq":%.0f,"sinr":%.1f,"operator":"%s","technology":"LTE"},`+
		`"extra":{"iccid":"8942%015d","imei":"35%013d","apn":"internet","hostname":"router-%d"}}`,
		*m.Uptime, *m.CPU, *m.CPU/25, *m.MemUsed, *m.DiskUsed, *m.Temperature,
		rx, tx, rx/900, tx/600, rx, tx, rx/900, tx/600,
		*m.RSSI, *m.RSRP, *m.RSRQ, *m.SINR, operators[idx%len(operators)], idx, idx, idx)
}

var operators = []string{"Vodafone CZ", "T-Mobile CZ", "O2 CZ", "Telekom DE", "Orange FR"}

// pgCPU is the CPU time of the test's PostgreSQL server: its live
// processes' (schedstat, ns) and its exited ones' (ticks, once reaped).
func pgCPU() time.Duration {
	pid := server.PID()
	var sum time.Duration
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
		if len(f) < 15 {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		p, _ := strconv.Atoi(e.Name())
		if p != pid && ppid != pid {
			continue
		}
		if ss, err := os.ReadFile("/proc/" + e.Name() + "/schedstat"); err == nil {
			ns, _ := strconv.ParseInt(strings.Fields(string(ss))[0], 10, 64)
			sum += time.Duration(ns)
		}
		if p == pid {
			var ticks int64
			for i := 13; i <= 14; i++ {
				v, _ := strconv.ParseInt(f[i], 10, 64)
				ticks += v
			}
			sum += time.Duration(ticks) * 10 * time.Millisecond // USER_HZ 100
		}
	}
	return sum
}

// pushFleet emulates a fleet's pushes: every device once a round, in a
// fixed order, each push a state and a sample.
type pushFleet struct {
	order []uint64
	round int
	pos   int
	clock time.Time
	step  time.Duration
}

// next returns a batch of k pushes as the write-through grouped commit
// makes it.
func (f *pushFleet) next(k int) *fleet.Batch {
	b := &fleet.Batch{}
	for range k {
		id := f.order[f.pos]
		m := samplegen.Device(id, f.clock, time.Second, 1, uint64(f.round))[0]
		m.At, m.Seq = f.clock.Truncate(time.Millisecond), uint64(f.round+1)
		b.States = append(b.States, fleet.StateRecord{DeviceID: id, Firmware: "1.0.0", LastSeen: f.clock, Seq: m.Seq,
			AppliedVersion: 1, State: pushState(&m, int(id))})
		b.Samples = append(b.Samples, m)
		f.clock = f.clock.Add(f.step)
		if f.pos++; f.pos == len(f.order) {
			f.pos, f.round = 0, f.round+1
		}
	}
	return b
}

type pushCost struct {
	cpu, wall time.Duration
	wal       int64
	pushes    int
}

func walLSN(t testing.TB, s *Store) string {
	var lsn string
	if err := s.pool.QueryRow(context.Background(), `SELECT pg_current_wal_lsn()::text`).Scan(&lsn); err != nil {
		t.Fatal(err)
	}
	return lsn
}

func walDiff(t testing.TB, s *Store, a, b string) int64 {
	var n int64
	if err := s.pool.QueryRow(context.Background(), `SELECT pg_wal_lsn_diff($1::pg_lsn, $2::pg_lsn)::bigint`, b, a).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func hotCounts(t testing.TB, s *Store) (upd, hot int64) {
	if err := s.pool.QueryRow(context.Background(), `SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = 'devices' AND schemaname = current_schema()`).Scan(&upd, &hot); err != nil {
		t.Fatal(err)
	}
	return upd, hot
}

// pushVariant is a way of committing pushes (pushvariants_test.go).
type pushVariant struct {
	name   string
	dsn    string // added to the DSN
	single bool   // a server without --cluster: Open, commits fenced by the instance lock
	setup  []string
	commit func(ctx context.Context, s *Store, b *fleet.Batch) error
}

type pushSubject struct {
	pushVariant
	s *Store
	f *pushFleet
}

// TestPushWriteCost measures what the pushes' writes cost PostgreSQL in
// write-through grouped commits of a cluster node: CPU of the server's
// processes, WAL bytes and wall time per push.
// DROVER_PUSH_MEASURE=<devices> (docs/results/write-path.md).
func TestPushWriteCost(t *testing.T) {
	devices, _ := strconv.Atoi(os.Getenv("DROVER_PUSH_MEASURE"))
	if devices <= 0 {
		t.Skip("DROVER_PUSH_MEASURE=<devices> measures")
	}
	defer func(e time.Duration) { compactEvery = e }(compactEvery)
	compactEvery = 0
	ctx := context.Background()
	srv := dbtest.Need(t, dbtest.Postgres, server)
	variants := pushVariants
	if v := os.Getenv("DROVER_PUSH_MEASURE_VARIANTS"); v != "" {
		variants = nil
		for _, name := range strings.Split(v, ",") {
			for _, pv := range pushVariants {
				if pv.name == name {
					variants = append(variants, pv)
				}
			}
		}
	}
	var subjects []*pushSubject
	for _, v := range variants {
		open := func(ctx context.Context, dsn string) (*Store, error) { return OpenCluster(ctx, dsn, "measure") }
		if v.single {
			open = Open
		}
		s, err := open(ctx, srv.NewDB(t)+v.dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		for _, q := range v.setup {
			if _, err := s.pool.Exec(ctx, q); err != nil {
				t.Fatal(err)
			}
		}
		subjects = append(subjects, &pushSubject{pushVariant: v, s: s})
	}
	// Checkpoints only where the test puts them (on the test binary's
	// throwaway server): the pushes measured fall between two.
	for _, q := range []string{`ALTER SYSTEM SET checkpoint_timeout = '1d'`, `ALTER SYSTEM SET max_wal_size = '16GB'`, `SELECT pg_reload_conf()`} {
		if _, err := subjects[0].s.pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	reg := time.Now()
	for _, sub := range subjects {
		for id := uint64(1); id <= uint64(devices); {
			var b fleet.Batch
			for ; id <= uint64(devices) && len(b.Devices) < 5000; id++ {
				b.Devices = append(b.Devices, fleet.DeviceRecord{ID: id, MachineID: fmt.Sprintf("%032x", id*2654435761), DeviceType: "router",
					Model: "RUT", Firmware: "1.0.0", Serial: fmt.Sprintf("S%09d", id), TokenHash: make([]byte, 32), RegisteredAt: reg})
			}
			if err := sub.s.Commit(ctx, &b); err != nil {
				t.Fatal(err)
			}
		}
		sub.f = &pushFleet{clock: time.Now(), step: time.Millisecond}
		for i := range devices {
			sub.f.order = append(sub.f.order, uint64(i*7919%devices+1))
		}
	}
	push := func(sub *pushSubject, k, n int) {
		for i := 0; i < n; i += k {
			if err := sub.commit(ctx, sub.s, sub.f.next(min(k, n-i))); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, sub := range subjects {
		push(sub, 32, devices) // every device's first state
	}
	// Every page written once since a checkpoint, and none after: the
	// phases measure the writes between two checkpoints (full page
	// images depend on the checkpoint interval, not on a push).
	if _, err := subjects[0].s.pool.Exec(ctx, `CHECKPOINT`); err != nil {
		t.Fatal(err)
	}
	for _, sub := range subjects {
		lsn := walLSN(t, sub.s)
		push(sub, 32, devices)
		t.Logf("%-10s after a checkpoint, every device's push: %d WAL bytes a push (full page images)", sub.name,
			walDiff(t, sub.s, lsn, walLSN(t, sub.s))/int64(devices))
	}
	n := devices
	if v, _ := strconv.Atoi(os.Getenv("DROVER_PUSH_MEASURE_PUSHES")); v > 0 {
		n = v
	}
	ks := []int{4, 32}
	if v, _ := strconv.Atoi(os.Getenv("DROVER_PUSH_MEASURE_K")); v > 0 {
		ks = []int{v}
	}
	// Slices of the variants take turns, so that the machine's load
	// weighs on every one alike.
	const slice = 256
	for _, k := range ks {
		got := make([]pushCost, len(subjects))
		for done := 0; done < n; done += slice {
			for i, sub := range subjects {
				lsn, cpu, start := walLSN(t, sub.s), pgCPU(), time.Now()
				push(sub, k, slice)
				c := &got[i]
				c.cpu += pgCPU() - cpu
				c.wall += time.Since(start)
				c.wal += walDiff(t, sub.s, lsn, walLSN(t, sub.s))
				c.pushes += slice
			}
		}
		for i, sub := range subjects {
			c := got[i]
			t.Logf("%-10s %2d pushes a commit: %6.1f µs PostgreSQL CPU, %4d WAL bytes, %6.1f µs wall a push", sub.name, k,
				float64(c.cpu.Nanoseconds())/1e3/float64(c.pushes), c.wal/int64(c.pushes), float64(c.wall.Nanoseconds())/1e3/float64(c.pushes))
		}
	}
	if os.Getenv("DROVER_PUSH_MEASURE_WALDUMP") != "" {
		for _, sub := range subjects {
			lsn := walLSN(t, sub.s)
			push(sub, 4, 4000)
			dump, _ := filepath.Glob("/usr/lib/postgresql/*/bin/pg_waldump")
			if len(dump) == 0 {
				t.Fatal("pg_waldump not found")
			}
			out, err := exec.Command(dump[len(dump)-1], "--stats=record", "-p", srv.Dir+"/data/pg_wal", "-s", lsn, "-e", walLSN(t, sub.s)).CombinedOutput()
			t.Logf("%s %s %v", sub.name, out, err)
		}
	}
	time.Sleep(11 * time.Second) // the backends report their statistics
	for _, sub := range subjects {
		upd, hot := hotCounts(t, sub.s)
		t.Logf("%-10s HOT %d of %d updates", sub.name, hot, upd)
	}
}
