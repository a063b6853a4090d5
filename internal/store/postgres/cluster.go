package postgres

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/drover/drover/internal/fleet"
	"github.com/drover/drover/internal/store/internal/batchutil"
)

// Cluster mode (migration 050_cluster.sql, docs/cluster.md): several
// servers share the database. Each holds the instance lock's advisory lock
// in shared mode (a server without --cluster takes it exclusively, so the
// two kinds never run at once), gets IDs from sequences, and writes a
// change log row for every device and profile a commit changes, in the
// commit's transaction.
var _ fleet.ClusterStore = (*Store)(nil)

// leaderKey is the advisory lock of the cluster's leader.
const leaderKey = 7283409583

// cluster is a Store's cluster-mode state.
type cluster struct {
	node     string
	cc       *pgx.ConnConfig
	onChange func() // after a commit that wrote change log rows

	mu     sync.Mutex
	conn   *pgx.Conn // holds the shared instance lock, and the leader lock when leader
	leader bool
}

// OpenCluster opens the database for one node of a cluster named node.
func OpenCluster(ctx context.Context, dsn, node string) (*Store, error) {
	s, err := open(ctx, dsn, false)
	if err != nil {
		return nil, err
	}
	cc, _ := pgx.ParseConfig(dsn)
	s.cluster = &cluster{node: node, cc: cc, onChange: func() {}}
	if err := s.cluster.connect(ctx); err != nil {
		s.Close()
		return nil, err
	}
	// Move the sequences past every ID in use (a server without --cluster
	// hands out IDs in memory). A concurrent start is harmless: a claim
	// that meets a used ID takes the next one.
	_, err = s.pool.Exec(ctx, `SELECT setval('cluster_device_ids', m) FROM (SELECT greatest(
			(SELECT coalesce(max(id), 0) FROM devices),
			(SELECT coalesce(max(value), 0) FROM trust_counters WHERE name = $1)) AS m) x
		WHERE m > (SELECT CASE WHEN is_called THEN last_value ELSE -1 END FROM cluster_device_ids)`, batchutil.CounterMaxDeleted)
	if err == nil {
		_, err = s.pool.Exec(ctx, `SELECT setval('cluster_profile_ids', m) FROM (SELECT coalesce(max(id), 0) AS m FROM profiles) x
			WHERE m > (SELECT CASE WHEN is_called THEN last_value ELSE -1 END FROM cluster_profile_ids)`)
	}
	if err != nil {
		s.Close()
		return nil, fmt.Errorf("postgres: cluster sequences: %w", err)
	}
	return s, nil
}

