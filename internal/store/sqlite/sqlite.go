// Package sqlite is the fleet store on an embedded SQLite database: one file
// in WAL mode, written by a single connection, read by a small pool.
package sqlite

import (
	"context"
	"database/sql"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/drover/drover/internal/fleet"
	"github.com/drover/drover/internal/store/contract"
	"github.com/drover/drover/internal/store/internal/instlock"
	"github.com/drover/drover/internal/store/internal/sqlcommon"
	"github.com/drover/drover/internal/store/migrate"

	_ "modernc.org/sqlite" // registers the "sqlite" driver
)

//go:embed migrations/*.sql
var migrations embed.FS

// Store is a fleet.Store on SQLite. The embedded Tables keep alerts,
// settings, labels, sessions, users, commands and firmware.
type Store struct {
	sqlcommon.Tables
	w    *sql.DB // the one writer
	r    *sql.DB // readers
	lock *instlock.FileLock
	hist history // history.go
	policyStore
	states stateLog      // statelog.go
	ckpt   *checkpointer // checkpoint.go; nil: the writer checkpoints (drover migrate)
	upkeep atomic.Pointer[fleet.UpkeepObserver]
	// loaded is closed when the first Load ends (loadlog.go).
	loaded   chan struct{}
	loadDone sync.Once
	// loadR are the readers of the open's and the first Load's whole
	// tables, closed when that Load ends (loadlog.go); nil since.
	loadR atomic.Pointer[sql.DB]
}

// upkeepReport reports one step of the store's background work: what it
// moved and when it started.
type upkeepReport func(work string, items int64, start time.Time, err error)

// ObserveUpkeep has f told about each step of the store's background work
// (the checkpointer, the state log's merger, the history archiver, and their
// gentle drops), from now on.
func (s *Store) ObserveUpkeep(f fleet.UpkeepObserver) { s.upkeep.Store(&f) }

// Extras implements contract.Store: the background work's reports.
func (s *Store) Extras() contract.Extras { return contract.Extras{ObserveUpkeep: s.ObserveUpkeep} }

// untilStop returns a context cancelled once stop closes (or cancel is
// called): the background loops' work ends with the store.
func untilStop(stop <-chan struct{}) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		select {
		case <-stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

func (s *Store) reportUpkeep(work string, items int64, start time.Time, err error) {
	if f := s.upkeep.Load(); f != nil {
		(*f)(work, items, time.Since(start), err)
	}
}

// Open opens (creating if needed) the database file at path and applies the
// migrations. Commits are durable (synchronous=FULL) unless durable is false.
//
// It first takes the instance lock: an exclusive flock on path+".lock",
// which records this process as holder. A second Open of the same file, in
// this process or another, fails with an *instlock.HeldError naming the
// holder, until the first store is closed or its process ends.
func Open(ctx context.Context, path string, durable bool) (s *Store, err error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return nil, err
	}
	lockPath := path + ".lock"
	if dir, err := filepath.EvalSymlinks(filepath.Dir(path)); err == nil {
		lockPath = filepath.Join(dir, filepath.Base(path)+".lock")
	}
	lock, err := instlock.LockFile(lockPath, "SQLite database "+path, instlock.Self())
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			lock.Close()
		}
	}()
	return open(ctx, path, durable, lock)
}

// OpenForMigration opens the database without the instance lock, for
// drover migrate: migrations run in transactions of their own.
func OpenForMigration(ctx context.Context, path string) (*Store, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return nil, err
	}
	return open(ctx, path, true, nil)
}

func open(ctx context.Context, path string, durable bool, lock *instlock.FileLock) (*Store, error) {
	sync := "FULL"
	if !durable {
		sync = "NORMAL"
	}
	q := url.Values{}
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "synchronous("+sync+")")
	q.Add("_pragma", "busy_timeout(10000)")
	q.Add("_pragma", "foreign_keys(OFF)")
	q.Add("_pragma", "cache_size(-16384)")
	q.Add("_txlock", "immediate")
	// A server's store checkpoints on a connection of its own
	// (checkpoint.go); drover migrate's lets the writer do it.
	ckptDSN := "file:" + uriPath(path) + "?" + q.Encode()
	if lock != nil && ownCheckpoints {
		q.Add("_pragma", "wal_autocheckpoint(0)")
		q.Add("_pragma", "journal_size_limit(67108864)") // the WAL file shrinks back to 64 MiB when it restarts
	} else {
		q.Add("_pragma", "wal_autocheckpoint(10000)")
	}
	dsn := "file:" + uriPath(path) + "?" + q.Encode()
	w, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, err
	}
	w.SetMaxOpenConns(1)
	w.SetMaxIdleConns(1)
	w.SetConnMaxLifetime(0)
	ms, err := migrate.Load(migrations, "migrations")
	if err != nil {
		w.Close()
		return nil, err
	}
	if _, err := migrate.Apply(ctx, w, ms); err != nil {
		w.Close()
		return nil, fmt.Errorf("sqlite %s: %w", path, err)
	}
	rq := url.Values{}
	rq.Add("_pragma", "busy_timeout(10000)")
	rq.Add("_pragma", "query_only(1)")
	r, err := sql.Open("sqlite", "file:"+uriPath(path)+"?"+rq.Encode())
	if err != nil {
		w.Close()
		return nil, err
	}
	r.SetMaxOpenConns(4)
	s := &Store{w: w, r: r, lock: lock, policyStore: newPolicyStore(w), loaded: make(chan struct{})}
	// The load's readers map the file: its pages are read without a
	// system call and a copy each. Mapped pages count in the process's
	// resident size; they are unmapped when these close.
	rq.Add("_pragma", "mmap_size("+strconv.Itoa(loadMmapSize)+")")
	lr, err := sql.Open("sqlite", "file:"+uriPath(path)+"?"+rq.Encode())
	if err != nil {
		r.Close()
		w.Close()
		return nil, err
	}
	lr.SetMaxOpenConns(4)
	s.loadR.Store(lr)
	s.Tables = sqlcommon.NewTables(&sqlcommon.Base{R: r, W: w, D: sqlcommon.SQLite, Writable: s.LockLost})
	// The archiver runs in a server (with the lock), not in drover migrate.
	if err := s.loadHistory(ctx, path, sync, lock != nil); err != nil {
		s.closeDBs()
		return nil, fmt.Errorf("sqlite %s: %w", path, err)
	}
	// The merger, too, runs in a server only.
	if err := s.loadStateLog(ctx, lock != nil); err != nil {
		s.closeDBs()
		return nil, fmt.Errorf("sqlite %s: state log: %w", path, err)
	}
	if lock != nil && ownCheckpoints {
		if s.ckpt, err = startCheckpointer(ctx, ckptDSN, w, s.reportUpkeep); err != nil {
			s.closeDBs()
			return nil, fmt.Errorf("sqlite %s: checkpointer: %w", path, err)
		}
	}
	return s, nil
}

