package mariadb

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"database/sql/driver"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/drover/drover/internal/store/internal/instlock"
)

// lock is the instance lock: GET_LOCK held on a dedicated connection, and
// this server's row in instance_lock. Named locks are server-wide, so the
// name carries the database's.
type lock struct {
	db     *sql.DB // the lock's own pool; conn is its one connection
	name   string
	what   string
	self   instlock.Holder
	mu     sync.Mutex
	conn   *sql.Conn
	keeper instlock.Keeper
}

func lockName(database string) string {
	name := "drover_instance." + database
	if len(name) > 64 { // MariaDB's limit for lock names
		sum := sha256.Sum256([]byte(database))
		name = "drover_instance.#" + hex.EncodeToString(sum[:16])
	}
	return name
}

// takeLock takes the lock or returns a *instlock.HeldError naming the holder.
func takeLock(ctx context.Context, c driver.Connector, cfg *mysql.Config) (*lock, error) {
	l := &lock{db: sql.OpenDB(c), name: lockName(cfg.DBName), self: instlock.Self(),
		what: fmt.Sprintf("MariaDB database %s on %s", cfg.DBName, cfg.Addr)}
	l.db.SetMaxIdleConns(1)
	conn, err := instlock.Retry(ctx, l.connectAndLock)
	if err != nil {
		l.db.Close()
		return nil, err
	}
	l.conn = conn
	return l, nil
}

func (l *lock) connectAndLock(ctx context.Context) (*sql.Conn, error) {
	conn, err := l.db.Conn(ctx)
	if err != nil {
		return nil, fmt.Errorf("mariadb: %w", err)
	}
	var got sql.NullInt64
	if err := conn.QueryRowContext(ctx, `SELECT GET_LOCK(?, 0)`, l.name).Scan(&got); err != nil {
		conn.Close()
		return nil, fmt.Errorf("mariadb: instance lock: %w", err)
	}
	if got.Int64 != 1 {
		h, _ := readHolder(ctx, conn)
		conn.Close()
		return nil, &instlock.HeldError{Store: l.what, Holder: h}
	}
	return conn, nil
}

type queryRower interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// readHolder reads the recorded holder (zero when none or no table yet).
func readHolder(ctx context.Context, q queryRower) (instlock.Holder, error) {
	var h instlock.Holder
	var since int64
	err := q.QueryRowContext(ctx, `SELECT token, host, pid, since FROM instance_lock WHERE id = 1`).Scan(&h.Token, &h.Host, &h.PID, &since)
	if err != nil {
		return instlock.Holder{}, err
	}
	h.Since = time.Unix(since, 0).UTC()
	return h, nil
}

// record writes this server as holder and starts watching the lock.
func (l *lock) record(ctx context.Context) error {
	_, err := l.conn.ExecContext(ctx, `INSERT INTO instance_lock (id, token, host, pid, since) VALUES (1, ?, ?, ?, ?)
		ON DUPLICATE KEY UPDATE token = VALUES(token), host = VALUES(host), pid = VALUES(pid), since = VALUES(since)`,
		l.self.Token, l.self.Host, l.self.PID, l.self.Since.Unix())
	if err != nil {
		return fmt.Errorf("mariadb: record instance lock holder: %w", err)
	}
	l.keeper = instlock.Keeper{Probe: l.probe, Retake: l.retake}
	l.keeper.Start()
	return nil
}

func (l *lock) probe(ctx context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.conn.PingContext(ctx)
}

// retake takes the lock again on a new connection after the old one died
// (a database restart). If another server recorded itself meanwhile, the
// lock is lost even if that server is gone again: it may have written.
func (l *lock) retake(ctx context.Context) error {
	l.mu.Lock()
	discard(l.conn)
	l.mu.Unlock()
	conn, err := l.connectAndLock(ctx)
	if err != nil {
		return err
	}
	h, err := readHolder(ctx, conn)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		conn.Close()
		return err
	}
	if h.Token != l.self.Token {
		conn.Close()
		return &instlock.HeldError{Store: l.what, Holder: h}
	}
	l.mu.Lock()
	l.conn = conn
	l.mu.Unlock()
	return nil
}

// fence checks, inside a commit's transaction, that this server is still
// the recorded holder; the shared row lock makes a new holder's record wait
// for the commit.
func (l *lock) fence(ctx context.Context, tx *sql.Tx) error {
	var token string
	err := tx.QueryRowContext(ctx, `SELECT token FROM instance_lock WHERE id = 1 LOCK IN SHARE MODE`).Scan(&token)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return err
	}
	if token != l.self.Token {
		err := fmt.Errorf("%w (%s)", instlock.ErrLost, l.what)
		l.keeper.MarkLost(err)
		return err
	}
	return nil
}

// discard closes the connection itself, not only returning it to the pool:
// a session that may still hold the lock must end.
func discard(c *sql.Conn) {
	c.Raw(func(any) error { return driver.ErrBadConn })
	c.Close()
}

func (l *lock) lost() error { return l.keeper.Lost() }

func (l *lock) close() {
	l.keeper.Close()
	l.mu.Lock()
	defer l.mu.Unlock()
	// Release first: the server ends a closed session asynchronously.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	l.conn.ExecContext(ctx, `DO RELEASE_LOCK(?)`, l.name)
	discard(l.conn)
	l.db.Close()
}
