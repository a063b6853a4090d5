package sqlcommon

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/drover/drover/internal/fleet"
)

// Remote commands (fleet.CommandStore) on the tables of each adapter's
// 070_commands migration. Times are unix ms; states their names.

// Commands implements fleet.CommandStore.
type Commands struct{ *Base }

var _ fleet.CommandStore = (*Commands)(nil)

const jobCols = `id, kind, args, timeout, target, filter, device_id, state, created_at, expires_at, total, creating, cursor_id, last_id`

const devCmdCols = `job_id, device_id, state, queued_at, delivered_at, finished_at, exit_code, error, output, started_on, finished_on`

func jobArgs(j fleet.JobRecord) ([]any, error) {
	args, err := json.Marshal(j.Args)
	if err != nil {
		return nil, err
	}
	creating := 0
	if j.Creating {
		creating = 1
	}
	return []any{int64(j.ID), j.Kind, string(args), j.Timeout, j.Target, j.Filter, int64(j.DeviceID), j.State.String(),
		ms(j.CreatedAt), ms(j.ExpiresAt), j.Total, creating, int64(j.Cursor), int64(j.LastID)}, nil
}

func devCmdArgs(c fleet.DeviceCommand) []any {
	return []any{int64(c.JobID), int64(c.DeviceID), c.State.String(), ms(c.QueuedAt), ms(c.DeliveredAt), ms(c.FinishedAt),
		c.ExitCode, c.Error, fleet.MarshalOutput(c.Output), c.StartedOn, c.FinishedOn}
}

func placeholders(n int) string { return strings.TrimSuffix(strings.Repeat("?, ", n), ", ") }

// LoadCommands implements fleet.CommandStore.
func (a *Commands) LoadCommands(ctx context.Context, each func(fleet.DeviceCommand) error) ([]fleet.JobRecord, error) {
	jobs, err := a.jobs(ctx, `SELECT `+jobCols+` FROM command_jobs ORDER BY id`,
		`SELECT job_id, state, count(*) FROM device_commands GROUP BY job_id, state`)
	if err != nil {
		return nil, err
	}
	rows, err := a.R.QueryContext(ctx, `SELECT `+devCmdCols+` FROM device_commands WHERE state IN ('queued', 'delivered')`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		c, err := scanDevCmd(rows)
		if err != nil {
			return nil, err
		}
		if err := each(c); err != nil {
			return nil, err
		}
	}
	return jobs, rows.Err()
}

// ReadJobs reads the jobs of ids that are stored, in ID order, with
// their counts by state if counts (cluster mode: the database holds the
// cluster's counts; fleet.ClusterStore).
func (a *Commands) ReadJobs(ctx context.Context, ids []uint64, counts bool) ([]fleet.JobRecord, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	in := make([]string, len(ids))
	for i, id := range ids {
		in[i] = strconv.FormatUint(id, 10)
	}
	list := strings.Join(in, ", ")
	cq := ""
	if counts {
		cq = `SELECT job_id, state, count(*) FROM device_commands WHERE job_id IN (` + list + `) GROUP BY job_id, state`
	}
	return a.jobs(ctx, `SELECT `+jobCols+` FROM command_jobs WHERE id IN (`+list+`) ORDER BY id`, cq)
}

// jobs reads the jobs query q selects and fills their counts from counts
// (job_id, state, count rows; "": none).
func (a *Commands) jobs(ctx context.Context, q, counts string) ([]fleet.JobRecord, error) {
	rows, err := a.R.QueryContext(ctx, q)
	if err != nil {
		return nil, err
	}
	var jobs []fleet.JobRecord
	index := map[uint64]int{}
	for rows.Next() {
		var j fleet.JobRecord
		var id, dev, cursor, last int64
		var args, state string
		var created, expires int64
		var creating int
		if err := rows.Scan(&id, &j.Kind, &args, &j.Timeout, &j.Target, &j.Filter, &dev, &state, &created, &expires, &j.Total, &creating, &cursor, &last); err != nil {
			rows.Close()
			return nil, err
		}
		if err := json.Unmarshal([]byte(args), &j.Args); err != nil {
			rows.Close()
			return nil, fmt.Errorf("job %d: args: %w", id, err)
		}
		st, ok := fleet.ParseJobState(state)
		if !ok {
			rows.Close()
			return nil, fmt.Errorf("job %d: unknown state %q", id, state)
		}
		j.ID, j.DeviceID, j.Cursor, j.LastID, j.State = uint64(id), uint64(dev), uint64(cursor), uint64(last), st
		j.CreatedAt, j.ExpiresAt, j.Creating = fromMS(created), fromMS(expires), creating != 0
		index[j.ID] = len(jobs)
		jobs = append(jobs, j)
	}
	if err := closeRows(rows); err != nil || counts == "" {
		return jobs, err
	}
	rows, err = a.R.QueryContext(ctx, counts)
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var id int64
		var state string
		var n int
		if err := rows.Scan(&id, &state, &n); err != nil {
			rows.Close()
			return nil, err
		}
		st, ok := fleet.ParseCommandState(state)
		if i, known := index[uint64(id)]; ok && known {
			jobs[i].Counts[st] = n
		}
	}
	return jobs, closeRows(rows)
}

