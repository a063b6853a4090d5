package sqlcommon

// fleet.FirmwareStore for the three backends (migrations 080_firmware.sql):
// firmware artifacts and rollouts as JSON rows, rollout devices one row
// each, profile revisions numbered per profile.

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"

	"github.com/drover/drover/internal/fleet"
)

// Firmware implements fleet.FirmwareStore.
type Firmware struct{ *Base }

var _ fleet.FirmwareStore = (*Firmware)(nil)

// LoadFirmware implements fleet.FirmwareStore.
func (a *Firmware) LoadFirmware(ctx context.Context) (fleet.FirmwareData, error) {
	var out fleet.FirmwareData
	var err error
	if out.MaxFirmwareID, err = a.maxID(ctx, "firmware", "firmware"); err != nil {
		return out, err
	}
	if err := a.jsonRows(ctx, `SELECT spec FROM firmware ORDER BY id`, func(b []byte) error {
		var f fleet.Firmware
		if err := json.Unmarshal(b, &f); err != nil {
			return fmt.Errorf("firmware: %w", err)
		}
		out.Firmware = append(out.Firmware, f)
		return nil
	}); err != nil {
		return out, err
	}
	if err := a.jsonRows(ctx, `SELECT spec FROM rollouts ORDER BY id`, func(b []byte) error {
		var r fleet.Rollout
		if err := json.Unmarshal(b, &r); err != nil {
			return fmt.Errorf("rollout: %w", err)
		}
		out.Rollouts = append(out.Rollouts, r)
		return nil
	}); err != nil {
		return out, err
	}
	out.Devices, err = a.rolloutDevices(ctx, `SELECT d.rollout_id, d.device_id, d.wave, d.state, d.progress, d.reason, d.from_fw, d.updated_at
		FROM rollout_devices d JOIN rollouts r ON r.id = d.rollout_id WHERE r.finished = ? ORDER BY d.rollout_id, d.device_id`, false)
	return out, err
}

func (a *Firmware) jsonRows(ctx context.Context, q string, each func([]byte) error) error {
	rows, err := a.R.QueryContext(ctx, q)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var b []byte
		if err := rows.Scan(&b); err != nil {
			return err
		}
		if err := each(b); err != nil {
			return err
		}
	}
	return rows.Err()
}

func (a *Firmware) rolloutDevices(ctx context.Context, q string, args ...any) ([]fleet.RolloutDevice, error) {
	rows, err := a.R.QueryContext(ctx, a.D.q(q), args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []fleet.RolloutDevice{}
	for rows.Next() {
		var d fleet.RolloutDevice
		var rid, did, at int64
		var state, reason, from []byte
		if err := rows.Scan(&rid, &did, &d.Wave, &state, &d.Progress, &reason, &from, &at); err != nil {
			return nil, err
		}
		d.RolloutID, d.DeviceID, d.UpdatedAt = uint64(rid), uint64(did), fromMS(at)
		d.State, d.Reason, d.From = string(state), string(reason), string(from)
		out = append(out, d)
	}
	return out, rows.Err()
}

// SaveFirmware implements fleet.FirmwareStore.
func (a *Firmware) SaveFirmware(ctx context.Context, f fleet.Firmware) error {
	spec, err := json.Marshal(f)
	if err != nil {
		return err
	}
	return a.tx(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, a.D.q(`INSERT INTO firmware (id, spec) VALUES (?, ?)`+a.D.upsert("id", "spec")), int64(f.ID), string(spec)); err != nil {
			return err
		}
		return a.mark(ctx, tx, "firmware", f.ID)
	})
}

// DeleteFirmware implements fleet.FirmwareStore.
func (a *Firmware) DeleteFirmware(ctx context.Context, id uint64) error {
	_, err := a.exec(ctx, a.D.q(`DELETE FROM firmware WHERE id = ?`), int64(id))
	return err
}

// SaveRollout implements fleet.FirmwareStore.
func (a *Firmware) SaveRollout(ctx context.Context, r fleet.Rollout) error {
	spec, err := json.Marshal(r)
	if err != nil {
		return err
	}
	finished := r.State == fleet.RolloutAborted || r.State == fleet.RolloutDone
	_, err = a.exec(ctx, a.D.q(`INSERT INTO rollouts (id, finished, spec) VALUES (?, ?, ?)`+a.D.upsert("id", "finished", "spec")),
		int64(r.ID), finished, string(spec))
	return err
}

