package sqlcommon

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/drover/drover/internal/alert"
	"github.com/drover/drover/internal/fleet"
	"github.com/drover/drover/internal/sessions"
)

// Aux implements alert.Store, fleet.LabelStore and sessions.Store on the
// tables of each adapter's alerts/labels/sessions migrations. Deleted IDs
// are remembered in id_marks, so that they are never handed out again.
type Aux struct {
	R *sql.DB // reads
	W *sql.DB // writes (SQLite's one writer; the same pool elsewhere)
	D Dialect
	// Writable, if set, is asked before every write: the instance lock.
	Writable func() error
}

var (
	_ alert.Store      = (*Aux)(nil)
	_ fleet.LabelStore = (*Aux)(nil)
	_ sessions.Store   = (*Aux)(nil)
)

// exec runs one write.
func (a *Aux) exec(ctx context.Context, q string, args ...any) (sql.Result, error) {
	if a.Writable != nil {
		if err := a.Writable(); err != nil {
			return nil, err
		}
	}
	return a.W.ExecContext(ctx, q, args...)
}

// tx runs fn in a write transaction.
func (a *Aux) tx(ctx context.Context, fn func(tx *sql.Tx) error) error {
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
func (a *Aux) execEach(ctx context.Context, q string, n int, args func(i int) ([]any, error)) error {
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
func (a *Aux) mark(ctx context.Context, tx *sql.Tx, kind string, id uint64) error {
	_, err := tx.ExecContext(ctx, a.D.q(`UPDATE id_marks SET high = ? WHERE kind = ? AND high < ?`), id, kind, id)
	return err
}

// maxID is the larger of table's highest ID and kind's high-water mark.
func (a *Aux) maxID(ctx context.Context, table, kind string) (uint64, error) {
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

// LoadRules implements alert.Store.
func (a *Aux) LoadRules(ctx context.Context) ([]alert.Rule, error) {
	rows, err := a.R.QueryContext(ctx, `SELECT spec FROM alert_rules ORDER BY id`)
	if err != nil {
		return nil, err
	}
	return scanJSON[alert.Rule](rows, "alert rule")
}

// scanJSON decodes rows of one JSON column.
func scanJSON[T any](rows *sql.Rows, what string) ([]T, error) {
	defer rows.Close()
	out := []T{}
	for rows.Next() {
		var b []byte
		if err := rows.Scan(&b); err != nil {
			return nil, err
		}
		var v T
		if err := json.Unmarshal(b, &v); err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

// MaxRuleID implements alert.Store.
func (a *Aux) MaxRuleID(ctx context.Context) (uint64, error) {
	return a.maxID(ctx, "alert_rules", "rule")
}

// SaveRule implements alert.Store.
func (a *Aux) SaveRule(ctx context.Context, r alert.Rule) error {
	spec, err := json.Marshal(r)
	if err != nil {
		return err
	}
	_, err = a.exec(ctx, a.D.q(`INSERT INTO alert_rules (id, spec) VALUES (?, ?)`+a.D.upsert("id", "spec")), r.ID, string(spec))
	return err
}

// DeleteRule implements alert.Store.
func (a *Aux) DeleteRule(ctx context.Context, id uint64) error {
	return a.tx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, a.D.q(`DELETE FROM alert_rules WHERE id = ?`), id)
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return alert.ErrNotFound
		}
		return a.mark(ctx, tx, "rule", id)
	})
}

// SaveEvents implements alert.Store.
func (a *Aux) SaveEvents(ctx context.Context, evs []alert.Event) error {
	q := `INSERT INTO alert_events (id, rule_id, device_id, cleared_at, body) VALUES (?, ?, ?, ?, ?)` + a.D.upsert("id", "cleared_at", "body")
	return a.execEach(ctx, q, len(evs), func(i int) ([]any, error) {
		e := &evs[i]
		body, err := json.Marshal(e)
		if err != nil {
			return nil, err
		}
		var cleared *int64
		if e.ClearedAt != nil {
			ms := e.ClearedAt.UnixMilli()
			cleared = &ms
		}
		return []any{e.ID, e.RuleID, e.DeviceID, cleared, string(body)}, nil
	})
}

// Events implements alert.Store.
func (a *Aux) Events(ctx context.Context, q alert.EventQuery) ([]alert.Event, error) {
	var where []string
	var args []any
	if q.DeviceID != 0 {
		where, args = append(where, "device_id = ?"), append(args, q.DeviceID)
	}
	if q.RuleID != 0 {
		where, args = append(where, "rule_id = ?"), append(args, q.RuleID)
	}
	if q.Active {
		where = append(where, "cleared_at IS NULL")
	}
	if q.Before != 0 {
		where, args = append(where, "id < ?"), append(args, q.Before)
	}
	query := `SELECT body FROM alert_events`
	if len(where) > 0 {
		query += " WHERE " + strings.Join(where, " AND ")
	}
	query += " ORDER BY id DESC LIMIT ?"
	args = append(args, q.EffectiveLimit())
	rows, err := a.R.QueryContext(ctx, a.D.q(query), args...)
	if err != nil {
		return nil, err
	}
	return scanJSON[alert.Event](rows, "alert event")
}

// MaxEventID implements alert.Store: pruned events' IDs count too.
func (a *Aux) MaxEventID(ctx context.Context) (uint64, error) {
	return a.maxID(ctx, "alert_events", "event")
}

// SaveSyncEvents implements alert.Store.
func (a *Aux) SaveSyncEvents(ctx context.Context, evs []alert.SyncEvent) error {
	q := `INSERT INTO sync_events (device_id, at, state, applied, desired, error) VALUES (?, ?, ?, ?, ?, ?)`
	return a.execEach(ctx, q, len(evs), func(i int) ([]any, error) {
		e := &evs[i]
		return []any{e.DeviceID, e.At.UnixMilli(), e.State, e.Applied, e.Desired, []byte(e.Error)}, nil
	})
}

// SyncEvents implements alert.Store.
func (a *Aux) SyncEvents(ctx context.Context, deviceID uint64, limit int) ([]alert.SyncEvent, error) {
	if limit <= 0 {
		limit = 100
	}
	rows, err := a.R.QueryContext(ctx, a.D.q(`SELECT at, state, applied, desired, error FROM sync_events WHERE device_id = ?
		ORDER BY at DESC, `+a.D.RowID+` DESC LIMIT ?`), deviceID, limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []alert.SyncEvent{}
	for rows.Next() {
		e := alert.SyncEvent{DeviceID: deviceID}
		var at int64
		var state, msg []byte
		if err := rows.Scan(&at, &state, &e.Applied, &e.Desired, &msg); err != nil {
			return nil, err
		}
		e.At, e.State, e.Error = time.UnixMilli(at).UTC(), string(state), string(msg)
		out = append(out, e)
	}
	return out, rows.Err()
}

// PruneEvents implements alert.Store, in chunks so that it never holds the
// writer for long. The highest event ID is marked first: a pruned ID is
// never handed out again.
func (a *Aux) PruneEvents(ctx context.Context, before time.Time) (int64, error) {
	top, err := a.MaxEventID(ctx)
	if err != nil {
		return 0, err
	}
	if err := a.tx(ctx, func(tx *sql.Tx) error { return a.mark(ctx, tx, "event", top) }); err != nil {
		return 0, err
	}
	ms := before.UnixMilli()
	var total int64
	for _, q := range []string{
		a.D.deleteSome("alert_events", "cleared_at < ?", 10000),
		a.D.deleteSome("sync_events", "at < ?", 10000),
	} {
		for {
			res, err := a.exec(ctx, a.D.q(q), ms)
			if err != nil {
				return total, err
			}
			n, _ := res.RowsAffected()
			total += n
			if n < 10000 {
				break
			}
		}
	}
	return total, nil
}

// Setting implements alert.Store.
func (a *Aux) Setting(ctx context.Context, key string) (string, error) {
	var v []byte
	err := a.R.QueryRowContext(ctx, a.D.q(`SELECT value FROM settings WHERE name = ?`), key).Scan(&v)
	if errors.Is(err, sql.ErrNoRows) {
		return "", nil
	}
	return string(v), err
}

// PutSetting implements alert.Store.
func (a *Aux) PutSetting(ctx context.Context, key, value string) error {
	_, err := a.exec(ctx, a.D.q(`INSERT INTO settings (name, value) VALUES (?, ?)`+a.D.upsert("name", "value")), key, value)
	return err
}

// LoadLabels implements fleet.LabelStore.
func (a *Aux) LoadLabels(ctx context.Context, each func(deviceID uint64, labelID uint16) error) ([]fleet.Label, error) {
	rows, err := a.R.QueryContext(ctx, `SELECT id, name FROM labels ORDER BY id`)
	if err != nil {
		return nil, err
	}
	var out []fleet.Label
	for rows.Next() {
		var l fleet.Label
		var name []byte
		if err := rows.Scan(&l.ID, &name); err != nil {
			rows.Close()
			return nil, err
		}
		l.Name = string(name)
		out = append(out, l)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	rows, err = a.R.QueryContext(ctx, `SELECT device_id, label_id FROM device_labels`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var dev uint64
		var id uint16
		if err := rows.Scan(&dev, &id); err != nil {
			return nil, err
		}
		if err := each(dev, id); err != nil {
			return nil, err
		}
	}
	return out, rows.Err()
}

// MaxLabelID implements fleet.LabelStore.
func (a *Aux) MaxLabelID(ctx context.Context) (uint16, error) {
	id, err := a.maxID(ctx, "labels", "label")
	return uint16(min(id, 1<<16-1)), err
}

// CreateLabel implements fleet.LabelStore.
func (a *Aux) CreateLabel(ctx context.Context, l fleet.Label) error {
	_, err := a.exec(ctx, a.D.q(`INSERT INTO labels (id, name) VALUES (?, ?)`), l.ID, l.Name)
	return err
}

// DeleteLabel implements fleet.LabelStore.
func (a *Aux) DeleteLabel(ctx context.Context, id uint16) error {
	return a.tx(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, a.D.q(`DELETE FROM device_labels WHERE label_id = ?`), id); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, a.D.q(`DELETE FROM labels WHERE id = ?`), id); err != nil {
			return err
		}
		return a.mark(ctx, tx, "label", uint64(id))
	})
}