func closeRows(rows *sql.Rows) error {
	err := rows.Err()
	rows.Close()
	return err
}

func scanDevCmd(rows *sql.Rows) (fleet.DeviceCommand, error) {
	var c fleet.DeviceCommand
	var job, dev, queued, delivered, finished int64
	var state, output string
	if err := rows.Scan(&job, &dev, &state, &queued, &delivered, &finished, &c.ExitCode, &c.Error, &output, &c.StartedOn, &c.FinishedOn); err != nil {
		return c, err
	}
	st, ok := fleet.ParseCommandState(state)
	if !ok {
		return c, fmt.Errorf("command %d/%d: unknown state %q", job, dev, state)
	}
	out, err := fleet.UnmarshalOutput(output)
	if err != nil {
		return c, fmt.Errorf("command %d/%d: output: %w", job, dev, err)
	}
	c.JobID, c.DeviceID, c.State, c.Output = uint64(job), uint64(dev), st, out
	c.QueuedAt, c.DeliveredAt, c.FinishedAt = fromMS(queued), fromMS(delivered), fromMS(finished)
	return c, nil
}

// saveJob inserts j or, when stored, replaces the columns update names
// (none: all).
func (a *Commands) saveJob(ctx context.Context, tx *sql.Tx, j fleet.JobRecord, update ...string) error {
	args, err := jobArgs(j)
	if err != nil {
		return err
	}
	cols := strings.Split(strings.ReplaceAll(jobCols, " ", ""), ",")
	if len(update) == 0 {
		update = cols[1:]
	}
	_, err = tx.ExecContext(ctx, a.D.q(`INSERT INTO command_jobs (`+jobCols+`) VALUES (`+placeholders(len(cols))+`)`+a.D.upsert("id", update...)), args...)
	return err
}

// SaveJob implements fleet.CommandStore.
func (a *Commands) SaveJob(ctx context.Context, j fleet.JobRecord) error {
	return a.tx(ctx, func(tx *sql.Tx) error { return a.saveJob(ctx, tx, j) })
}

// AddDeviceCommands implements fleet.CommandStore: a stored job keeps its
// state (a pause or cancel meanwhile, from another node in cluster mode);
// only its progress is written.
func (a *Commands) AddDeviceCommands(ctx context.Context, j fleet.JobRecord, cmds []fleet.DeviceCommand) error {
	return a.tx(ctx, func(tx *sql.Tx) error {
		if len(cmds) > 0 {
			st, err := tx.PrepareContext(ctx, a.D.q(a.D.insertIgnore(`INSERT INTO device_commands (`+devCmdCols+`) VALUES (`+placeholders(11)+`)`)))
			if err != nil {
				return err
			}
			defer st.Close()
			for _, c := range cmds {
				if _, err := st.ExecContext(ctx, devCmdArgs(c)...); err != nil {
					return err
				}
			}
		}
		return a.saveJob(ctx, tx, j, "total", "creating", "cursor_id", "last_id")
	})
}

// SaveDeviceCommands implements fleet.CommandStore.
func (a *Commands) SaveDeviceCommands(ctx context.Context, cmds []fleet.DeviceCommand) error {
	cols := strings.Split(strings.ReplaceAll(devCmdCols, " ", ""), ",")
	q := `INSERT INTO device_commands (` + devCmdCols + `) VALUES (` + placeholders(len(cols)) + `)` + a.D.upsert("job_id, device_id", cols[2:]...)
	return a.execEach(ctx, q, len(cmds), func(i int) ([]any, error) { return devCmdArgs(cmds[i]), nil })
}

// FinishQueued implements fleet.CommandStore.
func (a *Commands) FinishQueued(ctx context.Context, jobID uint64, state fleet.CommandState, at time.Time) (int64, error) {
	res, err := a.exec(ctx, a.D.q(`UPDATE device_commands SET state = ?, finished_at = ? WHERE job_id = ? AND state = 'queued'`),
		state.String(), ms(at), int64(jobID))
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// DeviceCommands implements fleet.CommandStore.
func (a *Commands) DeviceCommands(ctx context.Context, q fleet.CommandQuery) ([]fleet.DeviceCommand, error) {
	var where []string
	var args []any
	order := `device_id`
	if q.JobID != 0 {
		where, args = append(where, `job_id = ?`, `device_id > ?`), append(args, int64(q.JobID), int64(q.After))
	}
	if q.DeviceID != 0 {
		where, args, order = append(where, `device_id = ?`), append(args, int64(q.DeviceID)), `job_id DESC`
		if q.After != 0 {
			where, args = append(where, `job_id < ?`), append(args, int64(q.After))
		}
	}
	if q.State != nil {
		where, args = append(where, `state = ?`), append(args, q.State.String())
	}
	if len(where) == 0 {
		where = []string{"1 = 1"}
	}
	limit := q.Limit
	if limit <= 0 {
		limit = 100
	}
	rows, err := a.R.QueryContext(ctx, a.D.q(`SELECT `+devCmdCols+` FROM device_commands WHERE `+strings.Join(where, " AND ")+
		` ORDER BY `+order+fmt.Sprintf(` LIMIT %d`, limit)), args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []fleet.DeviceCommand{}
	for rows.Next() {
		c, err := scanDevCmd(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, rows.Err()
}
