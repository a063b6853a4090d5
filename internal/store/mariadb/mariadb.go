// Package mariadb is the fleet store on MariaDB or MySQL (InnoDB), through
// go-sql-driver/mysql. A commit is one transaction of multi-row statements
// of at most about 1 MiB each. Their values are written as literals: hex
// for every byte string (exact whatever the connection's character set or
// SQL mode), decimal for numbers; nothing else reaches the SQL text.
package mariadb

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/drover/drover/internal/fleet"
	"github.com/drover/drover/internal/store/contract"
	"github.com/drover/drover/internal/store/internal/batchutil"
	"github.com/drover/drover/internal/store/internal/instlock"
	"github.com/drover/drover/internal/store/internal/sqlcommon"
	"github.com/drover/drover/internal/store/migrate"
)

//go:embed migrations/*.sql
var migrations embed.FS

// maxStatement bounds one statement's text, well below the smallest
// max_allowed_packet in use (4 MiB, MySQL 5.7; MariaDB's is 16 MiB).
const maxStatement = 1 << 20

// Store is a fleet.Store on MariaDB or MySQL. The embedded Tables keep
// alerts, settings, labels, sessions, users, commands and firmware.
type Store struct {
	sqlcommon.Tables
	*sqlcommon.Samples // History, DeviceState, PruneHistory, DropHistory
	db                 *sql.DB
	lock               *lock // nil: no instance lock (drover migrate, cluster mode)
	policyStore
}

// ParseDSN reads go-sql-driver's DSN (user:pass@tcp(host:port)/db?params)
// or the URL form user:pass@host:port/db?params, either without the
// mysql:// or mariadb:// prefix.
func ParseDSN(dsn string) (*mysql.Config, error) {
	at := strings.LastIndexByte(dsn, '@')
	hostPart := dsn[at+1:]
	if slash := strings.IndexByte(hostPart, '/'); slash >= 0 {
		hostPart = hostPart[:slash]
	}
	if strings.Contains(hostPart, "(") || hostPart == "" {
		return mysql.ParseDSN(dsn)
	}
	u, err := url.Parse("mysql://" + dsn)
	if err != nil {
		return nil, err
	}
	cfg := mysql.NewConfig()
	cfg.User = u.User.Username()
	cfg.Passwd, _ = u.User.Password()
	cfg.Net, cfg.Addr = "tcp", u.Host
	if u.Port() == "" {
		cfg.Addr += ":3306"
	}
	cfg.DBName = strings.TrimPrefix(u.Path, "/")
	if u.RawQuery != "" {
		// Let the driver read the parameters it knows.
		withParams, err := mysql.ParseDSN("/?" + u.RawQuery)
		if err != nil {
			return nil, err
		}
		withParams.User, withParams.Passwd, withParams.Net, withParams.Addr, withParams.DBName = cfg.User, cfg.Passwd, cfg.Net, cfg.Addr, cfg.DBName
		cfg = withParams
	}
	return cfg, nil
}

// Open connects to the database dsn names (see ParseDSN) and applies the
// migrations.
//
// It first takes the instance lock, GET_LOCK on a connection of its own,
// and records this server in instance_lock: a second Open of the same
// database fails with an *instlock.HeldError naming the holder. After a
// database restart the lock is taken again; commits are fenced by the
// recorded holder, so that a server that lost the lock to another one
// meanwhile fails its writes rather than mix them in.
func Open(ctx context.Context, dsn string) (*Store, error) {
	return open(ctx, dsn, true)
}

// OpenUnlocked opens the database without the instance lock: for drover
// migrate, and reserved for a cluster mode (not built) where several
// servers share one database.
func OpenUnlocked(ctx context.Context, dsn string) (*Store, error) {
	return open(ctx, dsn, false)
}

