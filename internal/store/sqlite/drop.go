package sqlite

import (
	"context"
	"database/sql"
	"strings"
	"time"
)

// Dropping a large table in one statement frees every one of its pages in
// one transaction of the writer the pushes' commits need: a merged state-log
// generation (a million rows of about a kilobyte) or an archived history
// partition held commits for seconds. dropGently deletes the rows first, a
// few thousand per transaction, resting as the merger does between them, and
// drops the empty table last.

var (
	// dropChunk is how many rows one transaction of dropGently deletes:
	// 1,000 rows of a state-log generation hold the writer (and the pushes'
	// commits) for about 35 ms, 5,000 held it for 180.
	dropChunk = int64(1000)
	// dropRest is how long dropGently rests after each transaction, in
	// multiples of the transaction's time.
	dropRest = 3
)

// dropGently empties table in short transactions of the writer, then drops
// it, reporting each transaction as work. Nothing may write to table meanwhile. Cancelled, it leaves the table
// partly emptied; calling it again goes on.
func (s *Store) dropGently(ctx context.Context, work, table string) error {
	for {
		var lo sql.NullInt64
		err := s.w.QueryRowContext(ctx, `SELECT min(rowid) FROM `+table).Scan(&lo)
		if isNoTable(err) {
			return nil
		}
		if err != nil {
			return err
		}
		if !lo.Valid {
			break
		}
		start := time.Now()
		res, err := s.w.ExecContext(ctx, `DELETE FROM `+table+` WHERE rowid < ?`, lo.Int64+dropChunk)
		s.reportUpkeep(work, affected(res, err), start, err)
		if err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Duration(dropRest) * time.Since(start)):
		}
	}
	start := time.Now()
	_, err := s.w.ExecContext(ctx, `DROP TABLE IF EXISTS `+table)
	s.reportUpkeep(work, 0, start, err)
	return err
}

// affected is the rows a statement changed, 0 if it failed.
func affected(res sql.Result, err error) int64 {
	if err != nil {
		return 0
	}
	n, _ := res.RowsAffected()
	return n
}

// tablesLike lists the main database's tables whose names start with prefix.
func (s *Store) tablesLike(ctx context.Context, prefix string) ([]string, error) {
	rows, err := s.w.QueryContext(ctx, `SELECT name FROM sqlite_master WHERE type = 'table' AND substr(name, 1, ?) = ?`,
		len(prefix), prefix)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var names []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			return nil, err
		}
		names = append(names, n)
	}
	return names, rows.Err()
}

// hasTable says whether the main database has table.
func (s *Store) hasTable(ctx context.Context, table string) (bool, error) {
	names, err := s.tablesLike(ctx, table)
	if err != nil {
		return false, err
	}
	for _, n := range names {
		if strings.EqualFold(n, table) {
			return true, nil
		}
	}
	return false, nil
}
