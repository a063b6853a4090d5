package batchutil

import (
	"context"
	"database/sql"
	"time"

	"github.com/drover/drover/internal/fleet"
)

// LoadTrust implements fleet.TrustStore.LoadTrust for the database/sql
// backends (SQLite, MariaDB): same tables, same "?" placeholders.
func LoadTrust(ctx context.Context, db *sql.DB, each func(fleet.TrustRecord) error) (fleet.TrustState, error) {
	var st fleet.TrustState
	err := query(ctx, db, `SELECT device_id, admission, key_hash, request_key_hash, request_at, request_from,
		request_approved FROM device_trust ORDER BY device_id`, func(rows *sql.Rows) error {
		var r TrustRow
		if err := rows.Scan(&r.DeviceID, &r.Admission, &r.KeyHash, &r.RequestKeyHash, &r.RequestAt, &r.RequestFrom, &r.RequestApproved); err != nil {
			return err
		}
		t, err := r.Record()
		if err != nil {
			return err
		}
		return each(t)
	})
	if err != nil {
		return st, err
	}
	err = query(ctx, db, `SELECT id, hash, machine_id, note, created_at, expires_at, used_at, device_id, revoked
		FROM enrollment_tokens ORDER BY id`, func(rows *sql.Rows) error {
		var t fleet.EnrollmentToken
		var created, expires, used int64
		if err := rows.Scan(&t.ID, &t.Hash, &t.MachineID, &t.Note, &created, &expires, &used, &t.DeviceID, &t.Revoked); err != nil {
			return err
		}
		SetTokenTimes(&t, created, expires, used)
		st.Tokens = append(st.Tokens, t)
		return nil
	})
	if err != nil {
		return st, err
	}
	err = query(ctx, db, `SELECT machine_id, added_at FROM preauthorized ORDER BY machine_id`, func(rows *sql.Rows) error {
		var p fleet.Preauthorized
		var at int64
		if err := rows.Scan(&p.MachineID, &at); err != nil {
			return err
		}
		p.AddedAt = time.UnixMilli(at).UTC()
		st.Preauthorized = append(st.Preauthorized, p)
		return nil
	})
	if err != nil {
		return st, err
	}
	err = db.QueryRowContext(ctx, `SELECT COALESCE(MAX(value), 0) FROM trust_counters WHERE name = ?`, CounterMaxDeleted).
		Scan(&st.MaxDeletedDeviceID)
	return st, err
}

func query(ctx context.Context, db *sql.DB, q string, row func(*sql.Rows) error) error {
	rows, err := db.QueryContext(ctx, q)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		if err := row(rows); err != nil {
			return err
		}
	}
	return rows.Err()
}
