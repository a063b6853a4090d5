package fleet

// Remote commands in cluster mode (docs/commands.md#cluster-mode). The
// database holds every per-device command's state and every node changes
// it only with conditional statements (ClusterCommands): a claim marks
// queued commands delivered with SELECT … FOR UPDATE SKIP LOCKED, a
// result or an expiry moves a command only while it is delivered, a
// job's state moves only from the states the operation allows. So a
// command is delivered once and its result recorded once, whichever nodes
// the device pushes to, and counts, pause, resume and cancel are the
// database's, the same from every node.
//
// Memory keeps what makes the push path cheap: each node holds, in the
// device's queue (device.cmds), the jobs with a command queued for it. A
// push of a device without one asks the database nothing (as on one
// server); a push of a device with one makes one round trip (results and
// claim in one pipelined transaction). Nodes learn of queued commands
// through the change log: the node that queues a batch writes a ChangeJob
// entry, and every other node reads the batch's devices back (NATS nudges
// it within milliseconds, the change log poll every 250 ms without NATS).
// A device held as pending that has nothing left (delivered by another
// node, cancelled, expired) costs one round trip at its next push, which
// then drops it.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/drover/drover/internal/protocol"
)

const (
	// clusterReadTimeout bounds the database reads of Job and Jobs, which
	// take no context.
	clusterReadTimeout = 5 * time.Second
	queuedPage         = 10000 // devices read back per query
	overduePage        = 10000 // delivered commands the sweep reads at once
	// creationStall is how long a job may be creating without a batch
	// queued before the leader's sweep takes its creation over (the node
	// queueing it died, or restarted).
	creationStall = time.Minute
)

// clusterCommandsOnPush records a push's results and, when memory holds a
// queued command for the device (claim), claims its queued commands in
// the database; it returns the commands for the answer. A failure costs
// the answer its commands, never the push: they stay queued.
func (c *commands) clusterCommandsOnPush(ctx context.Context, d *device, results []protocol.CommandResult, claim bool, now time.Time) []protocol.Command {
	var before []*devCmd // what memory held before the claim
	n := 0
	if claim {
		n = protocol.MaxCommandsPerPush
		d.mu.Lock()
		if d.cmds != nil {
			before = slices.Clone(d.cmds.q)
		}
		d.mu.Unlock()
	}
	recs := make([]DeviceCommand, len(results))
	for i := range results {
		r := &results[i]
		to := CmdFailed
		if r.Succeeded() {
			to = CmdSucceeded
		}
		recs[i] = DeviceCommand{JobID: r.ID, DeviceID: d.id, State: to, FinishedAt: now.UTC(), ExitCode: r.ExitCode, Error: r.Error,
			Output: r.Output, StartedOn: r.StartedAt, FinishedOn: r.FinishedAt}
	}
	c.queries.Add(1)
	jobs, more, err := c.cluster.CommandsOnPush(ctx, d.id, recs, n, now)
	if err != nil {
		c.log.Warn("push: commands in the database failed; none sent", "device", d.id, "err", err)
		return nil
	}
	if len(results) > 0 {
		// Stored and committed: a job whose last copy these ended is
		// done now, whichever nodes ended its other copies.
		c.closeJobsOf(ctx, results, nil)
	}
	if !claim {
		return nil
	}
	d.mu.Lock()
	if q := d.cmds; q != nil {
		// Drop what was claimed, and when nothing is queued any more what
		// memory held before; a job that arrived meanwhile stays.
		q.q = slices.DeleteFunc(q.q, func(dc *devCmd) bool {
			return (!more && slices.Contains(before, dc)) || slices.ContainsFunc(jobs, func(j JobRecord) bool { return j.ID == dc.job.rec.ID })
		})
		if len(q.q) == 0 && !more {
			d.cmds = nil
		}
	}
	d.mu.Unlock()
	out := make([]protocol.Command, len(jobs))
	for i, j := range jobs {
		out[i] = protocol.Command{ID: j.ID, Kind: j.Kind, Args: j.Args, Timeout: j.Timeout}
	}
	return out
}

