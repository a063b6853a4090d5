package sqlite

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"
	"time"

	"github.com/drover/drover/internal/fleet"
)

// setPeriod sets the partition period for a test and returns the restore.
// The background indexer is off: tests index by calling it.
func setPeriod(d time.Duration) func() {
	old, every := partitionPeriod, archiveEvery
	partitionPeriod, archiveEvery = int64(d/time.Millisecond), 0
	return func() { partitionPeriod, archiveEvery = old, every }
}

func openTest(t *testing.T, path string) *Store {
	t.Helper()
	s, err := Open(context.Background(), path, false)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// tables lists the partition tables in db.
func tables(t *testing.T, db *sql.DB) map[string]bool {
	t.Helper()
	rows, err := db.Query(`SELECT name FROM sqlite_master WHERE type = 'table' AND name GLOB 'samples_[0-9m]*'`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]bool{}
	for rows.Next() {
		var n string
		rows.Scan(&n)
		out[n] = true
	}
	return out
}

// Samples go to one table per period; closed periods get their index, open
// ones stay without; reads span partitions in time order; a reopened store
// knows its partitions; retention drops whole partitions.
func TestHistoryPartitions(t *testing.T) {
	defer setPeriod(time.Minute)()
	oldChunk, oldStage := archiveChunkRows, archiveStageRows
	archiveChunkRows = 7  // each partition copied in several device ranges
	archiveStageRows = 11 // and read in several rowid ranges
	t.Cleanup(func() { archiveChunkRows, archiveStageRows = oldChunk, oldStage })
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "d.db")
	s := openTest(t, path)
	base := time.UnixMilli(600_000) // a partition start
	var b fleet.Batch
	for i := range 300 { // 5 partitions, 60 samples each, 3 devices
		b.Samples = append(b.Samples, fleet.Sample{DeviceID: uint64(i%3 + 1), At: base.Add(time.Duration(i) * time.Second), Seq: uint64(i)})
	}
	if err := s.Commit(ctx, &b); err != nil {
		t.Fatal(err)
	}
	if got := len(tables(t, s.r)); got != 5 {
		t.Fatalf("%d partitions, want 5", got)
	}
	// At base+3m30s+grace the first three periods are closed.
	n, err := s.ArchiveClosedPartitions(ctx, base.Add(3*time.Minute+30*time.Second+closeGrace))
	if err != nil || n != 3 {
		t.Fatalf("archived %d, %v; want 3", n, err)
	}
	live, arch := tables(t, s.r), tables(t, s.hist.ar)
	if len(live) != 2 || !live["samples_780000"] || !live["samples_840000"] {
		t.Fatalf("partitions left in the database: %v", live)
	}
	if len(arch) != 3 || !arch["samples_600000"] || !arch["samples_660000"] || !arch["samples_720000"] {
		t.Fatalf("archived partitions: %v", arch)
	}
	// A late sample of an archived partition is kept (in the legacy table)
	// and read in its place.
	late := fleet.Sample{DeviceID: 3, At: base.Add(30*time.Second + time.Millisecond), Seq: 1000}
	if err := s.Commit(ctx, &fleet.Batch{Samples: []fleet.Sample{late}}); err != nil {
		t.Fatal(err)
	}
	got, err := s.History(ctx, 3, fleet.HistoryQuery{From: base.Add(27 * time.Second), Limit: 3})
	if err != nil || len(got) != 3 || got[0].Seq != 29 || got[1].Seq != 1000 || got[2].Seq != 32 {
		t.Fatalf("late sample: %v %+v", err, got)
	}
	check := func(s *Store, q fleet.HistoryQuery, first, count int) {
		t.Helper()
		got, err := s.History(ctx, 2, q)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != count {
			t.Fatalf("%+v: %d samples, want %d", q, len(got), count)
		}
		for k, m := range got {
			if want := uint64(first + 3*k); m.Seq != want || m.DeviceID != 2 {
				t.Fatalf("%+v: sample %d is seq %d, want %d", q, k, m.Seq, want)
			}
		}
	}
	check(s, fleet.HistoryQuery{}, 1, 100)
	check(s, fleet.HistoryQuery{From: base.Add(100 * time.Second), To: base.Add(250 * time.Second)}, 100, 50)
	check(s, fleet.HistoryQuery{From: base.Add(50 * time.Second), Limit: 30}, 52, 30)
	s.Close()

	s = openTest(t, path)
	defer s.Close()
	check(s, fleet.HistoryQuery{}, 1, 100)
	if n, err := s.ArchiveClosedPartitions(ctx, base.Add(3*time.Minute+30*time.Second+closeGrace)); n != 0 || err != nil {
		t.Fatalf("archived again: %d, %v", n, err)
	}
	// Two whole partitions (120 samples) and 10 samples of the third.
	if n, err := s.PruneHistory(ctx, base.Add(130*time.Second), 1000); n != 131 || err != nil { // and the late one
		t.Fatalf("pruned %d, %v; want 131", n, err)
	}
	if got := len(tables(t, s.r)) + len(tables(t, s.hist.ar)); got != 3 {
		t.Fatalf("%d partitions after prune, want 3", got)
	}
	check(s, fleet.HistoryQuery{}, 130, 57) // seq 130, 133, …, 298
	// The archived third partition loses its 10 oldest samples in two calls.
	if n, err := s.PruneHistory(ctx, base.Add(140*time.Second), 6); n != 6 || err != nil {
		t.Fatalf("pruned %d, %v; want 6", n, err)
	}
	if n, err := s.PruneHistory(ctx, base.Add(140*time.Second), 6); n != 4 || err != nil {
		t.Fatalf("pruned %d, %v; want 4", n, err)
	}
	check(s, fleet.HistoryQuery{}, 142, 53) // seq 142, 145, …, 298
	// DropHistory drops whole partitions at any size, not the open ones.
	if n, err := s.DropHistory(ctx, base.Add(250*time.Second)); n != 100 || err != nil {
		t.Fatalf("dropped %d, %v; want 100", n, err)
	}
	check(s, fleet.HistoryQuery{}, 241, 20)
}

