// Package postgres is the fleet store on PostgreSQL, through pgx's native
// pool. A commit is one pipeline of set-based statements (INSERT/UPDATE
// from unnest of arrays), which PostgreSQL runs as one implicit
// transaction: a batch of thousands of pushes costs one round trip.
package postgres

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/drover/drover/internal/fleet"
	"github.com/drover/drover/internal/store/contract"
	"github.com/drover/drover/internal/store/internal/batchutil"
	"github.com/drover/drover/internal/store/internal/instlock"
	"github.com/drover/drover/internal/store/internal/sqlcommon"
	"github.com/drover/drover/internal/store/migrate"
)

//go:embed migrations/*.sql
var migrations embed.FS

// Store is a fleet.Store on PostgreSQL. The embedded Tables keep alerts,
// settings, labels, sessions, users, commands and firmware through
// database/sql on the same pool.
type Store struct {
	sqlcommon.Tables
	*sqlcommon.Samples // DeviceState; History and retention of the legacy samples table
	pool               *pgxpool.Pool
	hist               history // time partitions (history.go)
	upkeep             atomic.Pointer[fleet.UpkeepObserver]
	lock               *lock    // nil: no instance lock (drover migrate, cluster mode)
	cluster            *cluster // cluster mode (cluster.go); nil: not
	policyStore
}

// Open connects to the database a postgres:// URL (or key=value string)
// names and applies the migrations.
//
// It first takes the instance lock, a session advisory lock held on a
// connection of its own, and records this server in instance_lock: a second
// Open of the same database fails with an *instlock.HeldError naming the
// holder. After a database restart the lock is taken again; commits are
// fenced by the recorded holder, so that a server that lost the lock to
// another one meanwhile fails its writes rather than mix them in.
func Open(ctx context.Context, dsn string) (*Store, error) {
	s, err := open(ctx, dsn, true)
	if err == nil {
		s.startCompactor()
	}
	return s, err
}

// OpenUnlocked opens the database without the instance lock, for drover
// migrate (cluster nodes use OpenCluster).
func OpenUnlocked(ctx context.Context, dsn string) (*Store, error) {
	return open(ctx, dsn, false)
}

func open(ctx context.Context, dsn string, exclusive bool) (s *Store, err error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = 5 * time.Second
	}
	cfg.MaxConnIdleTime = time.Minute
	s = &Store{}
	if exclusive {
		if s.lock, err = takeLock(ctx, cfg.ConnConfig); err != nil {
			return nil, err
		}
		defer func() {
			if err != nil {
				s.lock.close()
			}
		}()
	}
	if _, err := Migrate(ctx, cfg.ConnConfig); err != nil {
		return nil, err
	}
	if s.lock != nil {
		if err := s.lock.record(ctx); err != nil {
			return nil, err
		}
	}
	if s.pool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		return nil, err
	}
	db := stdlib.OpenDBFromPool(s.pool)
	s.Tables = sqlcommon.NewTables(&sqlcommon.Base{R: db, W: db, D: sqlcommon.Postgres, Writable: s.LockLost})
	s.Samples = &sqlcommon.Samples{DB: db, D: sqlcommon.Postgres, Writable: s.LockLost}
	s.policyStore = newPolicyStore(db)
	if err := s.openHistory(ctx); err != nil {
		s.pool.Close()
		return nil, fmt.Errorf("postgres: history: %w", err)
	}
	return s, nil
}

// LockLost returns an error once the instance lock is lost to another
// server for good, else nil.
func (s *Store) LockLost() error {
	if s.lock == nil {
		return nil
	}
	return s.lock.lost()
}

// Migrate applies the migrations not yet applied and returns how many ran.
// An advisory lock keeps two servers starting at once from racing.
func Migrate(ctx context.Context, cc *pgx.ConnConfig) (int, error) {
	ms, err := migrate.Load(migrations, "migrations")
	if err != nil {
		return 0, err
	}
	db := stdlib.OpenDB(*cc)
	defer db.Close()
	db.SetMaxOpenConns(1) // the lock is the session's
	const lock = `SELECT pg_advisory_lock(7283409581)`
	if _, err := db.ExecContext(ctx, lock); err != nil {
		return 0, fmt.Errorf("postgres: %w", err)
	}
	n, err := migrate.Apply(ctx, db, ms)
	if err != nil {
		return n, fmt.Errorf("postgres: %w", err)
	}
	_, err = db.ExecContext(ctx, `SELECT pg_advisory_unlock(7283409581)`)
	return n, err
}