// SaveRolloutDevices implements fleet.FirmwareStore, in one transaction.
func (a *Firmware) SaveRolloutDevices(ctx context.Context, ds []fleet.RolloutDevice) error {
	if len(ds) == 0 {
		return nil
	}
	q := `INSERT INTO rollout_devices (rollout_id, device_id, wave, state, progress, reason, from_fw, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)` +
		a.D.upsert("rollout_id, device_id", "wave", "state", "progress", "reason", "from_fw", "updated_at")
	return a.execEach(ctx, q, len(ds), func(i int) ([]any, error) {
		d := &ds[i]
		return []any{int64(d.RolloutID), int64(d.DeviceID), d.Wave, d.State, d.Progress, d.Reason, d.From, ms(d.UpdatedAt)}, nil
	})
}

// RolloutDevices implements fleet.FirmwareStore.
func (a *Firmware) RolloutDevices(ctx context.Context, rolloutID uint64) ([]fleet.RolloutDevice, error) {
	return a.rolloutDevices(ctx, `SELECT rollout_id, device_id, wave, state, progress, reason, from_fw, updated_at
		FROM rollout_devices WHERE rollout_id = ? ORDER BY device_id`, int64(rolloutID))
}

// AddProfileRevision implements fleet.FirmwareStore: the next number of
// the profile, settled by the primary key. Servers sharing the database
// (cluster mode) may add revisions of one profile at the same moment: both
// read the same highest number, one insert wins and the other, skipped by
// the key, reads again in a new transaction (each sees the other's
// commit) and takes the next number.
func (a *Firmware) AddProfileRevision(ctx context.Context, r fleet.ProfileRevision) (fleet.ProfileRevision, error) {
	ins := a.D.q(a.D.insertIgnore(`INSERT INTO profile_revisions (profile_id, rev, version, config, push_interval, by_whom, at, note) VALUES (?, ?, ?, ?, ?, ?, ?, ?)`))
	for range revisionTries {
		stored := false
		err := a.tx(ctx, func(tx *sql.Tx) error {
			var n sql.NullInt64
			if err := tx.QueryRowContext(ctx, a.D.q(`SELECT max(rev) FROM profile_revisions WHERE profile_id = ?`), int64(r.ProfileID)).Scan(&n); err != nil {
				return err
			}
			r.Rev = int(n.Int64) + 1
			res, err := tx.ExecContext(ctx, ins, int64(r.ProfileID), r.Rev, r.Version, string(r.Config), r.PushInterval, r.By, ms(r.At), r.Note)
			if err != nil {
				return err
			}
			k, err := res.RowsAffected()
			stored = k == 1
			return err
		})
		if err != nil || stored {
			return r, err
		}
	}
	return r, fmt.Errorf("profile %d: no free revision number after %d tries", r.ProfileID, revisionTries)
}

// revisionTries bounds AddProfileRevision's attempts: each one lost means
// another writer stored a revision of the same profile meanwhile.
const revisionTries = 50

// ProfileRevisions implements fleet.FirmwareStore.
func (a *Firmware) ProfileRevisions(ctx context.Context, profileID uint64) ([]fleet.ProfileRevision, error) {
	rows, err := a.R.QueryContext(ctx, a.D.q(`SELECT rev, version, config, push_interval, by_whom, at, note FROM profile_revisions WHERE profile_id = ? ORDER BY rev`), int64(profileID))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []fleet.ProfileRevision{}
	for rows.Next() {
		r := fleet.ProfileRevision{ProfileID: profileID}
		var cfg, by, note []byte
		var at int64
		if err := rows.Scan(&r.Rev, &r.Version, &cfg, &r.PushInterval, &by, &at, &note); err != nil {
			return nil, err
		}
		r.Config, r.By, r.At, r.Note = json.RawMessage(cfg), string(by), fromMS(at), string(note)
		out = append(out, r)
	}
	return out, rows.Err()
}
