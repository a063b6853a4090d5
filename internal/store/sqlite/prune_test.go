package sqlite

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/drover/drover/internal/fleet"
)

// Pruning finds the cutoff by binary search over rowids, with gaps left by
// earlier prunes and by deleted rows in the middle.
func TestPruneByRowidWithGaps(t *testing.T) {
	defer setPeriod(time.Hour)() // every sample in partition samples_0
	ctx := context.Background()
	s, err := Open(ctx, filepath.Join(t.TempDir(), "d.db"), false)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	base := time.UnixMilli(1_000_000)
	var b fleet.Batch
	for i := range 1000 {
		b.Samples = append(b.Samples, fleet.Sample{DeviceID: uint64(i % 7), At: base.Add(time.Duration(i) * time.Second), Seq: uint64(i)})
	}
	if err := s.Commit(ctx, &b); err != nil {
		t.Fatal(err)
	}
	if _, err := s.w.Exec(`DELETE FROM samples_0 WHERE rowid BETWEEN 300 AND 420`); err != nil {
		t.Fatal(err)
	}
	count := func() (n int) {
		if err := s.r.QueryRow(`SELECT count(*) FROM samples_0`).Scan(&n); err != nil && !isNoTable(err) {
			t.Fatal(err)
		}
		return
	}
	total := 0
	for {
		n, err := s.PruneHistory(ctx, base.Add(600*time.Second), 100)
		if err != nil {
			t.Fatal(err)
		}
		total += int(n)
		if n < 100 {
			break
		}
	}
	// Samples 0..599 are older; 121 of them were already gone.
	if total != 600-121 || count() != 400 {
		t.Fatalf("pruned %d, %d left", total, count())
	}
	var minSeq int
	s.r.QueryRow(`SELECT min(seq) FROM samples_0`).Scan(&minSeq)
	if minSeq != 600 {
		t.Fatalf("oldest remaining seq %d, want 600", minSeq)
	}
	if n, _ := s.PruneHistory(ctx, base.Add(time.Hour), 10000); n != 400 || count() != 0 {
		t.Fatalf("prune all: %d, %d left", n, count())
	}
	if n, err := s.PruneHistory(ctx, base.Add(time.Hour), 10000); n != 0 || err != nil {
		t.Fatalf("prune empty: %d %v", n, err)
	}
}

// A path with URI metacharacters opens exactly that file.
func TestOddPath(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a#b?c%41")
	path := filepath.Join(dir, "d.db")
	s, err := Open(context.Background(), path, true)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("database not at %s: %v", path, err)
	}
}