// Extras implements contract.Store: the checkpoint settings, for advice.
func (s *Store) Extras() contract.Extras {
	return contract.Extras{CheckpointRoom: s.CheckpointRoom, ObserveUpkeep: s.ObserveUpkeep}
}

// ObserveUpkeep has f told about each step of the history compactor.
func (s *Store) ObserveUpkeep(f fleet.UpkeepObserver) { s.upkeep.Store(&f) }

func (s *Store) reportUpkeep(work string, items int64, start time.Time, err error) {
	if f := s.upkeep.Load(); f != nil {
		(*f)(work, items, time.Since(start), err)
	}
}

// Close closes the pool and releases the instance lock.
func (s *Store) Close() error {
	s.stopCompactor()
	s.Tables.Base.R.Close()
	s.pool.Close()
	if s.lock != nil {
		s.lock.close()
	}
	if s.cluster != nil {
		s.cluster.close()
	}
	return nil
}

// Load implements fleet.Store, on pgx's own rows.
func (s *Store) Load(ctx context.Context, opts fleet.LoadOptions, each func(fleet.DeviceRecord) error) (fleet.LoadResult, error) {
	return sqlcommon.Loader{Query: func(ctx context.Context, q string) (sqlcommon.Rows, error) { return s.pool.Query(ctx, q) }}.Load(ctx, opts, each)
}

const (
	upsertProfiles = `INSERT INTO profiles (id, device_type, firmware, version, config, push_interval, created_at, updated_at)
		SELECT * FROM unnest($1::bigint[], $2::text[], $3::text[], $4::bigint[], $5::bytea[], $6::integer[], $7::bigint[], $8::bigint[])
		ON CONFLICT (id) DO UPDATE SET version = excluded.version, config = excluded.config,
			push_interval = excluded.push_interval, updated_at = excluded.updated_at`
	upsertDevices = `INSERT INTO devices (id, machine_id, device_type, model, firmware, serial, token_hash, registered_at)
		SELECT * FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::bytea[], $8::bigint[])
		ON CONFLICT (id) DO UPDATE SET device_type = excluded.device_type, model = excluded.model,
			firmware = excluded.firmware, serial = excluded.serial, token_hash = excluded.token_hash`
	updateStates = `UPDATE devices AS d SET firmware = v.firmware, last_seen = v.last_seen, seq = v.seq,
			applied_version = v.applied_version, config_error = v.config_error, state = v.state
		FROM unnest($1::bigint[], $2::text[], $3::bigint[], $4::bigint[], $5::bigint[], $6::bytea[], $7::bytea[])
			AS v(id, firmware, last_seen, seq, applied_version, config_error, state)
		WHERE d.id = v.id`
)

// Commit implements fleet.Store. Deadlocks with a concurrent writer are
// retried; a lost connection resets the pool so that the next commit
// connects afresh.
func (s *Store) Commit(ctx context.Context, b *fleet.Batch) error {
	if b.Len() == 0 {
		return nil
	}
	profiles, devices, states := batchutil.Profiles(b.Profiles), batchutil.Devices(b.Devices), batchutil.States(b.States)
	if err := s.LockLost(); err != nil {
		return err
	}
	for attempt := 1; ; attempt++ {
		err := s.commit(ctx, profiles, devices, states, b.Samples, b.Trust)
		if err == nil {
			if s.cluster != nil && len(profiles)+len(devices)+len(b.Trust) > 0 {
				s.cluster.onChange()
			}
			return nil
		}
		if s.lock != nil {
			if err = s.lock.fenced(err); errors.Is(err, instlock.ErrLost) {
				return err
			}
		}
		var pgErr *pgconn.PgError
		isPG := errors.As(err, &pgErr)
		if !isPG || pgErr.Severity == "FATAL" || pgErr.Severity == "PANIC" || strings.HasPrefix(pgErr.Code, "08") || strings.HasPrefix(pgErr.Code, "57P") {
			// The connection or the server went away: the pool's other
			// connections are as stale as this one.
			s.pool.Reset()
		}
		if isPG && pgErr.Code == "23514" && len(b.Samples) > 0 {
			// No partition for a sample: one was dropped since it was
			// listed (another node's retention); list them again.
			s.forgetParts()
		}
		retry := isPG && (pgErr.Code == "40P01" || pgErr.Code == "40001" || pgErr.Code == "23514") || pgconn.SafeToRetry(err)
		if !retry || attempt == 5 || ctx.Err() != nil {
			return err
		}
		time.Sleep(time.Duration(attempt) * 5 * time.Millisecond)
	}
}