// refreshJob applies a ChangeJob entry: the job's state, and the devices
// with a command of it queued past those this node read, which are held
// as pending (and told to push, if connected here).
func (c *commands) refreshJob(ctx context.Context, id uint64) error {
	cs := c.cluster
	recs, err := cs.ReadJobs(ctx, []uint64{id}, false)
	if err != nil || len(recs) == 0 {
		return err
	}
	j := c.adoptJob(recs[0], true)
	j.progress.Store(c.now().UnixNano())
	if st := j.jobState(); (st != JobActive && st != JobPaused) || c.now().After(recs[0].ExpiresAt) {
		c.unqueue(j, func() {}) // nothing of it will be delivered: memory forgets it
		return nil
	}
	now := c.now().UnixNano()
	for {
		ids, err := cs.QueuedDevices(ctx, id, j.seen, queuedPage)
		if err != nil {
			return err
		}
		for _, dev := range ids {
			if err := c.holdPending(ctx, j, dev, now); err != nil {
				return err
			}
		}
		if len(ids) > 0 {
			j.seen = ids[len(ids)-1]
		}
		if len(ids) < queuedPage {
			return nil
		}
	}
}

// holdPending notes in memory that device id has a command of j queued.
func (c *commands) holdPending(ctx context.Context, j *job, id uint64, now int64) error {
	d := c.devs.get(id)
	if d == nil { // registered on another node a moment ago?
		if err := c.refreshDevice(ctx, id); err != nil {
			return err
		}
		if d = c.devs.get(id); d == nil {
			return nil // deleted
		}
	}
	d.mu.Lock()
	if d.cmds == nil || !slices.ContainsFunc(d.cmds.q, func(dc *devCmd) bool { return dc.job == j }) {
		enqueue(d, &devCmd{job: j, state: CmdQueued, queuedAt: now})
	}
	d.mu.Unlock()
	c.events.commandsQueued(id)
	return nil
}

// adoptJob puts a stored job into memory, or (withState) gives memory's
// copy the stored state; it returns memory's job.
func (c *commands) adoptJob(rec JobRecord, withState bool) *job {
	c.mu.Lock()
	c.init()
	j := c.jobs[rec.ID]
	if j == nil {
		j = newJob(rec)
		j.progress.Store(c.now().UnixNano())
		c.jobs[rec.ID] = j
		c.next = max(c.next, rec.ID+1)
		c.mu.Unlock()
		return j
	}
	c.mu.Unlock()
	if withState {
		j.apply(rec.State)
	}
	return j
}

// apply sets memory's state of j; a cancelled job's creation stops.
func (j *job) apply(st JobState) {
	j.mu.Lock()
	j.rec.State = st
	j.state.Store(uint32(st))
	j.mu.Unlock()
	if st == JobCancelled {
		j.halt()
	}
}

// clusterView is a stored job as the API shows it.
func clusterView(r JobRecord) Job {
	v := Job{ID: r.ID, Kind: r.Kind, Args: r.Args, Timeout: r.Timeout, Target: r.Target, State: r.State.String(),
		CreatedAt: r.CreatedAt, ExpiresAt: r.ExpiresAt, Total: r.Total, Creating: r.Creating, Counts: map[string]int{}}
	sum := 0
	for i, n := range commandStateNames {
		v.Counts[n] = r.Counts[i]
		sum += r.Counts[i]
	}
	if r.State == JobCancelled { // creation stopped: what was queued is the total
		v.Total, v.Creating = sum, false
	}
	return v
}

// jobView reads job id with its counts from the database.
func (c *commands) jobView(ctx context.Context, id uint64) (Job, error) {
	recs, err := c.cluster.ReadJobs(ctx, []uint64{id}, true)
	if err != nil {
		return Job{}, errors.Join(ErrUnavailable, err)
	}
	if len(recs) == 0 {
		return Job{}, ErrNotFound
	}
	c.adoptJob(recs[0], false) // made on another node a moment ago: known here now
	return clusterView(recs[0]), nil
}

func (c *commands) clusterJob(id uint64) (Job, error) {
	ctx, cancel := context.WithTimeout(context.Background(), clusterReadTimeout)
	defer cancel()
	return c.jobView(ctx, id)
}

