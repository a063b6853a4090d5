package sqlcommon

import (
	"context"
	"database/sql"
	"time"

	"github.com/drover/drover/internal/fleet"
	"github.com/drover/drover/internal/store/internal/batchutil"
)

// Rows is one query's result as Load reads it: database/sql's (QuerySQL)
// or pgx's rows.
type Rows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
	Close()
}

// Loader is fleet.Store's Load for every backend, with what differs
// between them: how a query runs and where a device's newest state may be.
type Loader struct {
	// Query runs one of Load's queries.
	Query func(ctx context.Context, query string) (Rows, error)
	// Newest, if set, overwrites a device row's state columns with the
	// device's newest state where it is kept elsewhere (SQLite's state
	// log).
	Newest func(ctx context.Context, r *DeviceRow) error
}

// QuerySQL runs Load's queries on a database/sql pool.
func QuerySQL(db *sql.DB) func(ctx context.Context, query string) (Rows, error) {
	return func(ctx context.Context, query string) (Rows, error) {
		rows, err := db.QueryContext(ctx, query)
		if err != nil {
			return nil, err
		}
		return sqlRows{rows}, nil
	}
}

type sqlRows struct{ *sql.Rows }

func (r sqlRows) Close() { r.Rows.Close() }

// DeviceRow is a row of devices as Load reads it. One is scanned into
// again and again: the columns are decoded into fresh strings and byte
// slices by every driver, and a device costs no allocation of its own.
type DeviceRow struct {
	ID, Registered, LastSeen, Seq, AppliedVersion  int64
	MachineID, DeviceType, Model, Firmware, Serial string
	TokenHash, ConfigError, State                  []byte
}

const (
	loadProfiles = `SELECT id, device_type, firmware, version, config, push_interval, created_at, updated_at FROM profiles ORDER BY id`
	loadDevices  = `SELECT id, machine_id, device_type, model, firmware, serial, token_hash, registered_at,
		last_seen, seq, applied_version, config_error, state FROM devices ORDER BY id`
)

// Load implements fleet.Store: the profiles, then every device in ID
// order, each handed to each.
func (l Loader) Load(ctx context.Context, each func(fleet.DeviceRecord) error) (fleet.LoadResult, error) {
	var res fleet.LoadResult
	rows, err := l.Query(ctx, loadProfiles)
	if err != nil {
		return res, err
	}
	for rows.Next() {
		var p fleet.Profile
		var id, created, updated int64
		if err := rows.Scan(&id, &p.DeviceType, &p.Firmware, &p.Version, (*[]byte)(&p.Config), &p.PushInterval, &created, &updated); err != nil {
			rows.Close()
			return res, err
		}
		p.ID = uint64(id)
		p.CreatedAt, p.UpdatedAt = time.UnixMilli(created).UTC(), time.UnixMilli(updated).UTC()
		res.Profiles = append(res.Profiles, p)
		res.MaxProfileID = max(res.MaxProfileID, p.ID)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return res, err
	}
	rows, err = l.Query(ctx, loadDevices)
	if err != nil {
		return res, err
	}
	defer rows.Close()
	r := new(DeviceRow)
	dest := []any{&r.ID, &r.MachineID, &r.DeviceType, &r.Model, &r.Firmware, &r.Serial, &r.TokenHash, &r.Registered,
		&r.LastSeen, &r.Seq, &r.AppliedVersion, &r.ConfigError, &r.State}
	for rows.Next() {
		if err := rows.Scan(dest...); err != nil {
			return res, err
		}
		if l.Newest != nil {
			if err := l.Newest(ctx, r); err != nil {
				return res, err
			}
		}
		id := uint64(r.ID)
		d := fleet.DeviceRecord{ID: id, MachineID: r.MachineID, DeviceType: r.DeviceType, Model: r.Model, Firmware: r.Firmware,
			Serial: r.Serial, TokenHash: r.TokenHash, RegisteredAt: time.Unix(r.Registered, 0).UTC(),
			State: fleet.StateRecord{DeviceID: id, Firmware: r.Firmware, LastSeen: batchutil.FromLastSeen(r.LastSeen), Seq: uint64(r.Seq),
				AppliedVersion: r.AppliedVersion, ConfigError: string(r.ConfigError), State: r.State}}
		res.MaxDeviceID = max(res.MaxDeviceID, d.ID)
		if err := each(d); err != nil {
			return res, err
		}
	}
	return res, rows.Err()
}