func open(ctx context.Context, dsn string, exclusive bool) (s *Store, err error) {
	cfg, err := ParseDSN(dsn)
	if err != nil {
		return nil, fmt.Errorf("mysql DSN: %w", err)
	}
	if cfg.DBName == "" {
		return nil, errors.New("mysql DSN: no database name")
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 5 * time.Second
	}
	cfg.InterpolateParams = true // one round trip per query, no server-side prepare
	connector, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, err
	}
	s = &Store{}
	if exclusive {
		if s.lock, err = takeLock(ctx, connector, cfg); err != nil {
			return nil, err
		}
		defer func() {
			if err != nil {
				s.lock.close()
			}
		}()
	}
	if _, err := Migrate(ctx, connector); err != nil {
		return nil, err
	}
	if s.lock != nil {
		if err := s.lock.record(ctx); err != nil {
			return nil, err
		}
	}
	s.db = sql.OpenDB(connector)
	s.db.SetMaxOpenConns(8)
	s.db.SetMaxIdleConns(8)
	s.db.SetConnMaxIdleTime(time.Minute)
	s.Tables = sqlcommon.NewTables(&sqlcommon.Base{R: s.db, W: s.db, D: sqlcommon.MariaDB, Writable: s.LockLost})
	s.Samples = &sqlcommon.Samples{DB: s.db, D: sqlcommon.MariaDB, Writable: s.LockLost}
	s.policyStore = newPolicyStore(s.db)
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
// A named lock keeps two servers starting at once from racing.
func Migrate(ctx context.Context, c driver.Connector) (int, error) {
	ms, err := migrate.Load(migrations, "migrations")
	if err != nil {
		return 0, err
	}
	db := sql.OpenDB(c)
	defer db.Close()
	db.SetMaxOpenConns(1) // the lock is the session's
	var got sql.NullInt64
	if err := db.QueryRowContext(ctx, `SELECT GET_LOCK('drover_migrate', 60)`).Scan(&got); err != nil {
		return 0, fmt.Errorf("mariadb: %w", err)
	}
	if got.Int64 != 1 {
		return 0, errors.New("mariadb: another process holds the migration lock")
	}
	n, err := migrate.Apply(ctx, db, ms)
	if err != nil {
		return n, fmt.Errorf("mariadb: %w", err)
	}
	_, err = db.ExecContext(ctx, `DO RELEASE_LOCK('drover_migrate')`)
	return n, err
}

// InnoDBSizes reports InnoDB's buffer pool and redo log sizes in bytes: the
// server warns at start when they are small for the fleet
// (server.adviseDatabase).
func (s *Store) InnoDBSizes(ctx context.Context) (pool, redoLog int64, err error) {
	if err := s.db.QueryRowContext(ctx, `SELECT @@innodb_buffer_pool_size, @@innodb_log_file_size`).Scan(&pool, &redoLog); err != nil {
		return 0, 0, fmt.Errorf("mariadb: InnoDB sizes: %w", err)
	}
	return pool, redoLog, nil
}

// Extras implements contract.Store: InnoDB's sizes, for advice.
func (s *Store) Extras() contract.Extras { return contract.Extras{InnoDBSizes: s.InnoDBSizes} }

// Close closes the connection pool and releases the instance lock.
func (s *Store) Close() error {
	err := s.db.Close()
	if s.lock != nil {
		s.lock.close()
	}
	return err
}

// Load implements fleet.Store.
func (s *Store) Load(ctx context.Context, opts fleet.LoadOptions, each func(fleet.DeviceRecord) error) (fleet.LoadResult, error) {
	return sqlcommon.Loader{Query: sqlcommon.QuerySQL(s.db)}.Load(ctx, opts, each)
}

