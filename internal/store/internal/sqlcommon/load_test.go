package sqlcommon

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/drover/drover/internal/fleet"

	_ "modernc.org/sqlite"
)

func loadTestDB(t *testing.T, n int) (*sql.DB, map[uint64]bool) {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "d.db")+"?_pragma=journal_mode(WAL)")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	for _, q := range []string{
		`CREATE TABLE profiles (id INTEGER PRIMARY KEY, device_type TEXT, firmware TEXT, version INTEGER, config TEXT,
			push_interval INTEGER, created_at INTEGER, updated_at INTEGER)`,
		`CREATE TABLE devices (id INTEGER PRIMARY KEY, machine_id TEXT NOT NULL, device_type TEXT NOT NULL, model TEXT NOT NULL,
			firmware TEXT NOT NULL, serial TEXT NOT NULL, token_hash BLOB NOT NULL, registered_at INTEGER NOT NULL,
			last_seen INTEGER NOT NULL, seq INTEGER NOT NULL, applied_version INTEGER NOT NULL, config_error TEXT NOT NULL, state BLOB)`,
	} {
		if _, err := db.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	ids := map[uint64]bool{}
	tx, _ := db.Begin()
	for i := 1; i <= n; i++ {
		if i%7 == 3 || (i > n/3 && i < n/2) {
			continue // gaps, and a range without devices
		}
		ids[uint64(i)] = true
		if _, err := tx.Exec(`INSERT INTO devices VALUES (?, ?, 't', 'm', 'f', 's', x'00', 1, ?, ?, 0, '', ?)`,
			i, fmt.Sprintf("m-%d", i), int64(i)*1e9, i, fmt.Sprintf(`{"i":%d}`, i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	return db, ids
}

// A parallel load over ranges of IDs gives every device once, with or
// without its state, and tells the highest ID first.
func TestLoadParallelRanges(t *testing.T) {
	old := loadRange
	loadRange = 64
	t.Cleanup(func() { loadRange = old })
	db, ids := loadTestDB(t, 3000)
	for _, par := range []int{1, 3} {
		for _, noStates := range []bool{false, true} {
			got := map[uint64]bool{}
			var expected uint64
			res, err := Loader{Query: QuerySQL(db), Parallel: par}.Load(context.Background(),
				fleet.LoadOptions{NoStates: noStates, Expect: func(n uint64) { expected = n }}, func(d fleet.DeviceRecord) error {
					if got[d.ID] {
						t.Errorf("device %d twice", d.ID)
					}
					got[d.ID] = true
					if want := fmt.Sprintf(`{"i":%d}`, d.ID); (string(d.State.State) == want) == noStates || d.State.Seq != d.ID {
						t.Errorf("parallel %d, no states %v: device %d: seq %d, state %q", par, noStates, d.ID, d.State.Seq, d.State.State)
					}
					return nil
				})
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(ids) || expected != 3000 || res.MaxDeviceID != 3000 {
				t.Errorf("parallel %d: %d devices (want %d), expected %d, max %d (want 3000)", par, len(got), len(ids), expected, res.MaxDeviceID)
			}
		}
	}
	// An error of each ends the load with it.
	stop := errors.New("stop")
	n := 0
	_, err := Loader{Query: QuerySQL(db), Parallel: 3}.Load(context.Background(), fleet.LoadOptions{}, func(fleet.DeviceRecord) error {
		if n++; n == 100 {
			return stop
		}
		return nil
	})
	if !errors.Is(err, stop) || n != 100 {
		t.Errorf("load stopped at device %d with %v, want 100 and %v", n, err, stop)
	}
}
