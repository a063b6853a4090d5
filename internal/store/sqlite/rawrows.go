package sqlite

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"io"

	"github.com/drover/drover/internal/store/internal/sqlcommon"
)

// streamRaw runs a query of Load's on a reader connection's driver
// connection and has fn read its rows. Through database/sql every column of
// every row is converted once more (a []byte copied again) under the rows'
// lock: a fifth of a large fleet's load.
func streamRaw(db *sql.DB) func(ctx context.Context, query string, fn func(sqlcommon.Rows) error) error {
	return func(ctx context.Context, query string, fn func(sqlcommon.Rows) error) error {
		conn, err := db.Conn(ctx)
		if err != nil {
			return err
		}
		defer conn.Close()
		return conn.Raw(func(dc any) error {
			qc, ok := dc.(driver.QueryerContext)
			if !ok {
				return fmt.Errorf("sqlite: driver connection %T cannot query with a context", dc)
			}
			rows, err := qc.QueryContext(ctx, query, nil)
			if err != nil {
				return err
			}
			r := &rawRows{rows: rows, vals: make([]driver.Value, len(rows.Columns()))}
			err = fn(r)
			if cerr := rows.Close(); err == nil {
				err = cerr
			}
			return err
		})
	}
}

// rawRows are a driver's rows as sqlcommon.Rows. Scan takes what the
// driver made (its strings and byte slices are fresh copies) into
// *int64, *string and *[]byte only; a NULL only into *[]byte, as nil.
type rawRows struct {
	rows driver.Rows
	vals []driver.Value
	err  error
}

func (r *rawRows) Next() bool {
	if r.err != nil {
		return false
	}
	if err := r.rows.Next(r.vals); err != nil {
		if err != io.EOF {
			r.err = err
		}
		return false
	}
	return true
}

func (r *rawRows) Scan(dest ...any) error {
	if len(dest) != len(r.vals) {
		return fmt.Errorf("sqlite: %d destinations for %d columns", len(dest), len(r.vals))
	}
	for i, v := range r.vals {
		ok := false
		switch d := dest[i].(type) {
		case *int64:
			*d, ok = v.(int64)
		case *uint64:
			var n int64
			n, ok = v.(int64)
			*d, ok = uint64(n), ok && n >= 0
		case *string:
			switch v := v.(type) {
			case string:
				*d, ok = v, true
			case []byte:
				*d, ok = string(v), true
			}
		case *[]byte:
			switch v := v.(type) {
			case []byte:
				*d, ok = v, true
			case string:
				*d, ok = []byte(v), true
			case nil:
				*d, ok = nil, true
			}
		}
		if !ok {
			return fmt.Errorf("sqlite: column %d: cannot scan %T into %T", i, v, dest[i])
		}
	}
	return nil
}

func (r *rawRows) Err() error { return r.err }

func (r *rawRows) Close() {}