// Commit implements fleet.Store. Deadlocks and lock wait timeouts with a
// concurrent writer are retried.
func (s *Store) Commit(ctx context.Context, b *fleet.Batch) error {
	if b.Len() == 0 {
		return nil
	}
	if err := s.LockLost(); err != nil {
		return err
	}
	stmts := statements(batchutil.Profiles(b.Profiles), batchutil.Devices(b.Devices), batchutil.States(b.States), b.Samples)
	stmts = append(stmts, trustStatements(b.Trust)...)
	for attempt := 1; ; attempt++ {
		err := s.commit(ctx, stmts)
		if err == nil {
			return nil
		}
		if errors.Is(err, instlock.ErrLost) {
			return err
		}
		var myErr *mysql.MySQLError
		retry := errors.As(err, &myErr) && (myErr.Number == 1213 || myErr.Number == 1205)
		if !retry || attempt == 5 || ctx.Err() != nil {
			return err
		}
		time.Sleep(time.Duration(attempt) * 5 * time.Millisecond)
	}
}

func (s *Store) commit(ctx context.Context, stmts []string) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if s.lock != nil {
		if err := s.lock.fence(ctx, tx); err != nil {
			tx.Rollback()
			return err
		}
	}
	for _, q := range stmts {
		if _, err := tx.ExecContext(ctx, q); err != nil {
			tx.Rollback()
			return err
		}
	}
	return tx.Commit()
}

// statements renders a batch as SQL, in the order profiles, devices,
// states, samples.
func statements(profiles []fleet.Profile, devices []fleet.DeviceRecord, states []fleet.StateRecord, samples []fleet.Sample) []string {
	var out []string
	var w lit
	flush := func(tail string) {
		if len(w.b) > 0 {
			out = append(out, string(w.b)+tail)
			w.b = w.b[:0]
		}
	}
	const profileHead = `INSERT INTO profiles (id, device_type, firmware, version, config, push_interval, created_at, updated_at) VALUES `
	// Rows are upserted by id; a clash on another unique key sets id to
	// NULL, which fails the statement as on the other backends.
	const profileTail = ` ON DUPLICATE KEY UPDATE id = IF(id = VALUES(id), id, NULL), version = VALUES(version), config = VALUES(config),
		push_interval = VALUES(push_interval), updated_at = VALUES(updated_at)`
	for _, p := range profiles {
		w.row(profileHead)
		w.u(p.ID).c().s(p.DeviceType).c().s(p.Firmware).c().i(p.Version).c().bs(nonNil(p.Config)).c().i(int64(p.PushInterval)).c().
			i(p.CreatedAt.UnixMilli()).c().i(p.UpdatedAt.UnixMilli()).end()
		if len(w.b) > maxStatement {
			flush(profileTail)
		}
	}
	flush(profileTail)
	const deviceHead = `INSERT INTO devices (id, machine_id, device_type, model, firmware, serial, token_hash, registered_at) VALUES `
	const deviceTail = ` ON DUPLICATE KEY UPDATE id = IF(id = VALUES(id), id, NULL), device_type = VALUES(device_type), model = VALUES(model),
		firmware = VALUES(firmware), serial = VALUES(serial), token_hash = VALUES(token_hash)`
	for _, d := range devices {
		w.row(deviceHead)
		w.u(d.ID).c().s(d.MachineID).c().s(d.DeviceType).c().s(d.Model).c().s(d.Firmware).c().s(d.Serial).c().
			bs(nonNil(d.TokenHash)).c().i(d.RegisteredAt.Unix()).end()
		if len(w.b) > maxStatement {
			flush(deviceTail)
		}
	}
	flush(deviceTail)
	// A multi-row UPDATE: the rows as a derived table, joined on the key.
	const stateHead = `UPDATE devices AS d JOIN (`
	const stateTail = `) AS v ON d.id = v.id SET d.firmware = v.firmware, d.last_seen = v.last_seen, d.seq = v.seq,
		d.applied_version = v.applied_version, d.config_error = v.config_error, d.state = v.state`
	for _, r := range states {
		if len(w.b) == 0 {
			// The first row names the columns.
			w.raw(stateHead + "SELECT ").u(r.DeviceID).raw(" AS id, ").s(r.Firmware).raw(" AS firmware, ").
				i(batchutil.LastSeen(r.LastSeen)).raw(" AS last_seen, ").i(int64(r.Seq)).raw(" AS seq, ").
				i(r.AppliedVersion).raw(" AS applied_version, ").s(r.ConfigError).raw(" AS config_error, ").bs(r.State).raw(" AS state")
		} else {
			w.raw(" UNION ALL SELECT ").u(r.DeviceID).c().s(r.Firmware).c().i(batchutil.LastSeen(r.LastSeen)).c().i(int64(r.Seq)).c().
				i(r.AppliedVersion).c().s(r.ConfigError).c().bs(r.State)
		}
		if len(w.b) > maxStatement {
			flush(stateTail)
		}
	}
	flush(stateTail)
	const sampleHead = `INSERT INTO samples (device_id, at, seq, uptime, cpu, mem_used, mem_total, disk_used, disk_total,
		temperature, rx_bytes, tx_bytes, rssi, rsrp, rsrq, sinr) VALUES `
	for i := range samples {
		m := &samples[i]
		w.row(sampleHead)
		w.u(m.DeviceID).c().i(m.At.UnixMilli()).c().i(int64(m.Seq)).c().pi(m.Uptime).c().pf(m.CPU).c().pi(m.MemUsed).c().
			pi(m.MemTotal).c().pi(m.DiskUsed).c().pi(m.DiskTotal).c().pf(m.Temperature).c().pi(batchutil.ClampU(m.RxBytes)).c().
			pi(batchutil.ClampU(m.TxBytes)).c().pf(m.RSSI).c().pf(m.RSRP).c().pf(m.RSRQ).c().pf(m.SINR).end()
		if len(w.b) > maxStatement {
			flush("")
		}
	}
	flush("")
	return out
}

