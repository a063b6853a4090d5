package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/drover/drover/internal/fleet"
	"github.com/drover/drover/internal/store/internal/batchutil"
)

// The Store implements fleet.TrustStore (migration 020_trust.sql).
var _ fleet.TrustStore = (*Store)(nil)

// commitTrust applies a batch's trust records inside its transaction, after
// everything else: a deletion removes what the same batch wrote.
func commitTrust(ctx context.Context, tx *sql.Tx, recs []fleet.TrustRecord) error {
	for i := range recs {
		t := &recs[i]
		if t.Deleted {
			for _, q := range []string{
				`DELETE FROM devices WHERE id = ?`, `DELETE FROM device_trust WHERE device_id = ?`,
				`DELETE FROM device_labels WHERE device_id = ?`,
			} {
				if _, err := tx.ExecContext(ctx, q, t.DeviceID); err != nil {
					return fmt.Errorf("delete device %d: %w", t.DeviceID, err)
				}
			}
			if _, err := tx.ExecContext(ctx, `INSERT INTO trust_counters (name, value) VALUES (?, ?)
				ON CONFLICT (name) DO UPDATE SET value = max(value, excluded.value)`, batchutil.CounterMaxDeleted, t.DeviceID); err != nil {
				return err
			}
			continue
		}
		r := batchutil.TrustRowOf(t)
		if _, err := tx.ExecContext(ctx, `INSERT INTO device_trust (device_id, admission, key_hash, request_key_hash, request_at,
			request_from, request_approved) VALUES (?, ?, ?, ?, ?, ?, ?)
			ON CONFLICT (device_id) DO UPDATE SET admission = excluded.admission, key_hash = excluded.key_hash,
			request_key_hash = excluded.request_key_hash, request_at = excluded.request_at,
			request_from = excluded.request_from, request_approved = excluded.request_approved`,
			r.DeviceID, r.Admission, r.KeyHash, r.RequestKeyHash, r.RequestAt, r.RequestFrom, r.RequestApproved); err != nil {
			return fmt.Errorf("trust of device %d: %w", t.DeviceID, err)
		}
	}
	return nil
}

// LoadTrust implements fleet.TrustStore.
func (s *Store) LoadTrust(ctx context.Context, each func(fleet.TrustRecord) error) (fleet.TrustState, error) {
	return batchutil.LoadTrust(ctx, s.r, each)
}

// SaveEnrollmentToken implements fleet.TrustStore.
func (s *Store) SaveEnrollmentToken(ctx context.Context, t fleet.EnrollmentToken) error {
	created, expires, used := batchutil.TokenTimes(&t)
	_, err := s.w.ExecContext(ctx, `INSERT INTO enrollment_tokens (id, hash, machine_id, note, created_at, expires_at, used_at,
		device_id, revoked) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (id) DO UPDATE SET used_at = excluded.used_at, device_id = excluded.device_id, revoked = excluded.revoked`,
		t.ID, batchutil.NonNil(t.Hash), t.MachineID, t.Note, created, expires, used, t.DeviceID, t.Revoked)
	return err
}

// AddPreauthorized implements fleet.TrustStore.
func (s *Store) AddPreauthorized(ctx context.Context, ids []string, at time.Time) (err error) {
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			tx.Rollback()
		}
	}()
	for _, id := range ids {
		if _, err := tx.ExecContext(ctx, `INSERT INTO preauthorized (machine_id, added_at) VALUES (?, ?) ON CONFLICT DO NOTHING`,
			id, at.UnixMilli()); err != nil {
			return err
		}
	}
	return tx.Commit()
}

// DeletePreauthorized implements fleet.TrustStore.
func (s *Store) DeletePreauthorized(ctx context.Context, id string) error {
	_, err := s.w.ExecContext(ctx, `DELETE FROM preauthorized WHERE machine_id = ?`, id)
	return err
}
