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
	// The pool's connection settings: the DSN less its pool_* settings,
	// which PostgreSQL would refuse as unknown parameters.
	cc := s.pool.Config().ConnConfig.Copy()
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
	if err == nil {
		_, err = s.pool.Exec(ctx, `SELECT setval('cluster_profile_versions', m) FROM (SELECT greatest(
				(SELECT coalesce(max(version), 0) FROM profiles), (SELECT coalesce(max(version), 0) FROM profile_revisions)) AS m) x
			WHERE m > (SELECT CASE WHEN is_called THEN last_value ELSE -1 END FROM cluster_profile_versions)`)
	}
	if err == nil {
		_, err = s.pool.Exec(ctx, `SELECT setval('cluster_firmware_ids', m) FROM (SELECT greatest(
				(SELECT coalesce(max(id), 0) FROM firmware), (SELECT coalesce(max(high), 0) FROM id_marks WHERE kind = 'firmware')) AS m) x
			WHERE m > (SELECT CASE WHEN is_called THEN last_value ELSE -1 END FROM cluster_firmware_ids)`)
	}
	if err == nil {
		_, err = s.pool.Exec(ctx, `SELECT setval('cluster_token_ids', m) FROM (SELECT coalesce(max(id), 0) AS m FROM enrollment_tokens) x
			WHERE m > (SELECT CASE WHEN is_called THEN last_value ELSE -1 END FROM cluster_token_ids)`)
	}
	if err == nil {
		_, err = s.pool.Exec(ctx, `SELECT setval('cluster_rollout_ids', m) FROM (SELECT coalesce(max(id), 0) AS m FROM rollouts) x
			WHERE m > (SELECT CASE WHEN is_called THEN last_value ELSE -1 END FROM cluster_rollout_ids)`)
	}
	if err == nil {
		_, err = s.pool.Exec(ctx, `SELECT setval('cluster_job_ids', m) FROM (SELECT coalesce(max(id), 0) AS m FROM command_jobs) x
			WHERE m > (SELECT CASE WHEN is_called THEN last_value ELSE -1 END FROM cluster_job_ids)`)
	}
	if err == nil {
		_, err = s.pool.Exec(ctx, `SELECT setval('cluster_label_ids', m) FROM (SELECT greatest(
				(SELECT coalesce(max(id), 0) FROM labels), (SELECT coalesce(max(high), 0) FROM id_marks WHERE kind = 'label')) AS m) x
			WHERE m > (SELECT CASE WHEN is_called THEN last_value ELSE -1 END FROM cluster_label_ids)`)
	}
	if err == nil {
		_, err = s.pool.Exec(ctx, `SELECT setval('cluster_rule_ids', m) FROM (SELECT greatest(
				(SELECT coalesce(max(id), 0) FROM alert_rules), (SELECT coalesce(max(high), 0) FROM id_marks WHERE kind = 'rule')) AS m) x
			WHERE m > (SELECT CASE WHEN is_called THEN last_value ELSE -1 END FROM cluster_rule_ids)`)
	}
	if err == nil {
		_, err = s.pool.Exec(ctx, `SELECT setval('cluster_event_ids', m) FROM (SELECT greatest(
				(SELECT coalesce(max(id), 0) FROM alert_events), (SELECT coalesce(max(high), 0) FROM id_marks WHERE kind = 'event')) AS m) x
			WHERE m > (SELECT CASE WHEN is_called THEN last_value ELSE -1 END FROM cluster_event_ids)`)
	}
	if err != nil {
		s.Close()
		return nil, fmt.Errorf("postgres: cluster sequences: %w", err)
	}
	s.startCompactor() // one node at a time compacts (history.go)
	return s, nil
}