// uriPath escapes what a SQLite URI filename would otherwise read as query,
// fragment or escape: a data dir may well contain '#' or '?'.
func uriPath(path string) string {
	return strings.NewReplacer("%", "%25", "?", "%3f", "#", "%23").Replace(path)
}

// Close closes the database and releases the instance lock.
func (s *Store) Close() error {
	err := s.closeDBs()
	if s.lock != nil {
		err = errors.Join(err, s.lock.Close())
	}
	return err
}

// LockLost returns an error once this store's instance lock was lost (its
// lock file replaced and locked by another process), else nil.
func (s *Store) LockLost() error {
	if s.lock == nil {
		return nil
	}
	return s.lock.Lost()
}

// closeDBs closes the databases, not the lock.
func (s *Store) closeDBs() error {
	s.stopStateLog()
	return errors.Join(s.ckpt.close(), s.closeHistory(), s.closeLoadReaders(), s.r.Close(), s.w.Close())
}

const (
	upsertProfile = `INSERT INTO profiles (id, device_type, firmware, version, config, push_interval, created_at, updated_at)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (id) DO UPDATE SET version = excluded.version, config = excluded.config,
			push_interval = excluded.push_interval, updated_at = excluded.updated_at`
	upsertDevice = `INSERT INTO devices (id, machine_id, device_type, model, firmware, serial, token_hash, registered_at)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (id) DO UPDATE SET device_type = excluded.device_type, model = excluded.model,
			firmware = excluded.firmware, serial = excluded.serial, token_hash = excluded.token_hash`
)

// Commit implements fleet.Store: one transaction for the whole batch. States
// are appended to the state log (statelog.go).
//
// The rows are written with a context that cannot be cancelled: with one
// that can, the driver starts a goroutine per statement to interrupt it
// (the largest per-row cost after SQLite itself). ctx still bounds the
// wait for the write lock and is checked between chunks of rows.
func (s *Store) Commit(ctx context.Context, b *fleet.Batch) (err error) {
	s.states.mu.Lock()
	defer s.states.mu.Unlock()
	// The writer's one connection, held for the transaction, whose hot
	// rows go through raw statements (rawstmt.go).
	conn, err := s.w.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			tx.Rollback()
		}
	}()
	rowCtx := context.WithoutCancel(ctx)
	if len(b.Profiles) > 0 {
		st, err := tx.PrepareContext(ctx, upsertProfile)
		if err != nil {
			return err
		}
		for _, p := range b.Profiles {
			if _, err := st.ExecContext(ctx, p.ID, p.DeviceType, p.Firmware, p.Version, string(p.Config), p.PushInterval,
				p.CreatedAt.UnixMilli(), p.UpdatedAt.UnixMilli()); err != nil {
				return fmt.Errorf("profile %d: %w", p.ID, err)
			}
		}
	}
	if len(b.Devices) > 0 {
		st, err := tx.PrepareContext(ctx, upsertDevice)
		if err != nil {
			return err
		}
		for _, d := range b.Devices {
			if _, err := st.ExecContext(ctx, d.ID, d.MachineID, d.DeviceType, d.Model, d.Firmware, d.Serial, d.TokenHash,
				d.RegisteredAt.Unix()); err != nil {
				return fmt.Errorf("device %d: %w", d.ID, err)
			}
		}
		if err := s.patchFirmware(ctx, tx, b.Devices); err != nil {
			return err
		}
	}
	refs, err := s.appendStates(ctx, conn, b.States)
	if err != nil {
		return err
	}
	written, err := s.insertSamples(ctx, rowCtx, conn, tx, b.Samples) // history.go
	if err != nil {
		return err
	}
	if err := commitTrust(ctx, tx, b.Trust); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	s.states.committed(b.States, refs)
	s.committed(written)
	return nil
}

// chunkCheck returns ctx's error every 256th row.
func chunkCheck(ctx context.Context, i int) error {
	if i%256 != 0 {
		return nil
	}
	return ctx.Err()
}

func lastSeen(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

// DeviceState implements fleet.StateReader.
func (s *Store) DeviceState(ctx context.Context, deviceID uint64) (json.RawMessage, error) {
	var st []byte
	if ok, err := s.logged(ctx, deviceID, "state", &st); ok || err != nil {
		return st, err
	}
	err := s.r.QueryRowContext(ctx, `SELECT state FROM devices WHERE id = ?`, deviceID).Scan(&st)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	return st, err
}
