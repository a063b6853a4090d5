package sqlite

import (
	"bytes"
	"context"
	"database/sql"
	"path/filepath"
	"strings"
	"testing"

	"github.com/drover/drover/internal/fleet"
	"github.com/drover/drover/internal/store/internal/sqlcommon"
)

// Driver-level rows scan as database/sql would into the destinations Load
// uses, and refuse what database/sql refuses.
func TestRawRowsScan(t *testing.T) {
	ctx := context.Background()
	db, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "raw.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, `CREATE TABLE t (i INTEGER, s TEXT, b BLOB, n BLOB);
		INSERT INTO t VALUES (7, 'seven', x'0700', NULL), (-1, '', x'', NULL)`); err != nil {
		t.Fatal(err)
	}
	var (
		i     int64
		s     string
		b, n  []byte
		sb    []byte
		u     uint64
		calls int
	)
	err = streamRaw(db)(ctx, `SELECT i, s, b, n, s FROM t ORDER BY rowid LIMIT 1`, func(rows sqlcommon.Rows) error {
		for rows.Next() {
			calls++
			if err := rows.Scan(&i, &s, &b, &n, &sb); err != nil {
				return err
			}
		}
		return rows.Err()
	})
	if err != nil || calls != 1 {
		t.Fatalf("scan: %v after %d rows", err, calls)
	}
	if i != 7 || s != "seven" || !bytes.Equal(b, []byte{7, 0}) || n != nil || string(sb) != "seven" {
		t.Fatalf("scanned %d %q %x %x %q", i, s, b, n, sb)
	}
	for _, c := range []struct {
		query string
		dest  []any
		want  string
	}{
		{`SELECT n FROM t LIMIT 1`, []any{&s}, "cannot scan <nil> into *string"},
		{`SELECT n FROM t LIMIT 1`, []any{&i}, "cannot scan <nil> into *int64"},
		{`SELECT i FROM t WHERE i < 0`, []any{&u}, "cannot scan int64 into *uint64"},
		{`SELECT i, s FROM t LIMIT 1`, []any{&i}, "1 destinations for 2 columns"},
	} {
		err := streamRaw(db)(ctx, c.query, func(rows sqlcommon.Rows) error {
			if !rows.Next() {
				t.Fatalf("%s: no row: %v", c.query, rows.Err())
			}
			return rows.Scan(c.dest...)
		})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err %v, want %q", c.query, err, c.want)
		}
	}
	if err := streamRaw(db)(ctx, `SELECT nope FROM t`, func(sqlcommon.Rows) error { return nil }); err == nil {
		t.Error("a bad query: no error")
	}
}

// The load's readers, which map the file, close when the first Load ends.
func TestLoadReadersClose(t *testing.T) {
	s := openTest(t, filepath.Join(t.TempDir(), "drover.db"))
	defer s.Close()
	if s.loadR.Load() == nil {
		t.Fatal("no load readers after open")
	}
	if _, err := s.Load(context.Background(), fleet.LoadOptions{}, func(fleet.DeviceRecord) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if s.loadR.Load() != nil || s.readers() != s.r {
		t.Fatal("load readers still open after the first Load")
	}
}
