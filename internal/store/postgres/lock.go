package postgres

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/drover/drover/internal/store/internal/instlock"
)

// instanceKey is the session advisory lock of the instance lock; advisory
// locks are per database, so each key is taken as "$1 # schemaSalt".
const instanceKey = 7283409582

// schemaSalt makes the advisory lock keys of an installation in another
// schema of the same database (a search_path in the DSN) its own: two
// installations side by side neither exclude each other nor share a
// leader. In the public schema the keys are the constants, as they always
// were, so that servers of every version exclude each other there.
const schemaSalt = `(CASE WHEN current_schema() = 'public' THEN 0::bigint ELSE (hashtext(current_schema())::bigint & 2147483647) << 1 END)`

// InstanceLockSessions selects the sessions holding the instance lock of
// the connection's schema: the way to end a dead host's session by hand
// (docs/persistence.md).
const InstanceLockSessions = `SELECT pid FROM pg_locks, (SELECT 7283409582::bigint # ` + schemaSalt + ` AS k) key
	WHERE locktype = 'advisory' AND granted AND classid = (key.k >> 32)::oid AND objid = (key.k & 4294967295)::oid
		AND objsubid = 1 AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`

// fenceQuery fails (division by zero) unless this server is the recorded
// holder; FOR SHARE makes a new holder's record wait for the commit.
const fenceQuery = `SELECT 1 / (SELECT count(*)::int FROM (SELECT 1 FROM instance_lock WHERE id = 1 AND token = $1 FOR SHARE) f)`

// lock is the instance lock: a session advisory lock held on a dedicated
// connection, and this server's row in instance_lock.
type lock struct {
	cc     *pgx.ConnConfig
	what   string
	self   instlock.Holder
	mu     sync.Mutex
	conn   *pgx.Conn
	keeper instlock.Keeper
}

// takeLock connects and takes the advisory lock, or returns a
// *instlock.HeldError naming the holder.
func takeLock(ctx context.Context, cc *pgx.ConnConfig) (*lock, error) {
	l := &lock{cc: cc, self: instlock.Self(), what: fmt.Sprintf("PostgreSQL database %s on %s:%d", cc.Database, cc.Host, cc.Port)}
	conn, err := instlock.Retry(ctx, l.connectAndLock)
	if err != nil {
		return nil, err
	}
	l.conn = conn
	return l, nil
}

func (l *lock) connectAndLock(ctx context.Context) (*pgx.Conn, error) {
	conn, err := pgx.ConnectConfig(ctx, l.cc.Copy())
	if err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	var got bool
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1 # `+schemaSalt+`)`, int64(instanceKey)).Scan(&got); err != nil {
		conn.Close(ctx)
		return nil, fmt.Errorf("postgres: instance lock: %w", err)
	}
	if !got {
		h, _ := readHolder(ctx, conn)
		conn.Close(ctx)
		return nil, &instlock.HeldError{Store: l.what, Holder: h}
	}
	return conn, nil
}

// readHolder reads the recorded holder (zero when none or no table yet).
func readHolder(ctx context.Context, conn *pgx.Conn) (instlock.Holder, error) {
	var h instlock.Holder
	var pid, since int64
	err := conn.QueryRow(ctx, `SELECT token, host, pid, since FROM instance_lock WHERE id = 1`).Scan(&h.Token, &h.Host, &pid, &since)
	if err != nil {
		return instlock.Holder{}, err
	}
	h.PID, h.Since = int(pid), time.Unix(since, 0).UTC()
	return h, nil
}

// record writes this server as holder, after the migrations created the
// table, and starts watching the lock.
func (l *lock) record(ctx context.Context) error {
	_, err := l.conn.Exec(ctx, `INSERT INTO instance_lock (id, token, host, pid, since) VALUES (1, $1, $2, $3, $4)
		ON CONFLICT (id) DO UPDATE SET token = excluded.token, host = excluded.host, pid = excluded.pid, since = excluded.since`,
		l.self.Token, l.self.Host, int64(l.self.PID), l.self.Since.Unix())
	if err != nil {
		return fmt.Errorf("postgres: record instance lock holder: %w", err)
	}
	l.keeper = instlock.Keeper{Probe: l.probe, Retake: l.retake}
	l.keeper.Start()
	return nil
}

func (l *lock) probe(ctx context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, err := l.conn.Exec(ctx, `SELECT 1`)
	return err
}

// retake takes the lock again on a new connection after the old one died
// (a database restart). If another server recorded itself meanwhile, the
// lock is lost even if that server is gone again: it may have written.
func (l *lock) retake(ctx context.Context) error {
	conn, err := l.connectAndLock(ctx)
	if err != nil {
		return err
	}
	h, err := readHolder(ctx, conn)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		conn.Close(ctx)
		return err
	}
	if h.Token != l.self.Token {
		conn.Close(ctx)
		return &instlock.HeldError{Store: l.what, Holder: h}
	}
	l.mu.Lock()
	old := l.conn
	l.conn = conn
	l.mu.Unlock()
	old.Close(ctx)
	return nil
}

// lost is non-nil once the lock is lost for good.
func (l *lock) lost() error { return l.keeper.Lost() }

// fenced maps the fence's failure to instlock.ErrLost.
func (l *lock) fenced(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "22012" {
		err = fmt.Errorf("%w (%s)", instlock.ErrLost, l.what)
		l.keeper.MarkLost(err)
	}
	return err
}

func (l *lock) close() {
	l.keeper.Close()
	l.mu.Lock()
	defer l.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// Release first: the server ends a closed session asynchronously.
	l.conn.Exec(ctx, `SELECT pg_advisory_unlock($1 # `+schemaSalt+`)`, int64(instanceKey))
	l.conn.Close(ctx)
}
