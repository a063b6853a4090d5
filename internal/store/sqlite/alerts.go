package sqlite

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
)

// The Store also implements alert.Store and fleet.LabelStore
// (migration 002_alerts_labels.sql).
var (
	_ alert.Store      = (*Store)(nil)
	_ fleet.LabelStore = (*Store)(nil)
)

// LoadRules implements alert.Store.
func (s *Store) LoadRules(ctx context.Context) ([]alert.Rule, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT spec FROM alert_rules ORDER BY id`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []alert.Rule
	for rows.Next() {
		var spec string
		if err := rows.Scan(&spec); err != nil {
			return nil, err
		}
		var r alert.Rule
		if err := json.Unmarshal([]byte(spec), &r); err != nil {
			return nil, fmt.Errorf("alert rule: %w", err)
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// SaveRule implements alert.Store.
func (s *Store) SaveRule(ctx context.Context, r alert.Rule) error {
	spec, err := json.Marshal(r)
	if err != nil {
		return err
	}
	_, err = s.w.ExecContext(ctx, `INSERT INTO alert_rules (id, spec) VALUES (?, ?) ON CONFLICT (id) DO UPDATE SET spec = excluded.spec`,
		r.ID, string(spec))
	return err
}

// DeleteRule implements alert.Store.
func (s *Store) DeleteRule(ctx context.Context, id uint64) error {
	res, err := s.w.ExecContext(ctx, `DELETE FROM alert_rules WHERE id = ?`, id)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return alert.ErrNotFound
	}
	return nil
}

// SaveEvents implements alert.Store.
func (s *Store) SaveEvents(ctx context.Context, evs []alert.Event) (err error) {
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			tx.Rollback()
		}
	}()
	st, err := tx.PrepareContext(ctx, `INSERT INTO alert_events (id, rule_id, device_id, cleared_at, body) VALUES (?, ?, ?, ?, ?)
		ON CONFLICT (id) DO UPDATE SET cleared_at = excluded.cleared_at, body = excluded.body`)
	if err != nil {
		return err
	}
	for _, e := range evs {
		body, err := json.Marshal(e)
		if err != nil {
			return err
		}
		var cleared *int64
		if e.ClearedAt != nil {
			ms := e.ClearedAt.UnixMilli()
			cleared = &ms
		}
		if _, err := st.ExecContext(ctx, e.ID, e.RuleID, e.DeviceID, cleared, string(body)); err != nil {
			return fmt.Errorf("alert event %d: %w", e.ID, err)
		}
	}
	return tx.Commit()
}

// Events implements alert.Store.
func (s *Store) Events(ctx context.Context, q alert.EventQuery) ([]alert.Event, error) {
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
	rows, err := s.r.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []alert.Event{}
	for rows.Next() {
		var body string
		if err := rows.Scan(&body); err != nil {
			return nil, err
		}
		var e alert.Event
		if err := json.Unmarshal([]byte(body), &e); err != nil {
			return nil, fmt.Errorf("alert event: %w", err)
		}
		out = append(out, e)
	}
	return out, rows.Err()
}

// MaxEventID implements alert.Store.
func (s *Store) MaxEventID(ctx context.Context) (uint64, error) {
	var id sql.NullInt64
	err := s.r.QueryRowContext(ctx, `SELECT max(id) FROM alert_events`).Scan(&id)
	return uint64(id.Int64), err
}

// SaveSyncEvents implements alert.Store.
func (s *Store) SaveSyncEvents(ctx context.Context, evs []alert.SyncEvent) (err error) {
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			tx.Rollback()
		}
	}()
	st, err := tx.PrepareContext(ctx, `INSERT INTO sync_events (device_id, at, state, applied, desired, error) VALUES (?, ?, ?, ?, ?, ?)`)
	if err != nil {
		return err
	}
	for _, e := range evs {
		if _, err := st.ExecContext(ctx, e.DeviceID, e.At.UnixMilli(), e.State, e.Applied, e.Desired, e.Error); err != nil {
			return fmt.Errorf("sync event of device %d: %w", e.DeviceID, err)
		}
	}
	return tx.Commit()
}

// SyncEvents implements alert.Store.
func (s *Store) SyncEvents(ctx context.Context, deviceID uint64, limit int) ([]alert.SyncEvent, error) {
	if limit <= 0 {
		limit = 100
	}
	rows, err := s.r.QueryContext(ctx, `SELECT at, state, applied, desired, error FROM sync_events WHERE device_id = ?
		ORDER BY at DESC, rowid DESC LIMIT ?`, deviceID, limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []alert.SyncEvent{}
	for rows.Next() {
		e := alert.SyncEvent{DeviceID: deviceID}
		var at int64
		if err := rows.Scan(&at, &e.State, &e.Applied, &e.Desired, &e.Error); err != nil {
			return nil, err
		}
		e.At = time.UnixMilli(at).UTC()
		out = append(out, e)
	}
	return out, rows.Err()
}

// PruneEvents implements alert.Store, in chunks so that it never holds the
// writer for long.
func (s *Store) PruneEvents(ctx context.Context, before time.Time) (int64, error) {
	ms := before.UnixMilli()
	var total int64
	for _, q := range []string{
		`DELETE FROM alert_events WHERE id IN (SELECT id FROM alert_events WHERE cleared_at < ? LIMIT 10000)`,
		`DELETE FROM sync_events WHERE rowid IN (SELECT rowid FROM sync_events WHERE at < ? LIMIT 10000)`,
	} {
		for {
			res, err := s.w.ExecContext(ctx, q, ms)
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
func (s *Store) Setting(ctx context.Context, key string) (string, error) {
	var v string
	err := s.r.QueryRowContext(ctx, `SELECT value FROM settings WHERE key = ?`, key).Scan(&v)
	if errors.Is(err, sql.ErrNoRows) {
		return "", nil
	}
	return v, err
}

// PutSetting implements alert.Store.
func (s *Store) PutSetting(ctx context.Context, key, value string) error {
	_, err := s.w.ExecContext(ctx, `INSERT INTO settings (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value`,
		key, value)
	return err
}

// LoadLabels implements fleet.LabelStore.
func (s *Store) LoadLabels(ctx context.Context, each func(deviceID uint64, labelID uint16) error) ([]fleet.Label, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT id, name FROM labels ORDER BY id`)
	if err != nil {
		return nil, err
	}
	var out []fleet.Label
	for rows.Next() {
		var l fleet.Label
		if err := rows.Scan(&l.ID, &l.Name); err != nil {
			rows.Close()
			return nil, err
		}
		out = append(out, l)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	rows, err = s.r.QueryContext(ctx, `SELECT device_id, label_id FROM device_labels`)
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

// CreateLabel implements fleet.LabelStore.
func (s *Store) CreateLabel(ctx context.Context, l fleet.Label) error {
	_, err := s.w.ExecContext(ctx, `INSERT INTO labels (id, name) VALUES (?, ?)`, l.ID, l.Name)
	return err
}

// DeleteLabel implements fleet.LabelStore.
func (s *Store) DeleteLabel(ctx context.Context, id uint16) (err error) {
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			tx.Rollback()
		}
	}()
	if _, err = tx.ExecContext(ctx, `DELETE FROM device_labels WHERE label_id = ?`, id); err != nil {
		return err
	}
	if _, err = tx.ExecContext(ctx, `DELETE FROM labels WHERE id = ?`, id); err != nil {
		return err
	}
	return tx.Commit()
}

// AssignLabel implements fleet.LabelStore.
func (s *Store) AssignLabel(ctx context.Context, id uint16, deviceIDs []uint64, on bool) (err error) {
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			tx.Rollback()
		}
	}()
	q := `DELETE FROM device_labels WHERE label_id = ? AND device_id = ?`
	if on {
		q = `INSERT INTO device_labels (label_id, device_id) VALUES (?, ?) ON CONFLICT DO NOTHING`
	}
	st, err := tx.PrepareContext(ctx, q)
	if err != nil {
		return err
	}
	for _, dev := range deviceIDs {
		if _, err = st.ExecContext(ctx, id, dev); err != nil {
			return err
		}
	}
	return tx.Commit()
}