// commit sends the whole batch as one pipeline: PostgreSQL runs a
// pipeline's statements as one implicit transaction, committed at its end,
// so a commit costs one round trip.
func (s *Store) commit(ctx context.Context, profiles []fleet.Profile, devices []fleet.DeviceRecord, states []fleet.StateRecord, samples []fleet.Sample, trust []fleet.TrustRecord) error {
	var q pgx.Batch
	if s.lock != nil {
		q.Queue(fenceQuery, s.lock.self.Token)
	}
	if len(profiles) > 0 {
		n := len(profiles)
		id, typ, fw, ver, cfg, iv, cr, up := make([]int64, n), make([]string, n), make([]string, n), make([]int64, n),
			make([][]byte, n), make([]int32, n), make([]int64, n), make([]int64, n)
		for i, p := range profiles {
			id[i], typ[i], fw[i], ver[i], cfg[i] = int64(p.ID), p.DeviceType, p.Firmware, p.Version, nonNil(p.Config)
			iv[i], cr[i], up[i] = int32(min(p.PushInterval, math.MaxInt32)), p.CreatedAt.UnixMilli(), p.UpdatedAt.UnixMilli()
		}
		q.Queue(upsertProfiles, id, typ, fw, ver, cfg, iv, cr, up)
	}
	if len(devices) > 0 {
		n := len(devices)
		id, mid, typ, model, fw, serial, hash, reg := make([]int64, n), make([]string, n), make([]string, n), make([]string, n),
			make([]string, n), make([]string, n), make([][]byte, n), make([]int64, n)
		for i, d := range devices {
			id[i], mid[i], typ[i], model[i], fw[i] = int64(d.ID), d.MachineID, d.DeviceType, d.Model, d.Firmware
			serial[i], hash[i], reg[i] = d.Serial, nonNil(d.TokenHash), d.RegisteredAt.Unix()
		}
		q.Queue(upsertDevices, id, mid, typ, model, fw, serial, hash, reg)
	}
	if len(states) > 0 {
		q.Queue(updateStates, stateArgs(states)...)
	}
	if len(samples) > 0 {
		if err := s.ensureParts(ctx, sampleTimes(samples)); err != nil {
			return err
		}
		queueSamples(&q, samples)
	}
	queueTrust(&q, trust)
	if s.cluster != nil {
		s.cluster.queueChanges(&q, profiles, devices, trust)
	}
	return s.pool.SendBatch(ctx, &q).Close()
}

// stateArgs are updateStates' arrays for states, one element per device.
func stateArgs(states []fleet.StateRecord) []any {
	n := len(states)
	id, fw, seen, seq, av, ce, st := make([]int64, n), make([]string, n), make([]int64, n), make([]int64, n),
		make([]int64, n), make([][]byte, n), make([][]byte, n)
	for i, r := range states {
		id[i], fw[i], seen[i], seq[i], av[i] = int64(r.DeviceID), r.Firmware, batchutil.LastSeen(r.LastSeen), int64(r.Seq), r.AppliedVersion
		ce[i], st[i] = []byte(r.ConfigError), r.State
	}
	return []any{id, fw, seen, seq, av, ce, st}
}

// CheckpointRoom reports PostgreSQL's max_wal_size and checkpoint_timeout:
// how much WAL, and how long, between two checkpoints. A large fleet on
// the defaults checkpoints every few tens of seconds (docs/persistence.md).
func (s *Store) CheckpointRoom(ctx context.Context) (maxWAL int64, timeout time.Duration, err error) {
	var mb, sec int64
	err = s.pool.QueryRow(ctx, `SELECT
		(SELECT setting::bigint FROM pg_settings WHERE name = 'max_wal_size' AND unit = 'MB'),
		(SELECT setting::bigint FROM pg_settings WHERE name = 'checkpoint_timeout' AND unit = 's')`).Scan(&mb, &sec)
	if err != nil {
		return 0, 0, fmt.Errorf("postgres: checkpoint settings: %w", err)
	}
	return mb << 20, time.Duration(sec) * time.Second, nil
}

// nonNil keeps NOT NULL bytea columns from receiving NULL.
func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}