// clusterJobs is the views of jobs, newest first, from the database; if it
// cannot be read, memory's (this node's counts only), and a warning.
func (c *commands) clusterJobs(jobs []*job) []Job {
	ids := make([]uint64, len(jobs))
	for i, j := range jobs {
		ids[i] = j.rec.ID
	}
	ctx, cancel := context.WithTimeout(context.Background(), clusterReadTimeout)
	defer cancel()
	recs, err := c.cluster.ReadJobs(ctx, ids, true)
	if err != nil {
		c.log.Warn("cluster: reading jobs failed; showing this node's counts", "err", err)
	}
	byID := make(map[uint64]JobRecord, len(recs))
	for _, r := range recs {
		byID[r.ID] = r
	}
	out := make([]Job, len(jobs))
	for i, j := range jobs {
		if r, ok := byID[j.rec.ID]; ok {
			out[i] = clusterView(r)
		} else {
			out[i] = j.view()
		}
	}
	return out
}

// closeClusterJobs marks done the jobs among ids the database finds
// ended (ClusterCommands.CloseJobs); memory and the other nodes learn it.
// Run after the changes that ended copies are committed: of two nodes
// ending a job's last two copies at once, the later one to commit sees
// both ended.
func (c *commands) closeClusterJobs(ctx context.Context, ids []uint64) error {
	done, err := c.cluster.CloseJobs(ctx, ids)
	if err != nil {
		return errors.Join(ErrUnavailable, err)
	}
	for _, id := range done {
		if j := c.job(id); j != nil {
			j.apply(JobDone)
			c.unqueue(j, func() {})
		}
		c.note(ctx, ChangeJob, id)
	}
	return nil
}

// pauseCluster moves a job between active and paused in the database.
func (c *commands) pauseCluster(ctx context.Context, id uint64, pause bool) (Job, error) {
	from, to := JobActive, JobPaused
	if !pause {
		from, to = JobPaused, JobActive
	}
	moved, err := c.cluster.SetJobState(ctx, id, []JobState{from}, to)
	if err != nil {
		return Job{}, errors.Join(ErrUnavailable, err)
	}
	v, err := c.jobChanged(ctx, id, moved, to)
	if err != nil || !moved || pause {
		return v, err
	}
	// Every copy may have ended while it was paused.
	if err := c.closeClusterJobs(ctx, []uint64{id}); err != nil {
		return Job{}, err
	}
	return c.jobView(ctx, id)
}

// cancelCluster cancels a job in the database, then its queued commands.
// A node still creating the job stops at its next batch (it reads the
// change); what it queued meanwhile the sweep cancels, and no node
// delivers it (a claim takes commands of active jobs only).
func (c *commands) cancelCluster(ctx context.Context, id uint64) (Job, error) {
	cs := c.cluster
	moved, err := cs.SetJobState(ctx, id, []JobState{JobActive, JobPaused}, JobCancelled)
	if err != nil {
		return Job{}, errors.Join(ErrUnavailable, err)
	}
	if moved {
		j := c.job(id)
		if j != nil {
			j.apply(JobCancelled)
		}
		if _, err := c.store.FinishQueued(ctx, id, CmdCancelled, c.now()); err != nil {
			c.note(ctx, ChangeJob, id)
			return Job{}, errors.Join(ErrUnavailable, err) // cancelled; the sweep cancels the rest
		}
		if j != nil {
			c.unqueue(j, func() {})
		}
	}
	return c.jobChanged(ctx, id, moved, JobCancelled)
}

// jobChanged ends a job state change: when it moved, memory and the other
// nodes learn it; when it did not, it is fine if the job is in state to
// already, and ErrJobState otherwise.
func (c *commands) jobChanged(ctx context.Context, id uint64, moved bool, to JobState) (Job, error) {
	if moved {
		if j := c.job(id); j != nil {
			j.apply(to)
		}
		c.note(ctx, ChangeJob, id)
	}
	v, err := c.jobView(ctx, id)
	if err != nil {
		return Job{}, err
	}
	if !moved && v.State != to.String() {
		return Job{}, ErrJobState
	}
	return v, nil
}

