package postgres

import (
	"context"
	"time"

	"github.com/drover/drover/internal/fleet"
	"github.com/drover/drover/internal/store/internal/batchutil"
	"github.com/jackc/pgx/v5"
)

// The Store implements fleet.TrustStore (migration 020_trust.sql).
var _ fleet.TrustStore = (*Store)(nil)

const upsertTrust = `INSERT INTO device_trust (device_id, admission, key_hash, request_key_hash, request_at, request_from, request_approved)
	SELECT * FROM unnest($1::bigint[], $2::text[], $3::bytea[], $4::bytea[], $5::bigint[], $6::text[], $7::boolean[])
	ON CONFLICT (device_id) DO UPDATE SET admission = excluded.admission, key_hash = excluded.key_hash,
		request_key_hash = excluded.request_key_hash, request_at = excluded.request_at,
		request_from = excluded.request_from, request_approved = excluded.request_approved`

// queueTrust adds a batch's trust records to its pipeline, after everything
// else: a deletion removes what the same batch wrote.
func queueTrust(q *pgx.Batch, recs []fleet.TrustRecord) {
	recs = batchutil.LastPerKey(recs, func(t *fleet.TrustRecord) uint64 { return t.DeviceID })
	var id, at []int64
	var adm, from []string
	var key, reqKey [][]byte
	var approved []bool
	for i := range recs {
		t := &recs[i]
		if t.Deleted {
			for _, sql := range []string{`DELETE FROM devices WHERE id = $1`, `DELETE FROM device_trust WHERE device_id = $1`} {
				q.Queue(sql, int64(t.DeviceID))
			}
			q.Queue(`INSERT INTO trust_counters (name, value) VALUES ($1, $2)
				ON CONFLICT (name) DO UPDATE SET value = greatest(trust_counters.value, excluded.value)`,
				batchutil.CounterMaxDeleted, int64(t.DeviceID))
			continue
		}
		r := batchutil.TrustRowOf(t)
		id, adm, key, reqKey = append(id, int64(r.DeviceID)), append(adm, r.Admission), append(key, r.KeyHash), append(reqKey, r.RequestKeyHash)
		at, from, approved = append(at, r.RequestAt), append(from, r.RequestFrom), append(approved, r.RequestApproved)
	}
	if len(id) > 0 {
		q.Queue(upsertTrust, id, adm, key, reqKey, at, from, approved)
	}
}

// LoadTrust implements fleet.TrustStore.
func (s *Store) LoadTrust(ctx context.Context, each func(fleet.TrustRecord) error) (fleet.TrustState, error) {
	var st fleet.TrustState
	rows, err := s.pool.Query(ctx, `SELECT device_id, admission, key_hash, request_key_hash, request_at, request_from,
		request_approved FROM device_trust ORDER BY device_id`)
	if err != nil {
		return st, err
	}
	for rows.Next() {
		var r batchutil.TrustRow
		var id int64
		if err := rows.Scan(&id, &r.Admission, &r.KeyHash, &r.RequestKeyHash, &r.RequestAt, &r.RequestFrom, &r.RequestApproved); err != nil {
			rows.Close()
			return st, err
		}
		r.DeviceID = uint64(id)
		t, err := r.Record()
		if err == nil {
			err = each(t)
		}
		if err != nil {
			rows.Close()
			return st, err
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return st, err
	}
	if err := s.loadEnrollment(ctx, &st); err != nil {
		return st, err
	}
	var maxDeleted int64
	err = s.pool.QueryRow(ctx, `SELECT coalesce(max(value), 0) FROM trust_counters WHERE name = $1`, batchutil.CounterMaxDeleted).Scan(&maxDeleted)
	st.MaxDeletedDeviceID = uint64(maxDeleted)
	return st, err
}

// loadEnrollment reads the enrollment tokens and preauthorized machine IDs
// into st.
func (s *Store) loadEnrollment(ctx context.Context, st *fleet.TrustState) error {
	rows, err := s.pool.Query(ctx, `SELECT id, hash, machine_id, note, created_at, expires_at, used_at, device_id, revoked
		FROM enrollment_tokens ORDER BY id`)
	if err != nil {
		return err
	}
	for rows.Next() {
		var t fleet.EnrollmentToken
		var id, created, expires, used, dev int64
		if err := rows.Scan(&id, &t.Hash, &t.MachineID, &t.Note, &created, &expires, &used, &dev, &t.Revoked); err != nil {
			rows.Close()
			return err
		}
		t.ID, t.DeviceID = uint64(id), uint64(dev)
		batchutil.SetTokenTimes(&t, created, expires, used)
		st.Tokens = append(st.Tokens, t)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	rows, err = s.pool.Query(ctx, `SELECT machine_id, added_at FROM preauthorized ORDER BY machine_id`)
	if err != nil {
		return err
	}
	for rows.Next() {
		var p fleet.Preauthorized
		var at int64
		if err := rows.Scan(&p.MachineID, &at); err != nil {
			rows.Close()
			return err
		}
		p.AddedAt = time.UnixMilli(at).UTC()
		st.Preauthorized = append(st.Preauthorized, p)
	}
	rows.Close()
	return rows.Err()
}

// SaveEnrollmentToken implements fleet.TrustStore.
func (s *Store) SaveEnrollmentToken(ctx context.Context, t fleet.EnrollmentToken) error {
	created, expires, used := batchutil.TokenTimes(&t)
	_, err := s.pool.Exec(ctx, `INSERT INTO enrollment_tokens (id, hash, machine_id, note, created_at, expires_at, used_at,
		device_id, revoked) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
		ON CONFLICT (id) DO UPDATE SET used_at = excluded.used_at, device_id = excluded.device_id, revoked = excluded.revoked`,
		int64(t.ID), batchutil.NonNil(t.Hash), t.MachineID, t.Note, created, expires, used, int64(t.DeviceID), t.Revoked)
	return err
}

// AddPreauthorized implements fleet.TrustStore.
func (s *Store) AddPreauthorized(ctx context.Context, ids []string, at time.Time) error {
	_, err := s.pool.Exec(ctx, `INSERT INTO preauthorized (machine_id, added_at) SELECT m, $2 FROM unnest($1::text[]) AS m
		ON CONFLICT DO NOTHING`, ids, at.UnixMilli())
	return err
}

// DeletePreauthorized implements fleet.TrustStore.
func (s *Store) DeletePreauthorized(ctx context.Context, id string) error {
	_, err := s.pool.Exec(ctx, `DELETE FROM preauthorized WHERE machine_id = $1`, id)
	return err
}
