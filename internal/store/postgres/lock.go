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
// locks are per database.
const instanceKey = 7283409582

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
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, int64(instanceKey)).Scan(&got); err != nil {
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
	l.conn.Exec(ctx, `SELECT pg_advisory_unlock($1)`, int64(instanceKey))
	l.conn.Close(ctx)
}
