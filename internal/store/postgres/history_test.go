package postgres

import (
	"context"
	"errors"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/internal/fleet"
	"github.com/drover/drover/internal/store/dbtest"
	"github.com/drover/drover/internal/store/internal/samplegen"
)

var histStart = time.Date(2026, 11, 2, 0, 0, 0, 0, time.UTC)

func openHist(t testing.TB, dsn string) *Store {
	t.Helper()
	s, err := Open(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// rowsAndSamples counts history rows and the samples they hold.
func rowsAndSamples(t testing.TB, s *Store) (rows, samples int64) {
	t.Helper()
	if err := s.pool.QueryRow(context.Background(), `SELECT count(*), coalesce(sum(n), 0) FROM history`).Scan(&rows, &samples); err != nil {
		t.Fatal(err)
	}
	return rows, samples
}

// Compaction packs each device's rows of a closed partition into one; a
// compaction cut short (a crash) leaves the partition as it was, and the
// next one packs it: nothing lost, nothing twice.
func TestHistoryCompactionPacksAndResumes(t *testing.T) {
	defer func(c int, e time.Duration) { compactChunk, compactEvery = c, e }(compactChunk, compactEvery)
	compactChunk, compactEvery = 50, 0
	ctx := context.Background()
	dsn := dbtest.Need(t, dbtest.Postgres, server).NewDB(t)
	s := openHist(t, dsn)
	const devices, per = 40, 3 * 18 // 3 hours at 200 s: one partition
	want := map[uint64][]fleet.Sample{}
	var b fleet.Batch
	for id := uint64(1); id <= devices; id++ {
		want[id] = samplegen.Device(id, histStart, 200*time.Second, per, 1)
		b.Samples = append(b.Samples, want[id]...)
	}
	if err := s.Commit(ctx, &b); err != nil {
		t.Fatal(err)
	}
	if rows, n := rowsAndSamples(t, s); rows != devices*per || n != devices*per {
		t.Fatalf("before compaction: %d rows, %d samples", rows, n)
	}
	compactStopAfter = 2
	_, err := s.CompactHistory(ctx, histStart.Add(24*time.Hour))
	compactStopAfter = 0
	if !errors.Is(err, errCompactStopped) {
		t.Fatalf("compaction stopped after a chunk: %v", err)
	}
	var partial int64
	if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM `+packedName(histStart.UnixMilli())).Scan(&partial); err != nil || partial == 0 {
		t.Fatalf("partial packed table: %d rows, %v", partial, err)
	}
	s.Close() // a crash after two chunks
	s = openHist(t, dsn)
	defer s.Close()
	if rows, n := rowsAndSamples(t, s); rows != devices*per || n != devices*per {
		t.Fatalf("after a stopped compaction: %d rows, %d samples", rows, n)
	}
	// A late sample meanwhile is kept.
	late := samplegen.Device(1, histStart.Add(3*time.Hour+time.Minute), 200*time.Second, 1, 5)
	if err := s.Commit(ctx, &fleet.Batch{Samples: late}); err != nil {
		t.Fatal(err)
	}
	want[1] = append(want[1], late...)
	if got, err := s.CompactHistory(ctx, histStart.Add(24*time.Hour)); err != nil || got != 1 {
		t.Fatalf("compact: %d partitions, %v", got, err)
	}
	if rows, n := rowsAndSamples(t, s); rows != devices || n != devices*per+1 {
		t.Fatalf("after compaction: %d rows, %d samples; want one row a device", rows, n)
	}
	for id, ss := range want {
		got, err := s.History(ctx, id, fleet.HistoryQuery{Limit: 1000})
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != len(ss) || !got[0].At.Equal(ss[0].At) || *got[len(got)-1].RxBytes != *ss[len(ss)-1].RxBytes {
			t.Fatalf("device %d: %d samples, want %d", id, len(got), len(ss))
		}
	}
}

// Samples of the table of earlier versions (samples) stay readable and are
// pruned, merged with the partitions' in time order.
func TestHistoryLegacyTable(t *testing.T) {
	ctx := context.Background()
	dsn := dbtest.Need(t, dbtest.Postgres, server).NewDB(t)
	s := openHist(t, dsn)
	old := samplegen.Device(5, histStart, 200*time.Second, 10, 2)
	loadLegacy(t, s, old)
	s.Close()
	s = openHist(t, dsn)
	defer s.Close()
	newer := samplegen.Device(5, histStart.Add(time.Hour), 200*time.Second, 10, 3)
	if err := s.Commit(ctx, &fleet.Batch{Samples: newer}); err != nil {
		t.Fatal(err)
	}
	got, err := s.History(ctx, 5, fleet.HistoryQuery{})
	if err != nil || len(got) != 20 || !got[0].At.Equal(old[0].At) || !got[19].At.Equal(newer[9].At) {
		t.Fatalf("history over both tables: %d samples, %v", len(got), err)
	}
	n, err := s.PruneHistory(ctx, newer[2].At, 1000)
	if err != nil || n != 12 {
		t.Fatalf("prune over both tables: %d, %v; want 12", n, err)
	}
	if got, _ := s.History(ctx, 5, fleet.HistoryQuery{}); len(got) != 8 || !got[0].At.Equal(newer[2].At) {
		t.Fatalf("after prune: %d samples", len(got))
	}
}

// loadLegacy writes samples into the samples table as versions before
// migration 120 did.
func loadLegacy(t testing.TB, s *Store, ss []fleet.Sample) {
	t.Helper()
	const q = `INSERT INTO samples (device_id, at, seq, uptime, cpu, mem_used, mem_total, disk_used, disk_total,
			temperature, rx_bytes, tx_bytes, rssi, rsrp, rsrq, sinr)
		SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::bigint[], $4::bigint[], $5::float8[], $6::bigint[], $7::bigint[],
			$8::bigint[], $9::bigint[], $10::float8[], $11::bigint[], $12::bigint[], $13::float8[], $14::float8[], $15::float8[], $16::float8[])`
	for len(ss) > 0 {
		part := ss[:min(len(ss), 20000)]
		ss = ss[len(part):]
		n := len(part)
		dev, at, seq := make([]int64, n), make([]int64, n), make([]int64, n)
		var ints [7][]*int64
		var floats [6][]*float64
		for k := range ints {
			ints[k] = make([]*int64, n)
		}
		for k := range floats {
			floats[k] = make([]*float64, n)
		}
		for i, m := range part {
			dev[i], at[i], seq[i] = int64(m.DeviceID), m.At.UnixMilli(), int64(m.Seq)
			ints[0][i], ints[1][i], ints[2][i], ints[3][i], ints[4][i] = m.Uptime, m.MemUsed, m.MemTotal, m.DiskUsed, m.DiskTotal
			rx, tx := int64(*m.RxBytes), int64(*m.TxBytes)
			ints[5][i], ints[6][i] = &rx, &tx
			floats[0][i], floats[1][i], floats[2][i], floats[3][i], floats[4][i], floats[5][i] = m.CPU, m.Temperature, m.RSSI, m.RSRP, m.RSRQ, m.SINR
		}
		if _, err := s.pool.Exec(context.Background(), q, dev, at, seq, ints[0], floats[0], ints[1], ints[2], ints[3], ints[4],
			floats[1], ints[5], ints[6], floats[2], floats[3], floats[4], floats[5]); err != nil {
			t.Fatal(err)
		}
	}
}

// TestHistorySizeAndSpeed loads the same emulated day of history into the
// samples table (one row a sample, as before migration 120) and into the
// partitions, compacts them and compares bytes a sample on disk, indexes
// included, and the median time of reading one device's day. Run with
// DROVER_HISTORY_MEASURE=<devices> (docs/performance.md).
func TestHistorySizeAndSpeed(t *testing.T) {
	devices, _ := strconv.Atoi(os.Getenv("DROVER_HISTORY_MEASURE"))
	if devices <= 0 {
		t.Skip("DROVER_HISTORY_MEASURE=<devices> measures")
	}
	defer func(e time.Duration) { compactEvery = e }(compactEvery)
	compactEvery = 0
	ctx := context.Background()
	dsn := dbtest.Need(t, dbtest.Postgres, server).NewDB(t)
	s := openHist(t, dsn)
	defer s.Close()
	const per = 432 // a day at 200 s
	total := int64(devices) * per
	start := time.Now()
	var oldLoad, newLoad time.Duration
	for id := uint64(1); id <= uint64(devices); {
		var b fleet.Batch
		for ; id <= uint64(devices) && len(b.Samples) < 20000; id++ {
			b.Samples = append(b.Samples, samplegen.Device(id, histStart, 200*time.Second, per, 9)...)
		}
		t0 := time.Now()
		loadLegacy(t, s, b.Samples)
		t1 := time.Now()
		if err := s.Commit(ctx, &b); err != nil {
			t.Fatal(err)
		}
		oldLoad, newLoad = oldLoad+t1.Sub(t0), newLoad+time.Since(t1)
	}
	t.Logf("loaded %d samples twice in %v: samples table %v, partitions %v (batches of 20,000)", total,
		time.Since(start).Round(time.Second), oldLoad.Round(time.Millisecond), newLoad.Round(time.Millisecond))
	if _, err := s.pool.Exec(ctx, `VACUUM ANALYZE samples`); err != nil {
		t.Fatal(err)
	}
	if _, err := s.pool.Exec(ctx, `VACUUM ANALYZE history`); err != nil {
		t.Fatal(err)
	}
	size := func(q string) float64 {
		var b int64
		if err := s.pool.QueryRow(ctx, q).Scan(&b); err != nil {
			t.Fatal(err)
		}
		return float64(b) / float64(total)
	}
	const histSize = `SELECT sum(pg_total_relation_size(relid)) FROM pg_partition_tree('history') WHERE isleaf`
	oldB, rawB := size(`SELECT pg_total_relation_size('samples')`), size(histSize)

	day := func(read func(id uint64, q fleet.HistoryQuery) ([]fleet.Sample, error)) time.Duration {
		var ds []time.Duration
		for i := range 101 {
			id := uint64(i*7919)%uint64(devices) + 1
			q := fleet.HistoryQuery{From: histStart, To: histStart.Add(24*time.Hour + time.Second), Limit: 10000}
			t0 := time.Now()
			got, err := read(id, q)
			ds = append(ds, time.Since(t0))
			if err != nil || len(got) < per-1 {
				t.Fatalf("device %d: %d samples, %v", id, len(got), err)
			}
		}
		slices.Sort(ds)
		return ds[len(ds)/2]
	}
	newRead := func(id uint64, q fleet.HistoryQuery) ([]fleet.Sample, error) {
		s.hist.mu.Lock()
		s.hist.legacy = false // the partitions only
		s.hist.mu.Unlock()
		return s.History(ctx, id, q)
	}
	oldMed := day(func(id uint64, q fleet.HistoryQuery) ([]fleet.Sample, error) { return s.Samples.History(ctx, id, q) })
	rawMed := day(newRead)

	pgUsed0, goCPU0 := pgCPU(), processCPU()
	start = time.Now()
	if _, err := s.CompactHistory(ctx, histStart.Add(48*time.Hour)); err != nil {
		t.Fatal(err)
	}
	wall := time.Since(start)
	pgUsed, goCPU := pgCPU()-pgUsed0, processCPU()-goCPU0
	if _, err := s.pool.Exec(ctx, `VACUUM ANALYZE history`); err != nil {
		t.Fatal(err)
	}
	packedB := size(histSize)
	oldMed2 := day(func(id uint64, q fleet.HistoryQuery) ([]fleet.Sample, error) { return s.Samples.History(ctx, id, q) })
	packedMed := day(newRead)
	t.Logf("%d devices, %d samples (a day at 200 s each)", devices, total)
	t.Logf("bytes a sample, table and indexes: samples table %.1f, partitions raw %.1f, packed %.1f (%.3f of the samples table)",
		oldB, rawB, packedB, packedB/oldB)
	t.Logf("one device's day, median of 101: samples table %v / %v, partitions raw %v, packed %v",
		oldMed, oldMed2, rawMed, packedMed)
	t.Logf("compaction: %v wall, %.2f µs CPU a sample in drover, %.2f µs in PostgreSQL",
		wall.Round(time.Millisecond), float64(goCPU.Microseconds())/float64(total), float64(pgUsed.Microseconds())/float64(total))

	// Retention within the first packed partition: every row is cut.
	before := histStart.Add(2 * time.Hour)
	pgUsed0, goCPU0, start = pgCPU(), processCPU(), time.Now()
	var pruned int64
	for {
		n, err := s.PruneHistory(ctx, before, 10000)
		if err != nil {
			t.Fatal(err)
		}
		if pruned += n; n < 10000 {
			break
		}
	}
	wall = time.Since(start)
	pgUsed, goCPU = pgCPU()-pgUsed0, processCPU()-goCPU0
	t.Logf("retention cut through a packed partition: %d samples of %d rows in %v, %.2f µs CPU a sample in drover, %.2f µs in PostgreSQL",
		pruned, devices, wall.Round(time.Millisecond), float64(goCPU.Microseconds())/float64(pruned), float64(pgUsed.Microseconds())/float64(pruned))
}

func processCPU() time.Duration {
	b, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * 10 * time.Millisecond
}

// A push into the present partition has the next one created ahead, so
// that the first push of the next period does not wait for DDL.
func TestHistoryNextPartitionAhead(t *testing.T) {
	ctx := context.Background()
	s := openHist(t, dbtest.Need(t, dbtest.Postgres, server).NewDB(t))
	defer s.Close()
	now := time.Now()
	// The present partition exists already (created ahead a period ago).
	if err := s.createPart(ctx, partStart(now.UnixMilli())); err != nil {
		t.Fatal(err)
	}
	if err := s.loadParts(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(ctx, &fleet.Batch{Samples: []fleet.Sample{{DeviceID: 1, At: now, Seq: 1}}}); err != nil {
		t.Fatal(err)
	}
	next := partStart(now.UnixMilli()) + partitionPeriod
	var ok bool
	if err := s.pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, partName(next)).Scan(&ok); err != nil || !ok {
		t.Fatalf("next partition %s: %v %v", partName(next), ok, err)
	}
}

// Retention is exact for a sample written late into a packed partition
// (write-back retrying after an outage): it is pruned with the others.
func TestHistoryRetentionLateSample(t *testing.T) {
	defer func(e time.Duration) { compactEvery = e }(compactEvery)
	compactEvery = 0
	ctx := context.Background()
	s := openHist(t, dbtest.Need(t, dbtest.Postgres, server).NewDB(t))
	defer s.Close()
	ss := samplegen.Device(3, histStart, 200*time.Second, 36, 4) // 2 hours
	if err := s.Commit(ctx, &fleet.Batch{Samples: ss}); err != nil {
		t.Fatal(err)
	}
	if n, err := s.CompactHistory(ctx, histStart.Add(24*time.Hour)); err != nil || n != 1 {
		t.Fatalf("compact: %d, %v", n, err)
	}
	late := samplegen.Device(3, histStart, 200*time.Second, 1, 5)
	if err := s.Commit(ctx, &fleet.Batch{Samples: late}); err != nil {
		t.Fatal(err)
	}
	before := ss[20].At
	older := int64(20)
	if late[0].At.Before(before) {
		older++
	}
	var total int64
	for {
		n, err := s.PruneHistory(ctx, before, 3)
		if err != nil {
			t.Fatal(err)
		}
		if total += n; n < 3 {
			break
		}
	}
	got, err := s.History(ctx, 3, fleet.HistoryQuery{})
	if err != nil || total != older || len(got) != 16 || !got[0].At.Equal(before) {
		t.Fatalf("pruned %d (want %d), %d samples left (want 16), %v", total, older, len(got), err)
	}
}