// lit appends SQL literals.
type lit struct{ b []byte }

// row starts a VALUES row, with head first in a new statement.
func (w *lit) row(head string) {
	if len(w.b) == 0 {
		w.b = append(w.b, head...)
	} else {
		w.b = append(w.b, ',')
	}
	w.b = append(w.b, '(')
}

func (w *lit) raw(sql string) *lit { w.b = append(w.b, sql...); return w }
func (w *lit) end() *lit           { w.b = append(w.b, ')'); return w }
func (w *lit) c() *lit             { w.b = append(w.b, ','); return w }
func (w *lit) i(v int64) *lit {
	w.b = strconv.AppendInt(w.b, v, 10)
	return w
}
func (w *lit) u(v uint64) *lit {
	w.b = strconv.AppendUint(w.b, v, 10)
	return w
}

func (w *lit) pi(v *int64) *lit {
	if v == nil {
		w.b = append(w.b, "NULL"...)
		return w
	}
	return w.i(*v)
}

func (w *lit) pf(v *float64) *lit {
	if v == nil || math.IsNaN(*v) || math.IsInf(*v, 0) {
		w.b = append(w.b, "NULL"...)
		return w
	}
	w.b = strconv.AppendFloat(w.b, *v, 'e', -1, 64)
	return w
}

// bs writes bytes as a hex literal, NULL for nil.
func (w *lit) bs(v []byte) *lit {
	if v == nil {
		w.b = append(w.b, "NULL"...)
		return w
	}
	w.b = append(w.b, "X'"...)
	w.b = hex.AppendEncode(w.b, v)
	w.b = append(w.b, '\'')
	return w
}

// s writes a string as a hex literal.
func (w *lit) s(v string) *lit {
	const digits = "0123456789abcdef"
	w.b = append(w.b, "X'"...)
	for i := 0; i < len(v); i++ {
		w.b = append(w.b, digits[v[i]>>4], digits[v[i]&15])
	}
	w.b = append(w.b, '\'')
	return w
}

func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}