// AssignLabel implements fleet.LabelStore.
func (a *Aux) AssignLabel(ctx context.Context, id uint16, deviceIDs []uint64, on bool) error {
	q := `DELETE FROM device_labels WHERE label_id = ? AND device_id = ?`
	if on {
		q = a.D.insertIgnore(`INSERT INTO device_labels (label_id, device_id) VALUES (?, ?)`)
	}
	return a.execEach(ctx, q, len(deviceIDs), func(i int) ([]any, error) { return []any{id, deviceIDs[i]}, nil })
}

// SaveSession implements sessions.Store.
func (a *Aux) SaveSession(ctx context.Context, s sessions.Session) error {
	_, err := a.exec(ctx, a.D.q(`INSERT INTO sessions (id_hash, csrf, expires, user_name, credential) VALUES (?, ?, ?, ?, ?)`+
		a.D.upsert("id_hash", "csrf", "expires", "user_name", "credential")),
		s.Hash, s.CSRF, s.Expires.UnixMilli(), s.User, s.Credential)
	return err
}

// LoadSession implements sessions.Store.
func (a *Aux) LoadSession(ctx context.Context, hash []byte) (sessions.Session, error) {
	s := sessions.Session{Hash: hash}
	var csrf, user, cred []byte
	var expires int64
	err := a.R.QueryRowContext(ctx, a.D.q(`SELECT csrf, expires, user_name, credential FROM sessions WHERE id_hash = ?`), hash).Scan(&csrf, &expires, &user, &cred)
	if errors.Is(err, sql.ErrNoRows) {
		return sessions.Session{}, sessions.ErrNotFound
	}
	s.CSRF, s.Expires, s.User, s.Credential = string(csrf), time.UnixMilli(expires).UTC(), string(user), string(cred)
	return s, err
}

// DeleteSession implements sessions.Store.
func (a *Aux) DeleteSession(ctx context.Context, hash []byte) error {
	_, err := a.exec(ctx, a.D.q(`DELETE FROM sessions WHERE id_hash = ?`), hash)
	return err
}

// PruneSessions implements sessions.Store.
func (a *Aux) PruneSessions(ctx context.Context, now time.Time) (int64, error) {
	res, err := a.exec(ctx, a.D.q(`DELETE FROM sessions WHERE expires < ?`), now.UnixMilli())
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}
