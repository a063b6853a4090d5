package postgres

import (
	"context"
	"encoding/json"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/drover/drover/internal/fleet"
)

// Remote commands in cluster mode (docs/commands.md#cluster-mode): the
// device_commands rows are the truth every node reads and changes with
// conditional statements, so that a command is delivered once and its
// result recorded once whichever nodes the device pushes to.

// NextJobID implements fleet.ClusterStore.
func (s *Store) NextJobID(ctx context.Context) (uint64, error) {
	var id int64
	err := s.pool.QueryRow(ctx, `SELECT nextval('cluster_job_ids')`).Scan(&id)
	return uint64(id), err
}

// QueuedDevices implements fleet.ClusterStore: an index scan of the
// primary key (job_id, device_id).
func (s *Store) QueuedDevices(ctx context.Context, jobID, after uint64, limit int) ([]uint64, error) {
	rows, err := s.pool.Query(ctx, `SELECT device_id FROM device_commands WHERE job_id = $1 AND device_id > $2 AND state = 'queued'
		ORDER BY device_id LIMIT $3`, int64(jobID), int64(after), limit)
	return collectIDs(rows, err)
}

// collectIDs reads a query's one bigint column as IDs.
func collectIDs(rows pgx.Rows, err error) ([]uint64, error) {
	if err != nil {
		return nil, err
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	out := make([]uint64, len(ids))
	for i, id := range ids {
		out[i] = uint64(id)
	}
	return out, err
}

// finishDelivered records a delivered command's end (a result, or expiry)
// unless it has one already: the condition on the state makes it once.
const finishDelivered = `UPDATE device_commands SET state = $3, finished_at = $4, exit_code = $5, error = $6, output = $7,
	started_on = $8, finished_on = $9 WHERE job_id = $1 AND device_id = $2 AND state = 'delivered'`

func queueFinish(q *pgx.Batch, c fleet.DeviceCommand) {
	q.Queue(finishDelivered, int64(c.JobID), int64(c.DeviceID), c.State.String(), c.FinishedAt.UnixMilli(), c.ExitCode, c.Error,
		fleet.MarshalOutput(c.Output), c.StartedOn, c.FinishedOn)
}

// claimCommands marks at most $3 of a device's queued commands of active,
// unexpired jobs delivered and returns them. FOR UPDATE ... SKIP LOCKED:
// two nodes claiming for the same device at once never get the same row
// (the second skips the locked row; one committed meanwhile no longer
// matches state = 'queued' when rechecked).
const claimCommands = `WITH c AS (
		SELECT dc.job_id FROM device_commands dc JOIN command_jobs j ON j.id = dc.job_id
		WHERE dc.device_id = $1 AND dc.state = 'queued' AND j.state = 'active' AND j.expires_at > $2
		ORDER BY dc.job_id LIMIT $3 FOR UPDATE OF dc SKIP LOCKED)
	UPDATE device_commands d SET state = 'delivered', delivered_at = $2 FROM c, command_jobs j
	WHERE d.job_id = c.job_id AND d.device_id = $1 AND d.state = 'queued' AND j.id = d.job_id
	RETURNING j.id, j.kind, j.args, j.timeout`

// CommandsOnPush implements fleet.ClusterStore: one pipeline, one implicit
// transaction (statements up to the batch's Sync), one round trip.
func (s *Store) CommandsOnPush(ctx context.Context, deviceID uint64, results []fleet.DeviceCommand, claim int, now time.Time) ([]fleet.JobRecord, bool, error) {
	var q pgx.Batch
	for _, r := range results {
		queueFinish(&q, r)
	}
	if claim > 0 {
		q.Queue(claimCommands, int64(deviceID), now.UnixMilli(), claim)
		q.Queue(`SELECT EXISTS (SELECT 1 FROM device_commands WHERE device_id = $1 AND state = 'queued')`, int64(deviceID))
	}
	br := s.pool.SendBatch(ctx, &q)
	defer br.Close()
	for range results {
		if _, err := br.Exec(); err != nil {
			return nil, false, err
		}
	}
	if claim == 0 {
		return nil, false, br.Close()
	}
	rows, err := br.Query()
	if err != nil {
		return nil, false, err
	}
	var out []fleet.JobRecord
	for rows.Next() {
		var j fleet.JobRecord
		var id int64
		var args string
		if err := rows.Scan(&id, &j.Kind, &args, &j.Timeout); err != nil {
			rows.Close()
			return nil, false, err
		}
		j.ID = uint64(id)
		if err := json.Unmarshal([]byte(args), &j.Args); err != nil {
			rows.Close()
			return nil, false, err
		}
		out = append(out, j)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, false, err
	}
	var more bool
	if err := br.QueryRow().Scan(&more); err != nil {
		return nil, false, err
	}
	return out, more, br.Close()
}

// FinishDelivered implements fleet.ClusterStore.
func (s *Store) FinishDelivered(ctx context.Context, cmds []fleet.DeviceCommand) (int64, error) {
	var n int64
	for len(cmds) > 0 {
		k := min(len(cmds), 1000)
		var q pgx.Batch
		for _, c := range cmds[:k] {
			queueFinish(&q, c)
		}
		br := s.pool.SendBatch(ctx, &q)
		for range k {
			tag, err := br.Exec()
			if err != nil {
				br.Close()
				return n, err
			}
			n += tag.RowsAffected()
		}
		if err := br.Close(); err != nil {
			return n, err
		}
		cmds = cmds[k:]
	}
	return n, nil
}

// SetJobState implements fleet.ClusterStore.
func (s *Store) SetJobState(ctx context.Context, id uint64, from []fleet.JobState, to fleet.JobState) (bool, error) {
	names := make([]string, len(from))
	for i, st := range from {
		names[i] = st.String()
	}
	tag, err := s.pool.Exec(ctx, `UPDATE command_jobs SET state = $2 WHERE id = $1 AND state = ANY($3)`, int64(id), to.String(), names)
	return tag.RowsAffected() == 1, err
}

// DeliveredCommands implements fleet.ClusterStore: the partial index
// device_commands_pending.
func (s *Store) DeliveredCommands(ctx context.Context, before time.Time, limit int) ([]fleet.DeviceCommand, error) {
	rows, err := s.pool.Query(ctx, `SELECT dc.job_id, dc.device_id, dc.queued_at, dc.delivered_at FROM device_commands dc
		JOIN command_jobs j ON j.id = dc.job_id
		WHERE dc.state = 'delivered' AND dc.delivered_at + j.timeout * 1000 < $1 ORDER BY dc.delivered_at LIMIT $2`, before.UnixMilli(), limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []fleet.DeviceCommand
	for rows.Next() {
		var job, dev, queued, delivered int64
		if err := rows.Scan(&job, &dev, &queued, &delivered); err != nil {
			return nil, err
		}
		out = append(out, fleet.DeviceCommand{JobID: uint64(job), DeviceID: uint64(dev), State: fleet.CmdDelivered,
			QueuedAt: time.UnixMilli(queued).UTC(), DeliveredAt: time.UnixMilli(delivered).UTC()})
	}
	return out, rows.Err()
}

// CloseJobs implements fleet.ClusterCommands: one conditional statement.
// A caller runs it after committing the changes that ended copies, so of
// two nodes ending a job's last two copies at once the later to commit
// sees both ended; the condition on the state moves each job once. The
// NOT EXISTS probe stops at the first queued or delivered copy (the
// primary key's job_id prefix, or the partial index of pending copies).
func (s *Store) CloseJobs(ctx context.Context, ids []uint64) ([]uint64, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	arg := make([]int64, len(ids))
	for i, id := range ids {
		arg[i] = int64(id)
	}
	rows, err := s.pool.Query(ctx, `UPDATE command_jobs j SET state = 'done'
		WHERE j.id = ANY($1) AND j.state = 'active' AND j.creating = 0
		AND NOT EXISTS (SELECT 1 FROM device_commands d WHERE d.job_id = j.id AND d.state IN ('queued', 'delivered'))
		RETURNING j.id`, arg)
	return collectIDs(rows, err)
}
