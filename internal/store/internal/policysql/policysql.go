// Package policysql implements fleet.PolicyStore once for the three
// backends over database/sql (PostgreSQL through pgx's stdlib adapter):
// the profile policy, firmware links and lifted quotas (migrations
// 030_profile_policy.sql of each backend). The tables are small and written
// only by operators and by devices reporting new firmware, so plain
// statements suffice.
package policysql

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/drover/drover/internal/fleet"
)

// Dialect is a backend's SQL flavour.
type Dialect uint8

const (
	SQLite Dialect = iota
	Postgres
	MariaDB
)

// Store is a fleet.PolicyStore on db.
type Store struct {
	db *sql.DB
	d  Dialect
}

var _ fleet.PolicyStore = Store{}

// New returns the PolicyStore on db.
func New(db *sql.DB, d Dialect) Store { return Store{db: db, d: d} }

// DB is the database the Store uses.
func (s Store) DB() *sql.DB { return s.db }

// q rewrites ? placeholders as $n for PostgreSQL.
func (s Store) q(query string) string {
	if s.d != Postgres {
		return query
	}
	var b strings.Builder
	n := 0
	for _, r := range query {
		if r == '?' {
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// upsert is INSERT … that replaces the row with the same key.
func (s Store) upsert(table string, keys, cols []string) string {
	all := append(append([]string{}, keys...), cols...)
	ph := strings.TrimSuffix(strings.Repeat("?, ", len(all)), ", ")
	head := "INSERT INTO " + table + " (" + strings.Join(all, ", ") + ") VALUES (" + ph + ")"
	sets := make([]string, len(cols))
	for i, c := range cols {
		if s.d == MariaDB {
			sets[i] = c + " = VALUES(" + c + ")"
		} else {
			sets[i] = c + " = excluded." + c
		}
	}
	if s.d == MariaDB {
		return s.q(head + " ON DUPLICATE KEY UPDATE " + strings.Join(sets, ", "))
	}
	return s.q(head + " ON CONFLICT (" + strings.Join(keys, ", ") + ") DO UPDATE SET " + strings.Join(sets, ", "))
}

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
func (s Store) LoadPolicy(ctx context.Context) (fleet.PolicyData, error) {
	var out fleet.PolicyData
	var spec []byte
	err := s.db.QueryRowContext(ctx, s.q(`SELECT spec FROM profile_policy WHERE id = 1`)).Scan(&spec)
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
	rows, err := s.db.QueryContext(ctx, `SELECT device_type, firmware, profile_id, created_at, limited FROM profile_links ORDER BY device_type, firmware`)
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
	rows, err = s.db.QueryContext(ctx, `SELECT device_id, until_at, note, created_at FROM quota_lifts ORDER BY device_id`)
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
	return out, rows.Err()
}

// SaveProfilePolicy implements fleet.PolicyStore.
func (s Store) SaveProfilePolicy(ctx context.Context, p fleet.ProfilePolicy) error {
	spec, err := json.Marshal(p)
	if err != nil {
		return err
	}
	_, err = s.db.ExecContext(ctx, s.upsert("profile_policy", []string{"id"}, []string{"spec"}), 1, string(spec))
	return err
}

// SaveProfileLink implements fleet.PolicyStore.
func (s Store) SaveProfileLink(ctx context.Context, l fleet.ProfileLink) error {
	_, err := s.db.ExecContext(ctx, s.upsert("profile_links", []string{"device_type", "firmware"}, []string{"profile_id", "created_at", "limited"}),
		l.DeviceType, l.Firmware, int64(l.ProfileID), ms(l.CreatedAt), l.Limited)
	return err
}

// DeleteProfileLink implements fleet.PolicyStore.
func (s Store) DeleteProfileLink(ctx context.Context, deviceType, firmware string) error {
	_, err := s.db.ExecContext(ctx, s.q(`DELETE FROM profile_links WHERE device_type = ? AND firmware = ?`), deviceType, firmware)
	return err
}

// SaveQuotaLift implements fleet.PolicyStore.
func (s Store) SaveQuotaLift(ctx context.Context, l fleet.QuotaLift) error {
	_, err := s.db.ExecContext(ctx, s.upsert("quota_lifts", []string{"device_id"}, []string{"until_at", "note", "created_at"}),
		int64(l.DeviceID), ms(l.Until), l.Note, ms(l.At))
	return err
}

// DeleteQuotaLift implements fleet.PolicyStore.
func (s Store) DeleteQuotaLift(ctx context.Context, deviceID uint64) error {
	_, err := s.db.ExecContext(ctx, s.q(`DELETE FROM quota_lifts WHERE device_id = ?`), int64(deviceID))
	return err
}

// DeleteProfiles implements fleet.PolicyStore, in one transaction.
func (s Store) DeleteProfiles(ctx context.Context, ids []uint64) (err error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			tx.Rollback()
		}
	}()
	for _, id := range ids {
		if _, err = tx.ExecContext(ctx, s.q(`DELETE FROM profile_links WHERE profile_id = ?`), int64(id)); err != nil {
			return err
		}
		if _, err = tx.ExecContext(ctx, s.q(`DELETE FROM profiles WHERE id = ?`), int64(id)); err != nil {
			return err
		}
	}
	return tx.Commit()
}
