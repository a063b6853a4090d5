package sqlcommon

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
)

// Base is what each part of the shared SQL stands on: the pools, the
// dialect and the instance lock's check. Deleted IDs are remembered in
// id_marks (mark, maxID), so that they are never handed out again.
type Base struct {
	R *sql.DB // reads
	W *sql.DB // writes (SQLite's one writer; the same pool elsewhere)
	D Dialect
	// Writable, if set, is asked before every write: the instance lock.
	Writable func() error
}

// Tables are the stores of the tables every adapter shares, one part per
// purpose, each on a Base and in a file of its name: alert rules and
// events (alerts.go), settings, labels, dashboard sessions, users and
// tokens (access.go), remote commands, firmware, configuration layers
// (layers.go). An adapter embeds them.
type Tables struct {
	Base *Base
	Alerts
	Settings
	Labels
	Sessions
	Access
	Commands
	Firmware
	Layers
}

// NewTables returns the parts on b.
func NewTables(b *Base) Tables {
	return Tables{Base: b, Alerts: Alerts{b}, Settings: Settings{b}, Labels: Labels{b}, Sessions: Sessions{b},
		Access: Access{b}, Commands: Commands{b}, Firmware: Firmware{b}, Layers: Layers{b}}
}

// exec runs one write.
func (a *Base) exec(ctx context.Context, q string, args ...any) (sql.Result, error) {
	if a.Writable != nil {
		if err := a.Writable(); err != nil {
			return nil, err
		}
	}
	return a.W.ExecContext(ctx, q, args...)
}

// tx runs fn in a write transaction.
func (a *Base) tx(ctx context.Context, fn func(tx *sql.Tx) error) error {
	if a.Writable != nil {
		if err := a.Writable(); err != nil {
			return err
		}
	}
	tx, err := a.W.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		tx.Rollback()
		return err
	}
	return tx.Commit()
}

// execEach runs q (with ? placeholders) once per row, with the arguments
// args(i), in one transaction.
func (a *Base) execEach(ctx context.Context, q string, n int, args func(i int) ([]any, error)) error {
	return a.tx(ctx, func(tx *sql.Tx) error {
		st, err := tx.PrepareContext(ctx, a.D.q(q))
		if err != nil {
			return err
		}
		defer st.Close()
		// Rows run with a context that cannot be cancelled: with one that
		// can, modernc.org/sqlite starts a goroutine per statement to
		// interrupt it. ctx is checked every 256 rows instead.
		rowCtx := context.WithoutCancel(ctx)
		for i := range n {
			if i%256 == 0 {
				if err := ctx.Err(); err != nil {
					return err
				}
			}
			row, err := args(i)
			if err != nil {
				return err
			}
			if _, err := st.ExecContext(rowCtx, row...); err != nil {
				return fmt.Errorf("%.40s…: row %d: %w", q, i, err)
			}
		}
		return nil
	})
}

// mark raises kind's high-water mark to at least id, in tx.
func (a *Base) mark(ctx context.Context, tx *sql.Tx, kind string, id uint64) error {
	_, err := tx.ExecContext(ctx, a.D.q(`UPDATE id_marks SET high = ? WHERE kind = ? AND high < ?`), id, kind, id)
	return err
}

// maxID is the larger of table's highest ID and kind's high-water mark.
func (a *Base) maxID(ctx context.Context, table, kind string) (uint64, error) {
	var id, high sql.NullInt64
	if err := a.R.QueryRowContext(ctx, `SELECT max(id) FROM `+table).Scan(&id); err != nil {
		return 0, err
	}
	if err := a.R.QueryRowContext(ctx, a.D.q(`SELECT high FROM id_marks WHERE kind = ?`), kind).Scan(&high); err != nil &&
		!errors.Is(err, sql.ErrNoRows) {
		return 0, err
	}
	return uint64(max(id.Int64, high.Int64)), nil
}
