package postgres

import (
	"context"
	"encoding/json"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/drover/drover/internal/fleet"
)

// Rollouts in cluster mode (migration 085_cluster_rollouts.sql,
// docs/firmware.md): rollout IDs from a sequence, rollout rows changed
// only if nobody changed them first, device rows merged so that the
// first final state wins, and read back by when they were written.
var _ fleet.RolloutCluster = (*Store)(nil)

// dbNowMS is the database's clock in unix ms: one clock for every node.
const dbNowMS = `(extract(epoch from clock_timestamp()) * 1000)::bigint`

// finalStates are the rollout device states nothing changes again.
var finalStates = []string{fleet.DeviceVerified, fleet.DeviceFailed, fleet.DeviceCanceled}

// NextRolloutID implements fleet.RolloutCluster.
func (s *Store) NextRolloutID(ctx context.Context) (uint64, error) {
	var id int64
	err := s.pool.QueryRow(ctx, `SELECT nextval('cluster_rollout_ids')`).Scan(&id)
	return uint64(id), err
}

// SaveRolloutIf implements fleet.RolloutCluster: one transaction.
func (s *Store) SaveRolloutIf(ctx context.Context, r fleet.Rollout, prevState string, prevWave int, wave []fleet.RolloutDevice) (bool, error) {
	spec, err := json.Marshal(r)
	if err != nil {
		return false, err
	}
	finished := r.State == fleet.RolloutAborted || r.State == fleet.RolloutDone
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return false, err
	}
	defer tx.Rollback(ctx)
	tag, err := tx.Exec(ctx, `UPDATE rollouts SET finished = $2, spec = $3
		WHERE id = $1 AND spec::jsonb->>'state' = $4 AND (spec::jsonb->>'wave')::int = $5`,
		int64(r.ID), finished, string(spec), prevState, prevWave)
	if err != nil || tag.RowsAffected() != 1 {
		return false, err
	}
	for len(wave) > 0 {
		n := min(len(wave), 5000)
		if err := mergeRolloutDevices(ctx, tx, wave[:n]); err != nil {
			return false, err
		}
		wave = wave[n:]
	}
	if r.State == fleet.RolloutAborted {
		if _, err := tx.Exec(ctx, `UPDATE rollout_devices SET state = $2, reason = 'rollout aborted', updated_at = $3, written = `+dbNowMS+`
			WHERE rollout_id = $1 AND state IN ('pending', 'downloading')`,
			int64(r.ID), fleet.DeviceCanceled, r.UpdatedAt.UnixMilli()); err != nil {
			return false, err
		}
	}
	return true, tx.Commit(ctx)
}

// MergeRolloutDevices implements fleet.RolloutCluster, in statements of
// at most 5,000 rows.
func (s *Store) MergeRolloutDevices(ctx context.Context, ds []fleet.RolloutDevice) error {
	for len(ds) > 0 {
		n := min(len(ds), 5000)
		if err := mergeRolloutDevices(ctx, s.pool, ds[:n]); err != nil {
			return err
		}
		ds = ds[n:]
	}
	return nil
}

func mergeRolloutDevices(ctx context.Context, db interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
}, ds []fleet.RolloutDevice) error {
	rid, did, wave, progress, at := make([]int64, len(ds)), make([]int64, len(ds)), make([]int32, len(ds)), make([]int64, len(ds)), make([]int64, len(ds))
	state, reason, from := make([]string, len(ds)), make([]string, len(ds)), make([]string, len(ds))
	for i := range ds {
		d := &ds[i]
		rid[i], did[i], wave[i], progress[i], at[i] = int64(d.RolloutID), int64(d.DeviceID), int32(d.Wave), d.Progress, d.UpdatedAt.UnixMilli()
		state[i], reason[i], from[i] = d.State, d.Reason, d.From
	}
	// A stored final state stays (the first final state wins); otherwise
	// a final state, or a newer report, replaces the stored row.
	_, err := db.Exec(ctx, `INSERT INTO rollout_devices (rollout_id, device_id, wave, state, progress, reason, from_fw, updated_at, written)
		SELECT r, d, w, st, p, re, f, u, `+dbNowMS+` FROM unnest($1::bigint[], $2::bigint[], $3::int[], $4::text[], $5::bigint[], $6::text[], $7::text[], $8::bigint[])
			AS x(r, d, w, st, p, re, f, u)
		ON CONFLICT (rollout_id, device_id) DO UPDATE SET wave = excluded.wave, state = excluded.state, progress = excluded.progress,
			reason = excluded.reason, from_fw = excluded.from_fw, updated_at = excluded.updated_at, written = excluded.written
		WHERE rollout_devices.state <> ALL($9::text[])
			AND (excluded.state = ANY($9::text[]) OR excluded.updated_at >= rollout_devices.updated_at)`,
		rid, did, wave, state, progress, reason, from, at, finalStates)
	return err
}

// SyncRollouts implements fleet.RolloutCluster.
func (s *Store) SyncRollouts(ctx context.Context, known []uint64, after uint64) ([]fleet.Rollout, error) {
	ids := make([]int64, len(known))
	for i, id := range known {
		ids[i] = int64(id)
	}
	rows, err := s.pool.Query(ctx, `SELECT spec FROM rollouts WHERE NOT finished OR id = ANY($1) OR id > $2 ORDER BY id`, ids, int64(after))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []fleet.Rollout
	for rows.Next() {
		var b []byte
		if err := rows.Scan(&b); err != nil {
			return nil, err
		}
		var r fleet.Rollout
		if err := json.Unmarshal(b, &r); err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// RolloutDevicesWritten implements fleet.RolloutCluster: an index scan
// of (rollout_id, written).
func (s *Store) RolloutDevicesWritten(ctx context.Context, rollouts []uint64, since int64) ([]fleet.RolloutDevice, int64, error) {
	var now int64
	if err := s.pool.QueryRow(ctx, `SELECT `+dbNowMS).Scan(&now); err != nil {
		return nil, 0, err
	}
	ids := make([]int64, len(rollouts))
	for i, id := range rollouts {
		ids[i] = int64(id)
	}
	rows, err := s.pool.Query(ctx, `SELECT rollout_id, device_id, wave, state, progress, reason, from_fw, updated_at
		FROM rollout_devices WHERE rollout_id = ANY($1) AND written >= $2`, ids, since)
	if err != nil {
		return nil, 0, err
	}
	defer rows.Close()
	var out []fleet.RolloutDevice
	for rows.Next() {
		var d fleet.RolloutDevice
		var rid, did, at int64
		if err := rows.Scan(&rid, &did, &d.Wave, &d.State, &d.Progress, &d.Reason, &d.From, &at); err != nil {
			return nil, 0, err
		}
		d.RolloutID, d.DeviceID, d.UpdatedAt = uint64(rid), uint64(did), time.UnixMilli(at).UTC()
		out = append(out, d)
	}
	return out, now, rows.Err()
}
