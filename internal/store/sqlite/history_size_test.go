package sqlite

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/drover/drover/internal/fleet"
	"github.com/drover/drover/internal/store/internal/samplegen"
)

// TestHistorySize loads an emulated day of history for
// DROVER_HISTORY_MEASURE devices (the samples PostgreSQL's
// TestHistorySizeAndSpeed loads), archives it and reports bytes a sample
// on disk: in the open partitions of the database, then in the archive
// (docs/performance.md).
func TestHistorySize(t *testing.T) {
	devices, _ := strconv.Atoi(os.Getenv("DROVER_HISTORY_MEASURE"))
	if devices <= 0 {
		t.Skip("DROVER_HISTORY_MEASURE=<devices> measures")
	}
	defer setPeriod(10 * time.Minute)()
	ctx := context.Background()
	dir := t.TempDir()
	path := filepath.Join(dir, "d.db")
	s := openTest(t, path)
	start := time.Date(2026, 11, 2, 0, 0, 0, 0, time.UTC)
	const per = 432
	for id := uint64(1); id <= uint64(devices); {
		var b fleet.Batch
		for ; id <= uint64(devices) && len(b.Samples) < 20000; id++ {
			b.Samples = append(b.Samples, samplegen.Device(id, start, 200*time.Second, per, 9)...)
		}
		if err := s.Commit(ctx, &b); err != nil {
			t.Fatal(err)
		}
	}
	size := func() (main, archive int64) {
		for _, f := range []string{"d.db", "d.db-wal"} {
			if st, err := os.Stat(filepath.Join(dir, f)); err == nil {
				main += st.Size()
			}
		}
		for _, f := range []string{"d-history.db", "d-history.db-wal"} {
			if st, err := os.Stat(filepath.Join(dir, f)); err == nil {
				archive += st.Size()
			}
		}
		return
	}
	empty := filepath.Join(t.TempDir(), "e.db")
	e := openTest(t, empty)
	e.Close()
	st, _ := os.Stat(empty)
	s.Close()
	total := float64(devices * per)
	m, _ := size()
	t.Logf("%d samples; open partitions: %.1f bytes a sample (database file less an empty one)", devices*per, float64(m-st.Size())/total)
	s = openTest(t, path)
	if _, err := s.ArchiveClosedPartitions(ctx, start.Add(48*time.Hour)); err != nil {
		t.Fatal(err)
	}
	s.Close()
	_, a := size()
	t.Logf("archived: %.1f bytes a sample (the archive file)", float64(a)/total)
}