// sweepCluster is SweepCommands in cluster mode, over the database: run it
// on one node (the server runs it on the leader). Every change it makes is
// conditional, so a second run (a change of leader) moves nothing twice.
func (c *commands) sweepCluster(ctx context.Context) error {
	cs := c.cluster
	now := c.now()
	nowNS := now.UnixNano()
	var errs []error
	// Delivered commands without a result in time: the job's timeout (in
	// the query), two of the device's push intervals and resultGrace.
	dels, err := cs.DeliveredCommands(ctx, now.Add(-resultGrace), overduePage)
	if err != nil {
		return err
	}
	var overdue []DeviceCommand
	for _, dc := range dels {
		wait := resultGrace
		if j := c.job(dc.JobID); j != nil {
			wait += time.Duration(j.rec.Timeout) * time.Second
		}
		if d := c.devs.get(dc.DeviceID); d != nil {
			d.mu.Lock()
			wait += time.Duration(2*d.profile.interval()) * time.Second
			d.mu.Unlock()
		}
		if nowNS < dc.DeliveredAt.UnixNano()+int64(wait) {
			continue
		}
		dc.State, dc.FinishedAt, dc.Error = CmdExpired, now.UTC(), "no result in time"
		overdue = append(overdue, dc)
	}
	if _, err := cs.FinishDelivered(ctx, overdue); err != nil {
		errs = append(errs, err)
	}
	c.mu.Lock()
	var ids []uint64
	for id, j := range c.jobs {
		if j.jobState() != JobDone {
			ids = append(ids, id)
		}
	}
	c.mu.Unlock()
	if len(ids) == 0 {
		return errors.Join(errs...)
	}
	recs, err := cs.ReadJobs(ctx, ids, true)
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	for _, r := range recs {
		var err error
		queued, delivered := r.Counts[CmdQueued], r.Counts[CmdDelivered]
		switch {
		case r.State == JobCancelled && queued > 0: // queued by a creation that had not stopped yet
			err = c.finishCluster(ctx, r, CmdCancelled, now)
		case (r.State == JobActive || r.State == JobPaused) && !r.Creating && queued > 0 && now.After(r.ExpiresAt):
			if err = c.finishCluster(ctx, r, CmdExpired, now); err == nil && r.State == JobActive {
				err = c.closeClusterJobs(ctx, []uint64{r.ID})
			}
		case r.Creating && (r.State == JobActive || r.State == JobPaused):
			err = c.takeOver(r)
		case r.State == JobActive && !r.Creating && queued == 0 && delivered == 0:
			c.adoptJob(r, false)
			err = c.closeClusterJobs(ctx, []uint64{r.ID})
		default:
			if r.State != JobDone {
				continue
			}
			c.adoptJob(r, true) // done on another node's watch
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// takeOver continues the creation of a stored job no node has queued a
// batch of for creationStall, past its stored cursor (the node queueing
// it died or restarted; commands already queued are kept, the store
// inserts each once).
func (c *commands) takeOver(r JobRecord) error {
	j := c.adoptJob(r, true)
	if j.local.Load() || c.now().UnixNano()-j.progress.Load() < int64(creationStall) {
		return nil
	}
	f, err := c.jobFilter(r)
	if err != nil {
		return fmt.Errorf("job %d: %w", r.ID, err)
	}
	ids := c.matching(f, r.Cursor, r.LastID)
	total := 0
	for st, n := range r.Counts {
		j.counts[st].Store(int64(n))
		total += n
	}
	j.mu.Lock()
	j.rec.Cursor, j.rec.LastID, j.rec.Creating, j.rec.Total = r.Cursor, r.LastID, true, total+len(ids)
	j.mu.Unlock()
	j.creating.Store(true)
	j.progress.Store(c.now().UnixNano())
	c.log.Info("cluster: continuing a job's creation that stalled", "job", r.ID, "devices", len(ids))
	c.startCreating(j, ids)
	return nil
}

// finishCluster moves a stored job's queued commands to state (expired or
// cancelled); every node then forgets them (the change log entry).
func (c *commands) finishCluster(ctx context.Context, r JobRecord, state CommandState, now time.Time) error {
	if _, err := c.store.FinishQueued(ctx, r.ID, state, now); err != nil {
		return err
	}
	c.unqueue(c.adoptJob(r, false), func() {})
	c.note(ctx, ChangeJob, r.ID)
	return nil
}

// ClusterCommandQueries counts the pushes that asked the database about
// commands (cluster mode): pushes without a command queued and without
// results ask nothing.
func (c *commands) ClusterCommandQueries() uint64 { return c.queries.Load() }