// Samples of the table `samples` written before partitions existed are read
// merged with the partitions', and pruned first.
func TestHistoryLegacy(t *testing.T) {
	defer setPeriod(time.Minute)()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "d.db")
	s := openTest(t, path)
	base := time.UnixMilli(600_000)
	for i := range 10 { // seq 0..9 at base+0..9 s, legacy
		if _, err := s.w.Exec(`INSERT INTO samples (device_id, at, seq) VALUES (1, ?, ?)`, base.Add(time.Duration(i)*time.Second).UnixMilli(), i); err != nil {
			t.Fatal(err)
		}
	}
	s.Close()
	s = openTest(t, path)
	defer s.Close()
	var b fleet.Batch
	for i := 5; i < 15; i++ { // seq 105..114 at base+5..14 s, partitioned
		b.Samples = append(b.Samples, fleet.Sample{DeviceID: 1, At: base.Add(time.Duration(i) * time.Second), Seq: uint64(100 + i)})
	}
	if err := s.Commit(ctx, &b); err != nil {
		t.Fatal(err)
	}
	got, err := s.History(ctx, 1, fleet.HistoryQuery{Limit: 8})
	if err != nil {
		t.Fatal(err)
	}
	want := []uint64{0, 1, 2, 3, 4, 5, 105, 6}
	if len(got) != len(want) {
		t.Fatalf("%d samples, want %d", len(got), len(want))
	}
	for i, m := range got {
		if m.Seq != want[i] {
			t.Fatalf("sample %d: seq %d, want %d", i, m.Seq, want[i])
		}
	}
	if n, err := s.PruneHistory(ctx, base.Add(7*time.Second), 4); n != 4 || err != nil {
		t.Fatalf("pruned %d, %v", n, err)
	}
	if n, err := s.PruneHistory(ctx, base.Add(7*time.Second), 4); n != 4 || err != nil { // 4..6 legacy, then 105
		t.Fatalf("pruned %d, %v", n, err)
	}
	if n, err := s.PruneHistory(ctx, base.Add(7*time.Second), 4); n != 1 || err != nil { // 106
		t.Fatalf("pruned %d, %v", n, err)
	}
	got, _ = s.History(ctx, 1, fleet.HistoryQuery{})
	if len(got) != 11 || got[0].Seq != 7 || got[1].Seq != 107 {
		t.Fatalf("after prune: %d samples, first %d", len(got), got[0].Seq)
	}
}

