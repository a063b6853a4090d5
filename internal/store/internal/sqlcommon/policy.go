package sqlcommon

// fleet.PolicyStore for the three backends: the profile policy, firmware
// links and lifted quotas (migrations 030_profile_policy.sql of each
// backend), rollout policies (130_rollout_policies.sql). The tables are
// small and written only by operators and by devices reporting new
// firmware, so plain statements suffice.

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"time"

	"github.com/drover/drover/internal/fleet"
)

// Policy is a fleet.PolicyStore on DB.
type Policy struct {
	DB *sql.DB
	D  Dialect
}

var _ fleet.PolicyStore = Policy{}

func ms(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}

func fromMS(v int64) time.Time {
	if v == 0 {
		return time.Time{}
	}
	return time.UnixMilli(v).UTC()
}

// LoadPolicy implements fleet.PolicyStore.
func (s Policy) LoadPolicy(ctx context.Context) (fleet.PolicyData, error) {
	var out fleet.PolicyData
	var spec []byte
	err := s.DB.QueryRowContext(ctx, s.D.q(`SELECT spec FROM profile_policy WHERE id = 1`)).Scan(&spec)
	switch {
	case err == sql.ErrNoRows:
	case err != nil:
		return out, err
	default:
		var p fleet.ProfilePolicy
		if err := json.Unmarshal(spec, &p); err != nil {
			return out, fmt.Errorf("profile policy: %w", err)
		}
		out.Policy = &p
	}
	rows, err := s.DB.QueryContext(ctx, `SELECT device_type, firmware, profile_id, created_at, limited FROM profile_links ORDER BY device_type, firmware`)
	if err != nil {
		return out, err
	}
	for rows.Next() {
		var l fleet.ProfileLink
		var typ, fw []byte
		var at int64
		var pid int64
		if err := rows.Scan(&typ, &fw, &pid, &at, &l.Limited); err != nil {
			rows.Close()
			return out, err
		}
		l.DeviceType, l.Firmware, l.ProfileID, l.CreatedAt = string(typ), string(fw), uint64(pid), fromMS(at)
		out.Links = append(out.Links, l)
	}
	if err := rows.Close(); err != nil {
		return out, err
	}
	if err := rows.Err(); err != nil {
		return out, err
	}
	rows, err = s.DB.QueryContext(ctx, `SELECT device_id, until_at, note, created_at FROM quota_lifts ORDER BY device_id`)
	if err != nil {
		return out, err
	}
	defer rows.Close()
	for rows.Next() {
		var l fleet.QuotaLift
		var id, until, at int64
		var note []byte
		if err := rows.Scan(&id, &until, &note, &at); err != nil {
			return out, err
		}
		l.DeviceID, l.Until, l.Note, l.At = uint64(id), fromMS(until), string(note), fromMS(at)
		out.Lifts = append(out.Lifts, l)
	}
	if err := rows.Err(); err != nil {
		return out, err
	}
	if err := rows.Close(); err != nil {
		return out, err
	}
	rows, err = s.DB.QueryContext(ctx, `SELECT name, spec FROM rollout_policies ORDER BY name`)
	if err != nil {
		return out, err
	}
	defer rows.Close()
	for rows.Next() {
		var name, spec []byte
		if err := rows.Scan(&name, &spec); err != nil {
			return out, err
		}
		var p fleet.RolloutPolicy
		if err := json.Unmarshal(spec, &p); err != nil {
			return out, fmt.Errorf("rollout policy %q: %w", name, err)
		}
		p.Name = string(name)
		out.RolloutPolicies = append(out.RolloutPolicies, p)
	}
	return out, rows.Err()
}

// SaveRolloutPolicy implements fleet.PolicyStore.
func (s Policy) SaveRolloutPolicy(ctx context.Context, p fleet.RolloutPolicy) error {
	spec, err := json.Marshal(p)
	if err != nil {
		return err
	}
	_, err = s.DB.ExecContext(ctx, s.D.q(`INSERT INTO rollout_policies (name, spec) VALUES (?, ?)`+s.D.upsert("name", "spec")), p.Name, string(spec))
	return err
}

// DeleteRolloutPolicy implements fleet.PolicyStore.
func (s Policy) DeleteRolloutPolicy(ctx context.Context, name string) error {
	_, err := s.DB.ExecContext(ctx, s.D.q(`DELETE FROM rollout_policies WHERE name = ?`), name)
	return err
}

// SaveProfilePolicy implements fleet.PolicyStore.
func (s Policy) SaveProfilePolicy(ctx context.Context, p fleet.ProfilePolicy) error {
	spec, err := json.Marshal(p)
	if err != nil {
		return err
	}
	_, err = s.DB.ExecContext(ctx, s.D.q(`INSERT INTO profile_policy (id, spec) VALUES (?, ?)`+s.D.upsert("id", "spec")), 1, string(spec))
	return err
}

// SaveProfileLink implements fleet.PolicyStore.
func (s Policy) SaveProfileLink(ctx context.Context, l fleet.ProfileLink) error {
	_, err := s.DB.ExecContext(ctx, s.D.q(`INSERT INTO profile_links (device_type, firmware, profile_id, created_at, limited) VALUES (?, ?, ?, ?, ?)`+s.D.upsert("device_type, firmware", "profile_id", "created_at", "limited")),
		l.DeviceType, l.Firmware, int64(l.ProfileID), ms(l.CreatedAt), l.Limited)
	return err
}

// DeleteProfileLink implements fleet.PolicyStore.
func (s Policy) DeleteProfileLink(ctx context.Context, deviceType, firmware string) error {
	_, err := s.DB.ExecContext(ctx, s.D.q(`DELETE FROM profile_links WHERE device_type = ? AND firmware = ?`), deviceType, firmware)
	return err
}

// SaveQuotaLift implements fleet.PolicyStore.
func (s Policy) SaveQuotaLift(ctx context.Context, l fleet.QuotaLift) error {
	_, err := s.DB.ExecContext(ctx, s.D.q(`INSERT INTO quota_lifts (device_id, until_at, note, created_at) VALUES (?, ?, ?, ?)`+s.D.upsert("device_id", "until_at", "note", "created_at")),
		int64(l.DeviceID), ms(l.Until), l.Note, ms(l.At))
	return err
}

// DeleteQuotaLift implements fleet.PolicyStore.
func (s Policy) DeleteQuotaLift(ctx context.Context, deviceID uint64) error {
	_, err := s.DB.ExecContext(ctx, s.D.q(`DELETE FROM quota_lifts WHERE device_id = ?`), int64(deviceID))
	return err
}

// DeleteProfiles implements fleet.PolicyStore, in one transaction.
func (s Policy) DeleteProfiles(ctx context.Context, ids []uint64) (err error) {
	tx, err := s.DB.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			tx.Rollback()
		}
	}()
	for _, id := range ids {
		if _, err = tx.ExecContext(ctx, s.D.q(`DELETE FROM profile_links WHERE profile_id = ?`), int64(id)); err != nil {
			return err
		}
		if _, err = tx.ExecContext(ctx, s.D.q(`DELETE FROM profiles WHERE id = ?`), int64(id)); err != nil {
			return err
		}
		// Profile IDs may be used again: the history goes with the profile.
		if _, err = tx.ExecContext(ctx, s.D.q(`DELETE FROM profile_revisions WHERE profile_id = ?`), int64(id)); err != nil {
			return err
		}
	}
	return tx.Commit()
}
