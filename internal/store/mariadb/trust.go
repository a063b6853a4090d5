package mariadb

import (
	"context"
	"time"

	"github.com/drover/drover/internal/fleet"
	"github.com/drover/drover/internal/store/internal/batchutil"
)

// The Store implements fleet.TrustStore (migration 020_trust.sql).
var _ fleet.TrustStore = (*Store)(nil)

// trustStatements renders a batch's trust records as SQL, run after the
// rest of the batch: a deletion removes what the same batch wrote.
func trustStatements(recs []fleet.TrustRecord) []string {
	var out []string
	var w lit
	for i := range recs {
		t := &recs[i]
		w.b = w.b[:0]
		if t.Deleted {
			for _, head := range []string{`DELETE FROM devices WHERE id = `, `DELETE FROM device_trust WHERE device_id = `} {
				w.b = w.b[:0]
				out = append(out, string(w.raw(head).u(t.DeviceID).b))
			}
			w.b = w.b[:0]
			w.raw(`INSERT INTO trust_counters (name, value) VALUES (`).s(batchutil.CounterMaxDeleted).c().u(t.DeviceID).
				raw(`) ON DUPLICATE KEY UPDATE value = GREATEST(value, VALUES(value))`)
			out = append(out, string(w.b))
			continue
		}
		r := batchutil.TrustRowOf(t)
		approved := int64(0)
		if r.RequestApproved {
			approved = 1
		}
		w.raw(`INSERT INTO device_trust (device_id, admission, key_hash, request_key_hash, request_at, request_from, request_approved) VALUES (`).
			u(r.DeviceID).c().s(r.Admission).c().bs(r.KeyHash).c().bs(r.RequestKeyHash).c().i(r.RequestAt).c().s(r.RequestFrom).c().i(approved).
			raw(`) ON DUPLICATE KEY UPDATE admission = VALUES(admission), key_hash = VALUES(key_hash),
			request_key_hash = VALUES(request_key_hash), request_at = VALUES(request_at), request_from = VALUES(request_from),
			request_approved = VALUES(request_approved)`)
		out = append(out, string(w.b))
	}
	return out
}

// LoadTrust implements fleet.TrustStore.
func (s *Store) LoadTrust(ctx context.Context, each func(fleet.TrustRecord) error) (fleet.TrustState, error) {
	return batchutil.LoadTrust(ctx, s.db, each)
}

// SaveEnrollmentToken implements fleet.TrustStore.
func (s *Store) SaveEnrollmentToken(ctx context.Context, t fleet.EnrollmentToken) error {
	created, expires, used := batchutil.TokenTimes(&t)
	_, err := s.db.ExecContext(ctx, `INSERT INTO enrollment_tokens (id, hash, machine_id, note, created_at, expires_at, used_at,
		device_id, revoked) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
		ON DUPLICATE KEY UPDATE used_at = VALUES(used_at), device_id = VALUES(device_id), revoked = VALUES(revoked)`,
		t.ID, batchutil.NonNil(t.Hash), t.MachineID, t.Note, created, expires, used, t.DeviceID, t.Revoked)
	return err
}

// AddPreauthorized implements fleet.TrustStore.
func (s *Store) AddPreauthorized(ctx context.Context, ids []string, at time.Time) error {
	var stmts []string
	var w lit
	for i, id := range ids {
		if len(w.b) == 0 {
			w.raw(`INSERT IGNORE INTO preauthorized (machine_id, added_at) VALUES `)
		} else {
			w.c()
		}
		w.raw("(").s(id).c().i(at.UnixMilli()).end()
		if len(w.b) > maxStatement || i == len(ids)-1 {
			stmts = append(stmts, string(w.b))
			w.b = w.b[:0]
		}
	}
	return s.commit(ctx, stmts)
}

// DeletePreauthorized implements fleet.TrustStore.
func (s *Store) DeletePreauthorized(ctx context.Context, id string) error {
	_, err := s.db.ExecContext(ctx, `DELETE FROM preauthorized WHERE machine_id = ?`, []byte(id))
	return err
}