// An archived partition whose table was left in the main database (a crash
// during the gentle drop) is read from the archive only, and the next
// archiver call drops what is left. A sample committed while its partition
// is sealed for archiving goes to the legacy table and is kept.
func TestHistoryArchiveLeftoverAndSeal(t *testing.T) {
	defer setPeriod(time.Minute)()
	oldChunk := dropChunk
	dropChunk = 7 // several delete transactions per partition
	t.Cleanup(func() { dropChunk = oldChunk })
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "d.db")
	s := openTest(t, path)
	base := time.UnixMilli(600_000)
	var b fleet.Batch
	for i := range 120 { // 2 partitions, device 1
		b.Samples = append(b.Samples, fleet.Sample{DeviceID: 1, At: base.Add(time.Duration(i) * time.Second), Seq: uint64(i)})
	}
	if err := s.Commit(ctx, &b); err != nil {
		t.Fatal(err)
	}
	// Seal the first partition by hand: a commit now goes to legacy.
	s.seal(s.hist.parts[0], true)
	late := fleet.Sample{DeviceID: 1, At: base.Add(59*time.Second + 500*time.Millisecond), Seq: 500}
	if err := s.Commit(ctx, &fleet.Batch{Samples: []fleet.Sample{late}}); err != nil {
		t.Fatal(err)
	}
	if !s.hist.legacy {
		t.Fatal("a sample of a sealed partition did not go to the legacy table")
	}
	s.seal(s.hist.parts[0], false)
	if n, err := s.ArchiveClosedPartitions(ctx, base.Add(time.Minute+closeGrace)); n != 1 || err != nil {
		t.Fatalf("archived %d, %v; want 1", n, err)
	}
	if live := tables(t, s.r); live["samples_600000"] {
		t.Fatal("the archived partition's table is still in the main database")
	}
	// A leftover: the table is back in the main database with rows that
	// must not be read (they would double the partition's samples).
	if _, err := s.w.Exec(`CREATE TABLE samples_600000 (device_id INTEGER NOT NULL, at INTEGER NOT NULL, seq INTEGER NOT NULL, uptime INTEGER, cpu REAL,
		mem_used INTEGER, mem_total INTEGER, disk_used INTEGER, disk_total INTEGER, temperature REAL,
		rx_bytes INTEGER, tx_bytes INTEGER, rssi REAL, rsrp REAL, rsrq REAL, sinr REAL)`); err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		if _, err := s.w.Exec(`INSERT INTO samples_600000 (device_id, at, seq) VALUES (1, ?, ?)`, base.Add(time.Duration(i)*time.Second).UnixMilli(), 900+i); err != nil {
			t.Fatal(err)
		}
	}
	s.Close()
	s = openTest(t, path)
	defer s.Close()
	if !s.hist.parts[0].leftover {
		t.Fatal("open did not find the leftover table")
	}
	got, err := s.History(ctx, 1, fleet.HistoryQuery{To: base.Add(time.Minute)})
	if err != nil || len(got) != 61 {
		t.Fatalf("first partition read %d samples, %v; want 61 (60 and the sealed one's late sample)", len(got), err)
	}
	for _, m := range got {
		if m.Seq >= 900 {
			t.Fatalf("read a leftover row: %+v", m)
		}
	}
	if n, err := s.ArchiveClosedPartitions(ctx, base.Add(time.Minute+closeGrace)); n != 0 || err != nil {
		t.Fatalf("archived %d, %v; want 0 (only the leftover dropped)", n, err)
	}
	if tables(t, s.r)["samples_600000"] || s.hist.parts[0].leftover {
		t.Fatal("the leftover table was not dropped")
	}
}