// connect opens the node's own connection and takes the shared lock.
func (c *cluster) connect(ctx context.Context) error {
	conn, err := pgx.ConnectConfig(ctx, c.cc.Copy())
	if err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	var got bool
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock_shared($1)`, int64(instanceKey)).Scan(&got); err != nil {
		conn.Close(ctx)
		return fmt.Errorf("postgres: cluster lock: %w", err)
	}
	if !got {
		conn.Close(ctx)
		return errors.New("postgres: a server without --cluster holds this database; stop it first")
	}
	c.conn, c.leader = conn, false
	return nil
}

// OnChange sets what runs after every commit that wrote change log rows
// (the node's fast path to the others).
func (s *Store) OnChange(f func()) {
	if s.cluster != nil {
		s.cluster.onChange = f
	}
}

// TryLeader says whether this node is the cluster's leader, taking the
// leader lock when it is free. The lock lives on the node's own
// connection: if that dies (the database restarts, the network goes), the
// lock is released and another node takes it.
func (s *Store) TryLeader(ctx context.Context) (bool, error) {
	c := s.cluster
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn == nil || c.conn.Ping(ctx) != nil {
		if c.conn != nil {
			c.conn.Close(ctx)
			c.conn, c.leader = nil, false
		}
		if err := c.connect(ctx); err != nil {
			return false, err
		}
	}
	if c.leader {
		return true, nil
	}
	if err := c.conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, int64(leaderKey)).Scan(&c.leader); err != nil {
		return false, err
	}
	return c.leader, nil
}

func (c *cluster) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c.conn.Close(ctx)
		c.conn = nil
	}
}

// queueChanges adds the change log rows of a batch to its pipeline.
func (c *cluster) queueChanges(q *pgx.Batch, profiles []fleet.Profile, devices []fleet.DeviceRecord, trust []fleet.TrustRecord) bool {
	var dev, prof []int64
	for i := range devices {
		dev = append(dev, int64(devices[i].ID))
	}
	for i := range trust {
		dev = append(dev, int64(trust[i].DeviceID))
	}
	for i := range profiles {
		prof = append(prof, int64(profiles[i].ID))
	}
	if len(dev)+len(prof) == 0 {
		return false
	}
	now := time.Now().UnixMilli()
	q.Queue(`INSERT INTO cluster_changes (kind, id, node, at)
		SELECT $1::smallint, unnest($2::bigint[]), $5::text, $6::bigint UNION ALL SELECT $3::smallint, unnest($4::bigint[]), $5::text, $6::bigint`,
		int16(fleet.ChangeDevice), dev, int16(fleet.ChangeProfile), prof, c.node, now)
	return true
}

// NextDeviceID implements fleet.ClusterStore.
func (s *Store) NextDeviceID(ctx context.Context) (uint64, error) {
	var id int64
	err := s.pool.QueryRow(ctx, `SELECT nextval('cluster_device_ids')`).Scan(&id)
	return uint64(id), err
}

// ClaimDevice implements fleet.ClusterStore: one transaction inserts the
// device unless its machine ID (or, after a start race, its ID) is taken,
// its trust record and the change log row.
func (s *Store) ClaimDevice(ctx context.Context, rec fleet.DeviceRecord, tr fleet.TrustRecord) (bool, error) {
	won, idTaken, err := s.claimDevice(ctx, rec, tr)
	if err == nil && idTaken {
		// A server without --cluster handed the ID out before this node
		// started; the token names the ID, so the registration fails.
		err = fmt.Errorf("postgres: device ID %d already in use", rec.ID)
	}
	return won, err
}

func (s *Store) claimDevice(ctx context.Context, rec fleet.DeviceRecord, tr fleet.TrustRecord) (won, idTaken bool, err error) {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return false, false, err
	}
	defer tx.Rollback(ctx)
	tag, err := tx.Exec(ctx, `INSERT INTO devices (id, machine_id, device_type, model, firmware, serial, token_hash, registered_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT DO NOTHING`,
		int64(rec.ID), rec.MachineID, rec.DeviceType, rec.Model, rec.Firmware, rec.Serial, nonNil(rec.TokenHash), rec.RegisteredAt.Unix())
	if err != nil {
		return false, false, err
	}
	if tag.RowsAffected() == 0 {
		var n int
		err := tx.QueryRow(ctx, `SELECT count(*) FROM devices WHERE machine_id = $1`, rec.MachineID).Scan(&n)
		return false, n == 0, err
	}
	var q pgx.Batch
	queueTrust(&q, []fleet.TrustRecord{tr})
	s.cluster.queueChanges(&q, nil, []fleet.DeviceRecord{rec}, nil)
	if err := tx.SendBatch(ctx, &q).Close(); err != nil {
		return false, false, err
	}
	if err := tx.Commit(ctx); err != nil {
		return false, false, err
	}
	s.cluster.onChange()
	return true, false, nil
}

// ClaimProfile implements fleet.ClusterStore.
func (s *Store) ClaimProfile(ctx context.Context, p fleet.Profile) (fleet.Profile, error) {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return p, err
	}
	defer tx.Rollback(ctx)
	var id int64
	err = tx.QueryRow(ctx, `INSERT INTO profiles (id, device_type, firmware, version, config, push_interval, created_at, updated_at)
		VALUES (nextval('cluster_profile_ids'), $1, $2, $3, $4, $5, $6, $7) ON CONFLICT (device_type, firmware) DO NOTHING RETURNING id`,
		p.DeviceType, p.Firmware, p.Version, nonNil(p.Config), p.PushInterval, p.CreatedAt.UnixMilli(), p.UpdatedAt.UnixMilli()).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		stored, ok, err := s.ProfileOf(ctx, p.DeviceType, p.Firmware)
		if err == nil && !ok {
			err = fmt.Errorf("postgres: profile %s/%s neither stored nor storable", p.DeviceType, p.Firmware)
		}
		return stored, err
	}
	if err != nil {
		return p, err
	}
	p.ID = uint64(id)
	var q pgx.Batch
	s.cluster.queueChanges(&q, []fleet.Profile{p}, nil, nil)
	if err := tx.SendBatch(ctx, &q).Close(); err != nil {
		return p, err
	}
	if err := tx.Commit(ctx); err != nil {
		return p, err
	}
	s.cluster.onChange()
	return p, nil
}

const selectProfile = `SELECT id, device_type, firmware, version, config, push_interval, created_at, updated_at FROM profiles `

func scanProfile(row pgx.Row) (fleet.Profile, bool, error) {
	var p fleet.Profile
	var id, created, updated int64
	err := row.Scan(&id, &p.DeviceType, &p.Firmware, &p.Version, (*[]byte)(&p.Config), &p.PushInterval, &created, &updated)
	if errors.Is(err, pgx.ErrNoRows) {
		return p, false, nil
	}
	p.ID = uint64(id)
	p.CreatedAt, p.UpdatedAt = time.UnixMilli(created).UTC(), time.UnixMilli(updated).UTC()
	return p, err == nil, err
}

// ReadProfile implements fleet.ClusterStore.
func (s *Store) ReadProfile(ctx context.Context, id uint64) (fleet.Profile, bool, error) {
	return scanProfile(s.pool.QueryRow(ctx, selectProfile+`WHERE id = $1`, int64(id)))
}

// ProfileOf implements fleet.ClusterStore.
func (s *Store) ProfileOf(ctx context.Context, deviceType, firmware string) (fleet.Profile, bool, error) {
	return scanProfile(s.pool.QueryRow(ctx, selectProfile+`WHERE device_type = $1 AND firmware = $2`, deviceType, firmware))
}

// ReadDevice implements fleet.ClusterStore.
func (s *Store) ReadDevice(ctx context.Context, id uint64) (fleet.DeviceRecord, fleet.TrustRecord, bool, error) {
	var d fleet.DeviceRecord
	var tr fleet.TrustRecord
	var r batchutil.TrustRow
	var registered, lastSeen, seq int64
	var configError []byte
	var adm *string
	err := s.pool.QueryRow(ctx, `SELECT d.machine_id, d.device_type, d.model, d.firmware, d.serial, d.token_hash, d.registered_at,
			d.last_seen, d.seq, d.applied_version, d.config_error,
			t.admission, t.key_hash, t.request_key_hash, coalesce(t.request_at, 0), coalesce(t.request_from, ''), coalesce(t.request_approved, false)
		FROM devices d LEFT JOIN device_trust t ON t.device_id = d.id WHERE d.id = $1`, int64(id)).Scan(
		&d.MachineID, &d.DeviceType, &d.Model, &d.Firmware, &d.Serial, &d.TokenHash, &registered,
		&lastSeen, &seq, &d.State.AppliedVersion, &configError,
		&adm, &r.KeyHash, &r.RequestKeyHash, &r.RequestAt, &r.RequestFrom, &r.RequestApproved)
	if errors.Is(err, pgx.ErrNoRows) {
		return d, tr, false, nil
	}
	if err != nil {
		return d, tr, false, err
	}
	d.ID = id
	d.RegisteredAt = time.Unix(registered, 0).UTC()
	d.State.DeviceID, d.State.LastSeen, d.State.Seq = id, batchutil.FromLastSeen(lastSeen), uint64(seq)
	d.State.Firmware, d.State.ConfigError = d.Firmware, string(configError)
	tr.DeviceID = id
	if adm != nil {
		r.DeviceID, r.Admission = id, *adm
		if tr, err = r.Record(); err != nil {
			return d, tr, false, err
		}
	}
	return d, tr, true, nil
}

// DeviceIDOf implements fleet.ClusterStore.
func (s *Store) DeviceIDOf(ctx context.Context, machineID string) (uint64, bool, error) {
	var id int64
	err := s.pool.QueryRow(ctx, `SELECT id FROM devices WHERE machine_id = $1`, machineID).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, false, nil
	}
	return uint64(id), err == nil, err
}

// LastChange is the change log's highest sequence number.
func (s *Store) LastChange(ctx context.Context) (int64, error) {
	var seq int64
	err := s.pool.QueryRow(ctx, `SELECT coalesce(max(seq), 0) FROM cluster_changes`).Scan(&seq)
	return seq, err
}

// ChangesAfter reads at most limit change log entries after seq or among
// holes (numbers before seq not seen yet), oldest first.
func (s *Store) ChangesAfter(ctx context.Context, seq int64, holes []int64, limit int) ([]fleet.Change, error) {
	if holes == nil {
		holes = []int64{}
	}
	rows, err := s.pool.Query(ctx, `SELECT seq, kind, id, node, at FROM cluster_changes WHERE seq > $1 OR seq = ANY($2)
		ORDER BY seq LIMIT $3`, seq, holes, limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []fleet.Change
	for rows.Next() {
		var c fleet.Change
		var kind int16
		var id, at int64
		if err := rows.Scan(&c.Seq, &kind, &id, &c.Node, &at); err != nil {
			return nil, err
		}
		c.Kind, c.ID, c.At = fleet.ChangeKind(kind), uint64(id), time.UnixMilli(at).UTC()
		out = append(out, c)
	}
	return out, rows.Err()
}

// PruneChanges deletes change log entries older than before.
func (s *Store) PruneChanges(ctx context.Context, before time.Time) (int64, error) {
	tag, err := s.pool.Exec(ctx, `DELETE FROM cluster_changes WHERE at < $1`, before.UnixMilli())
	return tag.RowsAffected(), err
}

// StatesSince reads the pushes stored with a last-seen time after since
// (other nodes' pushes, when they cannot say so themselves). It reads the
// whole devices table: last_seen has no index, which keeps pushes' updates
// HOT.
func (s *Store) StatesSince(ctx context.Context, since time.Time) ([]fleet.StateRecord, error) {
	rows, err := s.pool.Query(ctx, `SELECT id, last_seen, seq, applied_version, config_error FROM devices WHERE last_seen > $1`,
		batchutil.LastSeen(since))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []fleet.StateRecord
	for rows.Next() {
		var r fleet.StateRecord
		var id, seen, seq int64
		var ce []byte
		if err := rows.Scan(&id, &seen, &seq, &r.AppliedVersion, &ce); err != nil {
			return nil, err
		}
		r.DeviceID, r.LastSeen, r.Seq, r.ConfigError = uint64(id), batchutil.FromLastSeen(seen), uint64(seq), string(ce)
		out = append(out, r)
	}
	return out, rows.Err()
}

// Heartbeat records n as alive now.
func (s *Store) Heartbeat(ctx context.Context, n fleet.ClusterNode) error {
	_, err := s.pool.Exec(ctx, `INSERT INTO cluster_nodes (name, host, pid, address, started_at, heartbeat) VALUES ($1, $2, $3, $4, $5, $6)
		ON CONFLICT (name) DO UPDATE SET host = excluded.host, pid = excluded.pid, address = excluded.address,
			started_at = excluded.started_at, heartbeat = excluded.heartbeat`,
		n.Name, n.Host, int64(n.PID), n.Address, n.StartedAt.UnixMilli(), n.Heartbeat.UnixMilli())
	return err
}

// Leave removes node name from cluster_nodes (a clean stop).
func (s *Store) Leave(ctx context.Context, name string) error {
	_, err := s.pool.Exec(ctx, `DELETE FROM cluster_nodes WHERE name = $1`, name)
	return err
}

// Nodes lists the recorded nodes by name.
func (s *Store) Nodes(ctx context.Context) ([]fleet.ClusterNode, error) {
	rows, err := s.pool.Query(ctx, `SELECT name, host, pid, address, started_at, heartbeat FROM cluster_nodes ORDER BY name`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []fleet.ClusterNode
	for rows.Next() {
		var n fleet.ClusterNode
		var pid, started, beat int64
		if err := rows.Scan(&n.Name, &n.Host, &pid, &n.Address, &started, &beat); err != nil {
			return nil, err
		}
		n.PID, n.StartedAt, n.Heartbeat = int(pid), time.UnixMilli(started).UTC(), time.UnixMilli(beat).UTC()
		out = append(out, n)
	}
	return out, rows.Err()
}

// ClusterID names the cluster: a random value the first node stores.
func (s *Store) ClusterID(ctx context.Context) (string, error) {
	var id string
	err := s.pool.QueryRow(ctx, `WITH ins AS (INSERT INTO settings (name, value) VALUES ('cluster_id', md5(random()::text || clock_timestamp()::text))
			ON CONFLICT (name) DO NOTHING RETURNING value)
		SELECT value FROM ins UNION ALL SELECT value FROM settings WHERE name = 'cluster_id'`).Scan(&id)
	return id, err
}

// NoteChange implements fleet.ClusterStore.
func (s *Store) NoteChange(ctx context.Context, kind fleet.ChangeKind, id uint64) error {
	_, err := s.pool.Exec(ctx, `INSERT INTO cluster_changes (kind, id, node, at) VALUES ($1, $2, $3, $4)`,
		int16(kind), int64(id), s.cluster.node, time.Now().UnixMilli())
	if err == nil {
		s.cluster.onChange()
	}
	return err
}
