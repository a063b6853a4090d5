// Package store opens the fleet store a DSN names, on SQLite, PostgreSQL or
// MariaDB/MySQL, and applies its migrations (docs/persistence.md).
package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/drover/drover/internal/store/contract"
	"github.com/drover/drover/internal/store/internal/instlock"
	"github.com/drover/drover/internal/store/mariadb"
	"github.com/drover/drover/internal/store/postgres"
	"github.com/drover/drover/internal/store/sqlite"
)

// Backends.
const (
	SQLite   = "sqlite"
	Postgres = "postgres"
	MySQL    = "mysql"
)

// Parse splits a DSN into its backend and the backend's own DSN:
//
//	sqlite:PATH, sqlite://PATH or a bare PATH     SQLite file
//	postgres://… or postgresql://…                PostgreSQL URL (libpq/pgx syntax)
//	mysql://… or mariadb://…                      user:pass@tcp(host:port)/db?params
//	                                              or user:pass@host:port/db?params
func Parse(dsn string) (backend, rest string, err error) {
	switch {
	case dsn == "":
		return "", "", errors.New("empty database DSN")
	case strings.HasPrefix(dsn, "postgres://"), strings.HasPrefix(dsn, "postgresql://"):
		return Postgres, dsn, nil
	case strings.HasPrefix(dsn, "mysql://"):
		return MySQL, strings.TrimPrefix(dsn, "mysql://"), nil
	case strings.HasPrefix(dsn, "mariadb://"):
		return MySQL, strings.TrimPrefix(dsn, "mariadb://"), nil
	case strings.HasPrefix(dsn, "sqlite:"):
		path := strings.TrimPrefix(dsn, "sqlite:")
		if strings.HasPrefix(path, "//") {
			path = strings.TrimPrefix(path, "//") // sqlite:///abs/path
		}
		if path == "" {
			return "", "", errors.New("sqlite DSN without a path")
		}
		return SQLite, path, nil
	case strings.Contains(dsn, "://"):
		scheme, _, _ := strings.Cut(dsn, "://")
		return "", "", fmt.Errorf("unsupported database scheme %q (want sqlite:, postgres:// or mysql://)", scheme)
	}
	return SQLite, dsn, nil
}

// Options are how Open opens a store.
type Options struct {
	// Cluster refuses: a cluster node opens its store with OpenCluster.
	Cluster bool
}

// Cluster is a store for one node of a cluster (see OpenCluster).
type Cluster = contract.Cluster

// OpenCluster opens the store of one node, named node, of a cluster of
// servers sharing one PostgreSQL database (docs/cluster.md): no instance
// lock (a shared one that keeps a server without --cluster away), IDs from
// the database, a change log. Other backends refuse.
func OpenCluster(ctx context.Context, dsn, node string) (Cluster, error) {
	backend, rest, err := Parse(dsn)
	if err != nil {
		return nil, err
	}
	if backend != Postgres {
		return nil, fmt.Errorf("cluster mode needs PostgreSQL (a %s store serves one server); see docs/cluster.md", backend)
	}
	s, err := postgres.OpenCluster(ctx, rest, node)
	if err != nil {
		return nil, err
	}
	return s, nil
}

// HeldError is what Open returns when another server holds the store's
// instance lock; its message names the holder (host, PID, since when).
type HeldError = instlock.HeldError

// ErrLockLost is wrapped by the writes of a store whose instance lock
// another server took while the database was unreachable.
var ErrLockLost = instlock.ErrLost

// Open opens the store dsn names (see Parse) for one server: it takes the
// store's instance lock (a second server gets a *HeldError), creates a
// SQLite file if needed, and applies pending migrations. SQLite commits are
// durable (synchronous=FULL).
func Open(ctx context.Context, dsn string, o Options) (Store, error) {
	backend, rest, err := Parse(dsn)
	if err != nil {
		return nil, err
	}
	var st Store
	if o.Cluster {
		return nil, errors.New("a cluster node opens its store with OpenCluster")
	}
	switch backend {
	case Postgres:
		st, err = nilIfErr(postgres.Open(ctx, rest))
	case MySQL:
		st, err = nilIfErr(mariadb.Open(ctx, rest))
	default:
		st, err = nilIfErr(sqlite.Open(ctx, rest, true))
	}
	return st, err
}

// nilIfErr keeps a failed open's nil pointer out of the interface.
func nilIfErr[S Store](s S, err error) (Store, error) {
	if err != nil {
		return nil, err
	}
	return s, nil
}

// openForMigration opens the store without the instance lock: migrations
// are transactions of their own (and serialised by a lock of their own on
// PostgreSQL and MariaDB), so drover migrate may run next to a server.
func openForMigration(ctx context.Context, backend, rest string) (io.Closer, error) {
	switch backend {
	case Postgres:
		return postgres.OpenUnlocked(ctx, rest)
	case MySQL:
		return mariadb.OpenUnlocked(ctx, rest)
	}
	return sqlite.OpenForMigration(ctx, rest)
}

// MigrateResult reports what Migrate did.
type MigrateResult struct {
	Backend string
	Applied int // migrations run now
	Version int // highest migration applied
}

// Migrate applies dsn's pending migrations.
func Migrate(ctx context.Context, dsn string) (MigrateResult, error) {
	backend, rest, err := Parse(dsn)
	res := MigrateResult{Backend: backend}
	if err != nil {
		return res, err
	}
	before, err := schemaVersions(ctx, backend, rest)
	if err != nil {
		return res, err
	}
	s, err := openForMigration(ctx, backend, rest)
	if err != nil {
		return res, err
	}
	if err := s.Close(); err != nil {
		return res, err
	}
	after, err := schemaVersions(ctx, backend, rest)
	if err != nil {
		return res, err
	}
	res.Applied = len(after) - len(before)
	for _, v := range after {
		res.Version = max(res.Version, v)
	}
	return res, nil
}

// schemaVersions lists the applied migrations (none when the database or
// the table does not exist yet).
func schemaVersions(ctx context.Context, backend, rest string) ([]int, error) {
	var db *sql.DB
	var err error
	switch backend {
	case SQLite:
		if _, statErr := os.Stat(rest); statErr != nil {
			return nil, nil
		}
		db, err = sql.Open("sqlite", "file:"+rest+"?mode=ro")
	case Postgres:
		db, err = sql.Open("pgx", rest)
	default:
		cfg, perr := mariadb.ParseDSN(rest)
		if perr != nil {
			return nil, perr
		}
		db, err = sql.Open("mysql", cfg.FormatDSN())
	}
	if err != nil {
		return nil, err
	}
	defer db.Close()
	exists := `SELECT count(*) FROM information_schema.tables WHERE table_name = 'schema_migrations' AND table_schema = `
	switch backend {
	case SQLite:
		exists = `SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'schema_migrations'`
	case Postgres:
		exists += `current_schema()`
	default:
		exists += `database()`
	}
	var n int
	if err := db.QueryRowContext(ctx, exists).Scan(&n); err != nil {
		return nil, err
	}
	if n == 0 {
		return nil, nil
	}
	rows, err := db.QueryContext(ctx, `SELECT version FROM schema_migrations ORDER BY version`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var vs []int
	for rows.Next() {
		var v int
		if err := rows.Scan(&v); err != nil {
			return nil, err
		}
		vs = append(vs, v)
	}
	return vs, rows.Err()
}
