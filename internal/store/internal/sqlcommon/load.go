package sqlcommon

import (
	"context"
	"database/sql"
	"runtime"
	"strconv"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

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
	// Stream, if set, runs the queries that read the devices instead of
	// Query: fn reads the rows, which end when it returns (SQLite's
	// driver-level rows, read on a connection held meanwhile).
	Stream func(ctx context.Context, query string, fn func(Rows) error) error
	// Newest, if set, overwrites a device row's state columns with the
	// device's newest state where it is kept elsewhere (SQLite's state
	// log, read into memory before). It is called from several goroutines
	// at once.
	Newest func(r *DeviceRow)
	// Parallel is how many queries read the devices at once, each a range
	// of IDs at a time (0: one per CPU, at most 4).
	Parallel int
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
	loadMaxID    = `SELECT COALESCE(MAX(id), 0) FROM devices`
	loadColumns  = `SELECT id, machine_id, device_type, model, firmware, serial, token_hash, registered_at,
		last_seen, seq, applied_version, config_error`
	// loadChunk is how many devices a query hands over at a time.
	loadChunk = 1024
)

// loadRange is how many device IDs one query of a parallel load reads.
var loadRange = int64(1 << 16)

// Load implements fleet.Store: the profiles, then every device, each
// handed to each from this goroutine. With Parallel, the devices are read
// by that many queries at once, each over ranges of loadRange IDs; each
// gets them in the order the ranges finish.
func (l Loader) Load(ctx context.Context, opts fleet.LoadOptions, each func(fleet.DeviceRecord) error) (fleet.LoadResult, error) {
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
	maxID, err := l.maxID(ctx)
	if err != nil {
		return res, err
	}
	if opts.Expect != nil {
		opts.Expect(uint64(maxID))
	}
	res.MaxDeviceID = uint64(maxID)
	workers := l.Parallel
	if workers <= 0 {
		workers = min(runtime.GOMAXPROCS(0), 4)
	}
	if maxID < 2*loadRange {
		workers = 1
	}
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	g, gctx := errgroup.WithContext(lctx)
	chunks := make(chan []fleet.DeviceRecord, 2*workers)
	// Chunks handed over come back to be filled again: a million devices'
	// records are a quarter of a gigabyte of garbage otherwise.
	free := make(chan []fleet.DeviceRecord, 3*workers)
	var next atomic.Int64 // the next range's first ID
	next.Store(1)
	for range workers {
		g.Go(func() error {
			for {
				lo := next.Add(loadRange) - loadRange
				if lo > maxID {
					return nil
				}
				hi := lo + loadRange
				if workers == 1 {
					hi = maxID + 1
					next.Store(hi)
				}
				if err := l.readRange(gctx, opts.NoStates, lo, hi, chunks, free); err != nil {
					return err
				}
			}
		})
	}
	go func() {
		g.Wait()
		close(chunks)
	}()
	var eachErr error
	for chunk := range chunks {
		for i := 0; i < len(chunk) && eachErr == nil; i++ {
			if eachErr = each(chunk[i]); eachErr != nil {
				cancel() // the queries stop; what they sent meanwhile is dropped
			}
		}
		clear(chunk)
		select {
		case free <- chunk[:0]:
		default:
		}
	}
	err = g.Wait()
	if eachErr != nil {
		return res, eachErr
	}
	if err != nil {
		return res, err
	}
	return res, ctx.Err()
}

func (l Loader) maxID(ctx context.Context) (int64, error) {
	rows, err := l.Query(ctx, loadMaxID)
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	var id int64
	if rows.Next() {
		if err := rows.Scan(&id); err != nil {
			return 0, err
		}
	}
	return id, rows.Err()
}

// readRange reads the devices of IDs [lo, hi) and sends them in chunks,
// taken from free while it has some.
func (l Loader) readRange(ctx context.Context, noStates bool, lo, hi int64, out chan<- []fleet.DeviceRecord, free <-chan []fleet.DeviceRecord) error {
	q := loadColumns
	if !noStates {
		q += `, state`
	}
	q += ` FROM devices WHERE id >= ` + strconv.FormatInt(lo, 10) + ` AND id < ` + strconv.FormatInt(hi, 10) + ` ORDER BY id`
	if l.Stream != nil {
		return l.Stream(ctx, q, func(rows Rows) error { return l.readRows(ctx, noStates, rows, out, free) })
	}
	rows, err := l.Query(ctx, q)
	if err != nil {
		return err
	}
	defer rows.Close()
	return l.readRows(ctx, noStates, rows, out, free)
}

// readRows reads a query's device rows and sends them in chunks.
func (l Loader) readRows(ctx context.Context, noStates bool, rows Rows, out chan<- []fleet.DeviceRecord, free <-chan []fleet.DeviceRecord) error {
	r := new(DeviceRow)
	dest := []any{&r.ID, &r.MachineID, &r.DeviceType, &r.Model, &r.Firmware, &r.Serial, &r.TokenHash, &r.Registered,
		&r.LastSeen, &r.Seq, &r.AppliedVersion, &r.ConfigError}
	if !noStates {
		dest = append(dest, &r.State)
	}
	next := func() []fleet.DeviceRecord {
		select {
		case c := <-free:
			return c
		default:
			return make([]fleet.DeviceRecord, 0, loadChunk)
		}
	}
	chunk := next()
	send := func() error {
		select {
		case out <- chunk:
		case <-ctx.Done():
			return ctx.Err()
		}
		chunk = next()
		return nil
	}
	for rows.Next() {
		r.State = nil
		if err := rows.Scan(dest...); err != nil {
			return err
		}
		if l.Newest != nil {
			l.Newest(r)
		}
		id := uint64(r.ID)
		chunk = append(chunk, fleet.DeviceRecord{ID: id, MachineID: r.MachineID, DeviceType: r.DeviceType, Model: r.Model, Firmware: r.Firmware,
			Serial: r.Serial, TokenHash: r.TokenHash, RegisteredAt: time.Unix(r.Registered, 0).UTC(),
			State: fleet.StateRecord{DeviceID: id, Firmware: r.Firmware, LastSeen: batchutil.FromLastSeen(r.LastSeen), Seq: uint64(r.Seq),
				AppliedVersion: r.AppliedVersion, ConfigError: string(r.ConfigError), State: r.State}})
		if len(chunk) == loadChunk {
			if err := send(); err != nil {
				return err
			}
		}
	}
	if err := rows.Err(); err != nil {
		return err
	}
	if len(chunk) > 0 {
		return send()
	}
	return nil
}
