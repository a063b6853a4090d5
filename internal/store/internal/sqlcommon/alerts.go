package sqlcommon

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/drover/drover/internal/alert"
)

// Alerts implements alert.Store but its settings: alert rules, alert
// events and sync events, on the tables of each adapter's alerts
// migration (002 on SQLite, 011 elsewhere).
type Alerts struct{ *Base }

var _ alert.Store = struct {
	*Alerts
	*Settings
}{}

// LoadRules implements alert.Store.
func (a *Alerts) LoadRules(ctx context.Context) ([]alert.Rule, error) {
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
func (a *Alerts) MaxRuleID(ctx context.Context) (uint64, error) {
	return a.maxID(ctx, "alert_rules", "rule")
}

// SaveRule implements alert.Store.
func (a *Alerts) SaveRule(ctx context.Context, r alert.Rule) error {
	spec, err := json.Marshal(r)
	if err != nil {
		return err
	}
	_, err = a.exec(ctx, a.D.q(`INSERT INTO alert_rules (id, spec) VALUES (?, ?)`+a.D.upsert("id", "spec")), r.ID, string(spec))
	return err
}

// DeleteRule implements alert.Store.
func (a *Alerts) DeleteRule(ctx context.Context, id uint64) error {
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
func (a *Alerts) SaveEvents(ctx context.Context, evs []alert.Event) error {
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
func (a *Alerts) Events(ctx context.Context, q alert.EventQuery) ([]alert.Event, error) {
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
func (a *Alerts) MaxEventID(ctx context.Context) (uint64, error) {
	return a.maxID(ctx, "alert_events", "event")
}

// SaveSyncEvents implements alert.Store.
func (a *Alerts) SaveSyncEvents(ctx context.Context, evs []alert.SyncEvent) error {
	q := `INSERT INTO sync_events (device_id, at, state, applied, desired, error) VALUES (?, ?, ?, ?, ?, ?)`
	return a.execEach(ctx, q, len(evs), func(i int) ([]any, error) {
		e := &evs[i]
		return []any{e.DeviceID, e.At.UnixMilli(), e.State, e.Applied, e.Desired, []byte(e.Error)}, nil
	})
}

// SyncEvents implements alert.Store.
func (a *Alerts) SyncEvents(ctx context.Context, deviceID uint64, limit int) ([]alert.SyncEvent, error) {
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
func (a *Alerts) PruneEvents(ctx context.Context, before time.Time) (int64, error) {
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