// connect opens the node's own connection and takes the shared lock.
func (c *cluster) connect(ctx context.Context) error {
	conn, err := pgx.ConnectConfig(ctx, c.cc.Copy())
	if err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	var got bool
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock_shared($1 # `+schemaSalt+`)`, int64(instanceKey)).Scan(&got); err != nil {
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
	if err := c.conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1 # `+schemaSalt+`)`, int64(leaderKey)).Scan(&c.leader); err != nil {
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
func (s *Store) ClaimProfile(ctx context.Context, p fleet.Profile) (fleet.Profile, bool, error) {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return p, false, err
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
		return stored, false, err
	}
	if err != nil {
		return p, false, err
	}
	p.ID = uint64(id)
	var q pgx.Batch
	s.cluster.queueChanges(&q, []fleet.Profile{p}, nil, nil)
	if err := tx.SendBatch(ctx, &q).Close(); err != nil {
		return p, false, err
	}
	if err := tx.Commit(ctx); err != nil {
		return p, false, err
	}
	s.cluster.onChange()
	return p, true, nil
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

// NextProfileVersion implements fleet.ClusterStore.
func (s *Store) NextProfileVersion(ctx context.Context) (int64, error) {
	var v int64
	err := s.pool.QueryRow(ctx, `SELECT nextval('cluster_profile_versions')`).Scan(&v)
	return v, err
}

// NextFirmwareID implements fleet.ClusterStore.
func (s *Store) NextFirmwareID(ctx context.Context) (uint64, error) {
	var id int64
	err := s.pool.QueryRow(ctx, `SELECT nextval('cluster_firmware_ids')`).Scan(&id)
	return uint64(id), err
}

// NextLabelID implements fleet.ClusterStore.
func (s *Store) NextLabelID(ctx context.Context) (uint64, error) {
	var id int64
	err := s.pool.QueryRow(ctx, `SELECT nextval('cluster_label_ids')`).Scan(&id)
	return uint64(id), err
}

// NextRuleID hands out an alert rule ID no node has used (cluster mode:
// alert.Options.NextRuleID).
func (s *Store) NextRuleID(ctx context.Context) (uint64, error) {
	var id int64
	err := s.pool.QueryRow(ctx, `SELECT nextval('cluster_rule_ids')`).Scan(&id)
	return uint64(id), err
}

// NextEventIDs hands out n alert event IDs no node has used, ascending
// (cluster mode: alert.Options.NextEventIDs).
func (s *Store) NextEventIDs(ctx context.Context, n int) ([]uint64, error) {
	rows, err := s.pool.Query(ctx, `SELECT nextval('cluster_event_ids') AS id FROM generate_series(1, $1::int) ORDER BY id`, n)
	if err != nil {
		return nil, err
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, err
	}
	out := make([]uint64, len(ids))
	for i, id := range ids {
		out[i] = uint64(id)
	}
	return out, nil
}

// NextTokenID implements fleet.ClusterStore.
func (s *Store) NextTokenID(ctx context.Context) (uint64, error) {
	var id int64
	err := s.pool.QueryRow(ctx, `SELECT nextval('cluster_token_ids')`).Scan(&id)
	return uint64(id), err
}

// UseEnrollmentToken implements fleet.ClusterStore: the row settles which
// registration uses the token.
func (s *Store) UseEnrollmentToken(ctx context.Context, id, deviceID uint64, at time.Time) (bool, error) {
	tag, err := s.pool.Exec(ctx, `UPDATE enrollment_tokens SET used_at = $2, device_id = $3 WHERE id = $1 AND used_at = 0 AND NOT revoked`,
		int64(id), at.UnixMilli(), int64(deviceID))
	return tag.RowsAffected() == 1, err
}

// LoadEnrollment implements fleet.ClusterStore.
func (s *Store) LoadEnrollment(ctx context.Context) (fleet.TrustState, error) {
	var st fleet.TrustState
	err := s.loadEnrollment(ctx, &st)
	return st, err
}

// LastChange is the change log's highest sequence number.
func (s *Store) LastChange(ctx context.Context) (int64, error) {
	var seq int64
	err := s.pool.QueryRow(ctx, `SELECT coalesce(max(seq), 0) FROM cluster_changes`).Scan(&seq)
	return seq, err
}

// ChangesAfter reads the change log entries among holes (numbers before
// seq not seen yet), then at most limit entries after seq, oldest first.
// Two queries, each an index scan of the primary key touching only the
// rows it returns: one with "seq > $1 OR seq = ANY($2)" read the whole
// log at every poll (a bitmap or sequential scan, whatever the log's size).
func (s *Store) ChangesAfter(ctx context.Context, seq int64, holes []int64, limit int) ([]fleet.Change, error) {
	var out []fleet.Change
	var err error
	if len(holes) > 0 {
		if out, err = s.changes(ctx, out, `SELECT seq, kind, id, node, at FROM cluster_changes WHERE seq = ANY($1) ORDER BY seq`, holes); err != nil {
			return nil, err
		}
	}
	return s.changes(ctx, out, changesAfter, seq, limit)
}

const changesAfter = `SELECT seq, kind, id, node, at FROM cluster_changes WHERE seq > $1 ORDER BY seq LIMIT $2`

func (s *Store) changes(ctx context.Context, out []fleet.Change, q string, args ...any) ([]fleet.Change, error) {
	rows, err := s.pool.Query(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
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

// SavePushes stores a batch of this node's push summaries for the nodes
// NATS cannot reach (migration 051).
func (s *Store) SavePushes(ctx context.Context, body []byte) error {
	_, err := s.pool.Exec(ctx, `INSERT INTO cluster_pushes (node, at, body) VALUES ($1, $2, $3)`,
		s.cluster.node, time.Now().UnixMilli(), body)
	return err
}

// LastPushes is the highest sequence number of the stored push summaries.
func (s *Store) LastPushes(ctx context.Context) (int64, error) {
	var seq int64
	err := s.pool.QueryRow(ctx, `SELECT coalesce(max(seq), 0) FROM cluster_pushes`).Scan(&seq)
	return seq, err
}

// PushesAfter reads at most limit batches of push summaries after seq,
// oldest first: an index scan of the primary key.
func (s *Store) PushesAfter(ctx context.Context, seq int64, limit int) ([]fleet.PushSummaries, error) {
	rows, err := s.pool.Query(ctx, `SELECT seq, node, body FROM cluster_pushes WHERE seq > $1 ORDER BY seq LIMIT $2`, seq, limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []fleet.PushSummaries
	for rows.Next() {
		var b fleet.PushSummaries
		if err := rows.Scan(&b.Seq, &b.Node, &b.Body); err != nil {
			return nil, err
		}
		out = append(out, b)
	}
	return out, rows.Err()
}

// PrunePushes deletes push summaries stored before before.
func (s *Store) PrunePushes(ctx context.Context, before time.Time) (int64, error) {
	tag, err := s.pool.Exec(ctx, `DELETE FROM cluster_pushes WHERE at < $1`, before.UnixMilli())
	return tag.RowsAffected(), err
}

// Heartbeat records n as alive now.
func (s *Store) Heartbeat(ctx context.Context, n fleet.ClusterNode) error {
	_, err := s.pool.Exec(ctx, `INSERT INTO cluster_nodes (name, host, pid, address, started_at, heartbeat, nats_up) VALUES ($1, $2, $3, $4, $5, $6, $7)
		ON CONFLICT (name) DO UPDATE SET host = excluded.host, pid = excluded.pid, address = excluded.address,
			started_at = excluded.started_at, heartbeat = excluded.heartbeat, nats_up = excluded.nats_up`,
		n.Name, n.Host, int64(n.PID), n.Address, n.StartedAt.UnixMilli(), n.Heartbeat.UnixMilli(), n.NATS)
	return err
}

// Leave removes node name from cluster_nodes (a clean stop).
func (s *Store) Leave(ctx context.Context, name string) error {
	_, err := s.pool.Exec(ctx, `DELETE FROM cluster_nodes WHERE name = $1`, name)
	return err
}

// Nodes lists the recorded nodes by name.
func (s *Store) Nodes(ctx context.Context) ([]fleet.ClusterNode, error) {
	rows, err := s.pool.Query(ctx, `SELECT name, host, pid, address, started_at, heartbeat, nats_up FROM cluster_nodes ORDER BY name`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []fleet.ClusterNode
	for rows.Next() {
		var n fleet.ClusterNode
		var pid, started, beat int64
		if err := rows.Scan(&n.Name, &n.Host, &pid, &n.Address, &started, &beat, &n.NATS); err != nil {
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

// ClusterSecret is the cluster's secret called name: fresh, stored by the
// first node that asks, or the value stored before.
func (s *Store) ClusterSecret(ctx context.Context, name, fresh string) (string, error) {
	var v string
	err := s.pool.QueryRow(ctx, `WITH ins AS (INSERT INTO settings (name, value) VALUES ($1, $2)
			ON CONFLICT (name) DO NOTHING RETURNING value)
		SELECT value FROM ins UNION ALL SELECT value FROM settings WHERE name = $1`, name, fresh).Scan(&v)
	return v, err
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
