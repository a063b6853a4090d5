package fleet

// Remote commands (docs/operations.md#remote-commands). An operator's
// command is a job aimed at one device or at every device a filter
// matches. Each targeted device holds its copy (devCmd) in its own queue,
// so a push finds its commands without a query (O(1): one nil check when
// there are none); the answer carries them, a later push the results.
// Per-device rows of a bulk job are written in batches by a background
// goroutine, never all in the request.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/drover/drover/internal/protocol"
)

// CommandStore keeps remote commands: one row per job and one per
// targeted device (the records: command_store.go). Every adapter
// implements it; storetest checks it. Without one (memory mode), commands
// live in memory only.
type CommandStore interface {
	// LoadCommands returns every job, with its per-device counts by
	// state, and streams the per-device commands still queued or
	// delivered.
	LoadCommands(ctx context.Context, each func(DeviceCommand) error) ([]JobRecord, error)
	// SaveJob inserts or replaces a job by ID.
	SaveJob(ctx context.Context, j JobRecord) error
	// AddDeviceCommands inserts per-device commands (present ones are
	// kept) and stores their job's progress (Total, Creating, Cursor,
	// LastID; the whole record if the job is not stored yet: a stored
	// state stays, so a pause or cancel meanwhile is never undone), in one
	// transaction.
	AddDeviceCommands(ctx context.Context, j JobRecord, cmds []DeviceCommand) error
	// SaveDeviceCommands replaces per-device commands, in one transaction.
	SaveDeviceCommands(ctx context.Context, cmds []DeviceCommand) error
	// FinishQueued moves a job's queued commands to state (expired or
	// cancelled) at at and returns how many moved.
	FinishQueued(ctx context.Context, jobID uint64, state CommandState, at time.Time) (int64, error)
	// DeviceCommands lists a job's per-device commands with device ID >
	// q.After in device ID order, or a device's (q.DeviceID set) newest
	// first; q.State filters when set.
	DeviceCommands(ctx context.Context, q CommandQuery) ([]DeviceCommand, error)
}

// Errors of job changes.
var ErrJobState = errors.New("the job is not in a state that allows this")

// CommandState is the state of one device's command.
type CommandState uint8

const (
	CmdQueued    CommandState = iota // waiting for the device's next push
	CmdDelivered                     // sent in a push answer, no result yet
	CmdSucceeded                     // exit status 0
	CmdFailed                        // non-zero status, refused or stopped by the agent
	CmdExpired                       // not delivered before the job expired, or no result in time
	CmdCancelled                     // cancelled by an operator before delivery
	numCommandStates
)

var commandStateNames = [...]string{"queued", "delivered", "succeeded", "failed", "expired", "cancelled"}

func (s CommandState) String() string { return commandStateNames[s] }

// MarshalText writes the state's name.
func (s CommandState) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// ParseCommandState accepts the names String returns.
func ParseCommandState(v string) (CommandState, bool) {
	i := slices.Index(commandStateNames[:], v)
	return CommandState(i), i >= 0
}

func (s CommandState) terminal() bool { return s >= CmdSucceeded }

// JobState is the state of a job as a whole.
type JobState uint8

const (
	JobActive    JobState = iota // delivering
	JobPaused                    // queued commands wait
	JobCancelled                 // queued commands were cancelled
	JobDone                      // every device's command reached an end state
)

var jobStateNames = [...]string{"active", "paused", "cancelled", "done"}

func (s JobState) String() string { return jobStateNames[s] }

// ParseJobState accepts the names String returns.
func ParseJobState(v string) (JobState, bool) {
	i := slices.Index(jobStateNames[:], v)
	return JobState(i), i >= 0
}

// Limits and defaults of commands.
const (
	DefaultCommandTimeout = 60 // seconds
	DefaultCommandTTL     = 24 * time.Hour
	MaxCommandTTL         = 30 * 24 * time.Hour
	commandBatch          = 1000 // per-device rows per transaction
	// A delivered command without a result expires after its timeout,
	// two push intervals and this.
	resultGrace = time.Minute
)

// CommandSpec is an operator's command.
type CommandSpec struct {
	Kind    string
	Args    []string
	Timeout int           // seconds; 0: DefaultCommandTimeout
	TTL     time.Duration // undelivered commands expire after it; 0: DefaultCommandTTL
}

// Validate applies the defaults and checks the command (the agents'
// rules, protocol.Command.Validate, and the TTL).
func (c *CommandSpec) Validate() error {
	if c.Timeout == 0 {
		c.Timeout = DefaultCommandTimeout
	}
	if c.TTL == 0 {
		c.TTL = DefaultCommandTTL
	}
	if c.TTL < time.Second || c.TTL > MaxCommandTTL {
		return fieldError("expires_in", "expires_in must be within 1..%d seconds", int(MaxCommandTTL/time.Second))
	}
	pc := protocol.Command{ID: 1, Kind: c.Kind, Args: c.Args, Timeout: c.Timeout}
	if err := pc.Validate(); err != nil {
		var pe *protocol.Error
		if errors.As(err, &pe) {
			return fieldError("command", "%s", pe.Message)
		}
		return err
	}
	return nil
}

// Target names the devices of a job: one device, or a filter.
type Target struct {
	DeviceID uint64
	Filter   url.Values // the devices filter's parameters (FilterParams)
}

// Job is a job as the operator API shows it.
type Job struct {
	ID        uint64         `json:"id,string"`
	Kind      string         `json:"kind"`
	Args      []string       `json:"args,omitempty"`
	Timeout   int            `json:"timeout"`
	Target    string         `json:"target"`
	State     string         `json:"state"`
	CreatedAt time.Time      `json:"created_at"`
	ExpiresAt time.Time      `json:"expires_at"`
	Total     int            `json:"total"`
	Creating  bool           `json:"creating,omitempty"` // per-device commands still being queued
	Counts    map[string]int `json:"counts"`
}

// job is a job in memory.
type job struct {
	mu       sync.Mutex // rec's mutable fields
	rec      JobRecord
	cmd      protocol.Command // ID, kind, args, timeout, as sent
	state    atomic.Uint32    // JobState
	counts   [numCommandStates]atomic.Int64
	creating atomic.Bool
	stop     chan struct{} // closed when cancelled: creation stops
	stopped  sync.Once
	// seen (cluster mode, the change log's goroutine): this node holds the
	// job's queued devices up to this device ID (commands_cluster.go).
	seen uint64
	// Cluster mode: local says this node queues the job's commands;
	// progress is when this node last saw a batch queued (unix ns).
	local    atomic.Bool
	progress atomic.Int64
}

// halt closes stop once: the job's creation stops.
func (j *job) halt() { j.stopped.Do(func() { close(j.stop) }) }

func (j *job) jobState() JobState { return JobState(j.state.Load()) }

// move counts one device's command leaving from and reaching to.
func (j *job) move(from, to CommandState) {
	j.counts[from].Add(-1)
	j.counts[to].Add(1)
}

// devCmd is one device's copy of a job, in the device's queue; d.mu held.
type devCmd struct {
	job         *job
	state       CommandState
	queuedAt    int64 // unix ns
	deliveredAt int64
}

// cmdQueue is a device's pending commands; device.cmds is nil without any.
type cmdQueue struct{ q []*devCmd }

// commands is the commands room: the jobs and, through the devices'
// queues, their per-device copies. The Service embeds it, so that its
// exported methods are the Service's.
type commands struct {
	mu    sync.Mutex // jobs, next
	jobs  map[uint64]*job
	next  uint64
	store CommandStore // nil: memory only
	w     cmdWriter
	wg    sync.WaitGroup // creation goroutines
	// queries counts pushes that asked the database about commands (a
	// command queued for the device, or results; cluster mode).
	queries atomic.Uint64

	// What the room needs of the others, set by New.
	devs    commandTargets
	cluster ClusterStore // nil: one server
	now     func() time.Time
	log     *slog.Logger
	events  *subscribers // a device's commands were queued
	// note writes a change log entry (cluster glue, cluster.go).
	note func(ctx context.Context, kind ChangeKind, id uint64)
	// refreshDevice reads a device another node registered back from the
	// database (cluster glue).
	refreshDevice func(ctx context.Context, id uint64) error
}

// commandTargets is what the commands room needs of the registry: the
// devices, and the devices filter (a bulk job's target).
type commandTargets interface {
	deviceFinder
	// lastID is the highest device ID handed out here so far.
	lastID() uint64
	ParseFilter(v url.Values) (Filter, error)
}

// wire gives the room what it needs of the others (New).
func (c *commands) wire(s *Service) {
	c.devs, c.cluster, c.now, c.log, c.events = s, s.opts.Cluster, s.now, s.log, &s.events
	c.note, c.refreshDevice = s.noteChange, s.refreshDevice
}

func (c *commands) init() {
	if c.jobs == nil {
		c.jobs, c.next = map[uint64]*job{}, 1
	}
}

// cmdWriter stores per-device state changes in groups: whoever comes while
// a write runs joins the next one.
type cmdWriter struct {
	mu      sync.Mutex
	pending []DeviceCommand
	waiters []chan error
	running bool
}

// save stores recs and returns when they are stored (or failed).
func (c *commands) saveCommands(ctx context.Context, recs []DeviceCommand) error {
	if c.store == nil || len(recs) == 0 {
		return nil
	}
	w := &c.w
	done := make(chan error, 1)
	w.mu.Lock()
	w.pending = append(w.pending, recs...)
	w.waiters = append(w.waiters, done)
	if !w.running {
		w.running = true
		go c.writeCommands()
	}
	w.mu.Unlock()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (c *commands) writeCommands() {
	w := &c.w
	for {
		w.mu.Lock()
		recs, waiters := w.pending, w.waiters
		w.pending, w.waiters = nil, nil
		if len(waiters) == 0 {
			w.running = false
			w.mu.Unlock()
			return
		}
		w.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := c.store.SaveDeviceCommands(ctx, recs)
		cancel()
		if err != nil {
			c.log.Warn("storing command states failed", "commands", len(recs), "err", err)
		}
		for _, ch := range waiters {
			ch <- err
		}
	}
}

// loadCommands loads jobs and pending commands from cs and keeps later
// changes there (New); unfinished bulk creations continue in the
// background.
func (c *commands) loadCommands(ctx context.Context, cs CommandStore) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.init()
	var pending []DeviceCommand
	recs, err := cs.LoadCommands(ctx, func(dc DeviceCommand) error {
		pending = append(pending, dc)
		return nil
	})
	if err != nil {
		return fmt.Errorf("load commands: %w", err)
	}
	for _, r := range recs {
		j := newJob(r)
		for st, n := range r.Counts {
			j.counts[st].Store(int64(n))
		}
		c.jobs[r.ID] = j
		c.next = max(c.next, r.ID+1)
	}
	for _, dc := range pending {
		j, d := c.jobs[dc.JobID], c.devs.get(dc.DeviceID)
		if j == nil {
			continue
		}
		if d == nil { // device deleted meanwhile
			j.move(dc.State, CmdCancelled)
			continue
		}
		if c.cluster != nil {
			// The database tracks delivered ones; memory holds which
			// devices have queued ones (commands_cluster.go).
			j.seen = max(j.seen, dc.DeviceID)
			if dc.State != CmdQueued {
				continue
			}
		}
		d.mu.Lock()
		enqueue(d, &devCmd{job: j, state: dc.State, queuedAt: dc.QueuedAt.UnixNano(), deliveredAt: unixNano(dc.DeliveredAt)})
		d.mu.Unlock()
	}
	c.store = cs
	for _, j := range c.jobs {
		if c.cluster != nil {
			// Another node may be queueing it right now: the leader's
			// sweep takes over a creation that stalled (creationStall).
			j.progress.Store(c.now().UnixNano())
			continue
		}
		if j.rec.Creating && j.jobState() != JobCancelled {
			f, err := c.jobFilter(j.rec)
			if err != nil {
				return fmt.Errorf("job %d: %w", j.rec.ID, err)
			}
			ids := c.matching(f, j.rec.Cursor, j.rec.LastID)
			j.mu.Lock()
			j.rec.Total = j.countTotal() + len(ids)
			j.mu.Unlock()
			c.startCreating(j, ids)
		}
	}
	return nil
}

func unixNano(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func nanoTime(ns int64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns).UTC()
}

func newJob(r JobRecord) *job {
	j := &job{rec: r, stop: make(chan struct{}),
		cmd: protocol.Command{ID: r.ID, Kind: r.Kind, Args: r.Args, Timeout: r.Timeout}}
	j.state.Store(uint32(r.State))
	j.creating.Store(r.Creating)
	if r.State == JobCancelled {
		j.halt()
	}
	return j
}

// countTotal is how many per-device commands exist.
func (j *job) countTotal() int {
	n := 0
	for i := range j.counts {
		n += int(j.counts[i].Load())
	}
	return n
}

func enqueue(d *device, dc *devCmd) {
	if d.cmds == nil {
		d.cmds = &cmdQueue{}
	}
	d.cmds.q = append(d.cmds.q, dc)
}

// jobFilter parses a stored job's filter.
func (c *commands) jobFilter(r JobRecord) (Filter, error) {
	v, err := url.ParseQuery(r.Filter)
	if err != nil {
		return Filter{}, err
	}
	return c.devs.ParseFilter(v)
}

// matching returns the IDs of devices matching f in (after, last], in ID
// order (last 0: no bound).
func (c *commands) matching(f Filter, after, last uint64) []uint64 {
	now := c.now().UnixNano()
	var ids []uint64
	c.devs.each(func(d *device) {
		if d.id > after && (last == 0 || d.id <= last) && f.match(d, now) {
			ids = append(ids, d.id)
		}
	})
	return ids
}

// SendCommand makes a job of spec for the target and queues it; a bulk
// job's per-device commands are queued in the background (Job.Creating).
func (c *commands) SendCommand(ctx context.Context, spec CommandSpec, t Target) (Job, error) {
	if err := spec.Validate(); err != nil {
		return Job{}, err
	}
	// At the store's precision (milliseconds): the job answers the same
	// before and after a restart or a restore.
	now := c.now().UTC().Truncate(time.Millisecond)
	rec := JobRecord{Kind: spec.Kind, Args: spec.Args, Timeout: spec.Timeout, CreatedAt: now, ExpiresAt: now.Add(spec.TTL)}
	var ids []uint64
	if t.Filter == nil {
		d := c.devs.get(t.DeviceID)
		if d == nil && c.cluster != nil { // registered on another node a moment ago?
			if err := c.refreshDevice(ctx, t.DeviceID); err != nil {
				return Job{}, errors.Join(ErrUnavailable, err)
			}
			d = c.devs.get(t.DeviceID)
		}
		if d == nil {
			return Job{}, ErrNotFound
		}
		ids = []uint64{d.id}
		rec.DeviceID, rec.Target = d.id, "device "+strconv.FormatUint(d.id, 10)
	} else {
		f, err := c.devs.ParseFilter(t.Filter)
		if err != nil {
			return Job{}, err
		}
		rec.Filter = t.Filter.Encode()
		rec.Target = "devices " + describeFilter(t.Filter)
		rec.LastID = c.devs.lastID()
		ids = c.matching(f, 0, rec.LastID)
	}
	rec.Total, rec.Creating = len(ids), true
	var clusterID uint64
	if c.cluster != nil { // IDs from the database: other nodes make jobs too
		id, err := c.cluster.NextJobID(ctx)
		if err != nil {
			return Job{}, errors.Join(ErrUnavailable, err)
		}
		clusterID = id
	}
	c.mu.Lock()
	c.init()
	rec.ID = c.next
	if clusterID != 0 {
		rec.ID = clusterID
	}
	if c.store != nil {
		if err := c.store.SaveJob(ctx, rec); err != nil {
			c.mu.Unlock()
			return Job{}, err
		}
	}
	c.next = max(c.next, rec.ID) + 1
	j := newJob(rec)
	c.jobs[rec.ID] = j
	c.mu.Unlock()
	if rec.DeviceID != 0 {
		if err := c.createBatch(ctx, j, ids); err != nil {
			return Job{}, err
		}
	} else {
		c.startCreating(j, ids)
	}
	return j.view(), nil
}

// describeFilter is a filter for people: "label=x&sync_state=…" or "all".
func describeFilter(v url.Values) string {
	for k, vals := range v {
		if len(vals) == 0 || (len(vals) == 1 && vals[0] == "") {
			delete(v, k)
		}
	}
	if len(v) == 0 {
		return "(all)"
	}
	return v.Encode()
}

// startCreating queues ids' commands in batches in the background.
func (c *commands) startCreating(j *job, ids []uint64) {
	c.wg.Add(1)
	j.local.Store(true)
	go func() {
		defer c.wg.Done()
		defer j.local.Store(false)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go func() {
			select {
			case <-j.stop:
				cancel()
			case <-ctx.Done():
			}
		}()
		for len(ids) > 0 || j.creating.Load() {
			n := min(len(ids), commandBatch)
			if err := c.createBatch(ctx, j, ids[:n]); err != nil {
				if ctx.Err() == nil {
					c.log.Warn("queueing a job's commands failed; retrying", "job", j.rec.ID, "err", err)
					select {
					case <-time.After(5 * time.Second):
						continue
					case <-ctx.Done():
					}
				}
				return
			}
			ids = ids[n:]
		}
	}()
}

// createBatch stores and queues one batch of a job's per-device commands;
// the last batch (ids the rest) ends the creation.
func (c *commands) createBatch(ctx context.Context, j *job, ids []uint64) error {
	now := c.now()
	recs := make([]DeviceCommand, len(ids))
	for i, id := range ids {
		recs[i] = DeviceCommand{JobID: j.rec.ID, DeviceID: id, State: CmdQueued, QueuedAt: now.UTC()}
	}
	j.mu.Lock()
	rec := j.rec
	j.mu.Unlock()
	if len(ids) > 0 {
		rec.Cursor = ids[len(ids)-1]
	}
	last := j.countTotal()+len(ids) >= rec.Total
	rec.Creating = !last
	if c.store != nil {
		if err := c.store.AddDeviceCommands(ctx, rec, recs); err != nil {
			return err
		}
	}
	for _, id := range ids {
		d := c.devs.get(id)
		if d == nil {
			j.counts[CmdCancelled].Add(1)
			continue
		}
		d.mu.Lock()
		enqueue(d, &devCmd{job: j, state: CmdQueued, queuedAt: now.UnixNano()})
		d.mu.Unlock()
		j.counts[CmdQueued].Add(1)
		c.events.commandsQueued(id)
	}
	j.mu.Lock()
	j.rec.Cursor, j.rec.Creating = rec.Cursor, rec.Creating
	j.mu.Unlock()
	j.creating.Store(!last)
	j.progress.Store(c.now().UnixNano())
	// Cluster mode: the other nodes read the batch's devices back.
	c.note(ctx, ChangeJob, j.rec.ID)
	if last && j.counts[CmdQueued].Load() == 0 && j.counts[CmdDelivered].Load() == 0 {
		// Nothing left queued here (no device matched, or those matched
		// were deleted): the job may have ended already.
		if err := c.closeJobs(ctx, []uint64{j.rec.ID}); err != nil {
			c.log.Warn("closing a finished job failed", "job", j.rec.ID, "err", err)
		}
	}
	return nil
}

// commandsOnPush takes a push's results and hands out the device's queued
// commands; d.mu held. It returns the commands for the answer and the
// state changes to store before answering.
func (c *commands) commandsOnPush(d *device, results []protocol.CommandResult, now int64) ([]protocol.Command, []DeviceCommand) {
	var out []protocol.Command
	var changes []DeviceCommand
	q := d.cmds
	for i := range results {
		r := &results[i]
		if q == nil {
			break
		}
		k := slices.IndexFunc(q.q, func(dc *devCmd) bool { return dc.job.rec.ID == r.ID })
		if k < 0 {
			continue // unknown, or already finished: nothing to record
		}
		dc := q.q[k]
		to := CmdFailed
		if r.Succeeded() {
			to = CmdSucceeded
		}
		dc.job.move(dc.state, to)
		rec := dc.record(d.id, to, now)
		rec.ExitCode, rec.Error, rec.Output = r.ExitCode, r.Error, r.Output
		rec.StartedOn, rec.FinishedOn = r.StartedAt, r.FinishedAt
		changes = append(changes, rec)
		q.q = slices.Delete(q.q, k, k+1)
	}
	if q != nil {
		for _, dc := range q.q {
			if dc.state != CmdQueued || dc.job.jobState() != JobActive || len(out) == protocol.MaxCommandsPerPush {
				continue
			}
			if now > dc.job.rec.ExpiresAt.UnixNano() {
				continue // the sweep expires it
			}
			dc.job.move(CmdQueued, CmdDelivered)
			dc.state, dc.deliveredAt = CmdDelivered, now
			changes = append(changes, dc.record(d.id, CmdDelivered, now))
			out = append(out, dc.job.cmd)
		}
		if len(q.q) == 0 {
			d.cmds = nil
		}
	}
	return out, changes
}

// record is dc as stored, in state to at now.
func (dc *devCmd) record(device uint64, to CommandState, now int64) DeviceCommand {
	r := DeviceCommand{JobID: dc.job.rec.ID, DeviceID: device, State: to, QueuedAt: nanoTime(dc.queuedAt), DeliveredAt: nanoTime(dc.deliveredAt)}
	if to.terminal() {
		r.FinishedAt = nanoTime(now)
	}
	return r
}

// HasCommands reports whether a device has commands waiting for delivery
// (persistent connections ask it to push at once).
func (c *commands) HasCommands(id uint64) bool {
	d := c.devs.get(id)
	if d == nil {
		return false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cmds == nil {
		return false
	}
	for _, dc := range d.cmds.q {
		if dc.state == CmdQueued && dc.job.jobState() == JobActive {
			return true
		}
	}
	return false
}

// SweepCommands expires undelivered commands of expired jobs and delivered
// commands whose result is overdue, and marks finished jobs done. The
// server calls it periodically.
func (c *commands) SweepCommands(ctx context.Context) error {
	if c.cluster != nil {
		return c.sweepCluster(ctx)
	}
	c.mu.Lock()
	var live []*job
	for _, j := range c.jobs {
		if st := j.jobState(); st != JobDone {
			live = append(live, j)
		}
	}
	c.mu.Unlock()
	if len(live) == 0 {
		return nil
	}
	now := c.now()
	nowNS := now.UnixNano()
	var errs []error
	for _, j := range live {
		if nowNS > j.rec.ExpiresAt.UnixNano() && j.counts[CmdQueued].Load() > 0 && !j.creating.Load() {
			if err := c.finishQueued(ctx, j, CmdExpired, now); err != nil {
				errs = append(errs, err)
			}
		}
	}
	var overdue []DeviceCommand
	c.devs.each(func(d *device) {
		if d.cmds == nil {
			return
		}
		grace := time.Duration(2*d.profile.interval())*time.Second + resultGrace
		d.cmds.q = slices.DeleteFunc(d.cmds.q, func(dc *devCmd) bool {
			if dc.state != CmdDelivered || nowNS < dc.deliveredAt+int64(time.Duration(dc.job.rec.Timeout)*time.Second+grace) {
				return false
			}
			dc.job.move(CmdDelivered, CmdExpired)
			r := dc.record(d.id, CmdExpired, nowNS)
			r.Error = "no result in time"
			overdue = append(overdue, r)
			return true
		})
		if len(d.cmds.q) == 0 {
			d.cmds = nil
		}
	})
	if err := c.saveCommands(ctx, overdue); err != nil {
		errs = append(errs, err)
	}
	for _, j := range live {
		if j.jobState() == JobActive && j.ended() {
			if _, err := c.moveJob(ctx, j, []JobState{JobActive}, JobDone); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// finishQueued moves every queued command of j to state (expired or
// cancelled), in the store with one statement, then in memory.
func (c *commands) finishQueued(ctx context.Context, j *job, state CommandState, at time.Time) error {
	if st := c.store; st != nil {
		if _, err := st.FinishQueued(ctx, j.rec.ID, state, at); err != nil {
			return err
		}
	}
	c.unqueue(j, func() { j.move(CmdQueued, state) })
	return nil
}

// unqueue drops j's queued commands from every device's queue, calling
// dropped for each.
func (c *commands) unqueue(j *job, dropped func()) {
	c.devs.each(func(d *device) {
		if d.cmds == nil {
			return
		}
		d.cmds.q = slices.DeleteFunc(d.cmds.q, func(dc *devCmd) bool {
			if dc.job != j || dc.state != CmdQueued {
				return false
			}
			dropped()
			return true
		})
		if len(d.cmds.q) == 0 {
			d.cmds = nil
		}
	})
}

// moveJob sets j's state to st if it is one of from, in the store and
// then in memory; moved says whether it did.
func (c *commands) moveJob(ctx context.Context, j *job, from []JobState, st JobState) (moved bool, err error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if !slices.Contains(from, j.jobState()) {
		return false, nil
	}
	rec := j.rec
	rec.State = st
	if c.store != nil {
		if err := c.store.SaveJob(ctx, rec); err != nil {
			return false, err
		}
	}
	j.rec.State = st
	j.state.Store(uint32(st))
	return true, nil
}

// ended reports whether every copy of j reached an end state (memory's
// counts; one server).
func (j *job) ended() bool {
	return !j.creating.Load() && j.counts[CmdQueued].Load() == 0 && j.counts[CmdDelivered].Load() == 0
}

// closeJobsOf closes the jobs whose copies a push's results ended, if
// those were their last (changes: what the push changed, one server; in
// cluster mode the results' jobs).
func (c *commands) closeJobsOf(ctx context.Context, results []protocol.CommandResult, changes []DeviceCommand) {
	var ids []uint64
	if c.cluster != nil {
		for _, r := range results {
			ids = append(ids, r.ID)
		}
	} else {
		for _, ch := range changes {
			if ch.State.terminal() {
				ids = append(ids, ch.JobID)
			}
		}
	}
	slices.Sort(ids)
	ids = slices.Compact(ids)
	if err := c.closeJobs(ctx, ids); err != nil {
		c.log.Warn("closing a finished job failed", "job", ids, "err", err)
	}
}

// closeJobs marks done each active job among ids whose every copy reached
// an end state: at the moment the last copy ends (a result, an expiry, a
// creation that queued nothing), not at the next sweep, so that the job's
// state, its counts and what cancel answers agree. In cluster mode the
// database decides, counting the copies every node ended.
func (c *commands) closeJobs(ctx context.Context, ids []uint64) error {
	if len(ids) == 0 {
		return nil
	}
	if c.cluster != nil {
		return c.closeClusterJobs(ctx, ids)
	}
	var errs []error
	for _, id := range ids {
		if j := c.job(id); j != nil && j.jobState() == JobActive && j.ended() {
			if _, err := c.moveJob(ctx, j, []JobState{JobActive}, JobDone); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// PauseJob holds a job's queued commands (pause true) or releases them.
func (c *commands) PauseJob(ctx context.Context, id uint64, pause bool) (Job, error) {
	if c.cluster != nil {
		return c.pauseCluster(ctx, id, pause)
	}
	j := c.job(id)
	if j == nil {
		return Job{}, ErrNotFound
	}
	from, to := JobActive, JobPaused
	if !pause {
		from, to = JobPaused, JobActive
	}
	moved, err := c.moveJob(ctx, j, []JobState{from}, to)
	if err != nil {
		return Job{}, err
	}
	if !moved && j.jobState() != to {
		return Job{}, ErrJobState
	}
	if moved && !pause {
		// Every copy may have ended while it was paused.
		if err := c.closeJobs(ctx, []uint64{id}); err != nil {
			return Job{}, err
		}
	}
	return j.view(), nil
}

// CancelJob cancels a job's commands not yet delivered; delivered ones
// still report.
func (c *commands) CancelJob(ctx context.Context, id uint64) (Job, error) {
	if c.cluster != nil {
		return c.cancelCluster(ctx, id)
	}
	j := c.job(id)
	if j == nil {
		return Job{}, ErrNotFound
	}
	moved, err := c.moveJob(ctx, j, []JobState{JobActive, JobPaused}, JobCancelled)
	if err != nil {
		return Job{}, err
	}
	if !moved {
		if j.jobState() == JobCancelled {
			return j.view(), nil
		}
		return Job{}, ErrJobState // done: every copy ended, nothing to cancel
	}
	j.halt()
	c.wg.Wait() // creation stops at its next batch
	if err := c.finishQueued(ctx, j, CmdCancelled, c.now()); err != nil {
		return Job{}, err
	}
	j.mu.Lock()
	j.rec.Total = j.countTotal()
	j.mu.Unlock()
	return j.view(), nil
}

func (c *commands) job(id uint64) *job {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.jobs[id]
}

func (j *job) view() Job {
	j.mu.Lock()
	r := j.rec
	j.mu.Unlock()
	v := Job{ID: r.ID, Kind: r.Kind, Args: r.Args, Timeout: r.Timeout, Target: r.Target, State: j.jobState().String(),
		CreatedAt: r.CreatedAt, ExpiresAt: r.ExpiresAt, Total: r.Total, Creating: j.creating.Load(), Counts: map[string]int{}}
	for i, n := range commandStateNames {
		v.Counts[n] = int(j.counts[i].Load())
	}
	return v
}

// Jobs lists jobs, newest first, at most limit (0: all).
func (c *commands) Jobs(limit int) []Job {
	c.mu.Lock()
	all := make([]*job, 0, len(c.jobs))
	for _, j := range c.jobs {
		all = append(all, j)
	}
	c.mu.Unlock()
	sort.Slice(all, func(a, b int) bool { return all[a].rec.ID > all[b].rec.ID })
	if limit > 0 && len(all) > limit {
		all = all[:limit]
	}
	if c.cluster != nil {
		return c.clusterJobs(all)
	}
	out := make([]Job, len(all))
	for i, j := range all {
		out[i] = j.view()
	}
	return out
}

// Job returns one job.
func (c *commands) Job(id uint64) (Job, error) {
	if c.cluster != nil {
		return c.clusterJob(id)
	}
	j := c.job(id)
	if j == nil {
		return Job{}, ErrNotFound
	}
	return j.view(), nil
}

// JobCommands lists a job's per-device commands (q.JobID set) or a
// device's (q.DeviceID set). Without a store, they are read from memory,
// where only pending ones are kept.
func (c *commands) JobCommands(ctx context.Context, q CommandQuery) ([]DeviceCommand, error) {
	if q.JobID != 0 && c.job(q.JobID) == nil {
		if _, err := c.Job(q.JobID); err != nil { // cluster mode: made on another node a moment ago?
			return nil, err
		}
	}
	if q.DeviceID != 0 && c.devs.get(q.DeviceID) == nil {
		return nil, ErrNotFound
	}
	if q.Limit <= 0 || q.Limit > 1000 {
		q.Limit = 100
	}
	if st := c.store; st != nil {
		return st.DeviceCommands(ctx, q)
	}
	var out []DeviceCommand
	c.devs.each(func(d *device) {
		if d.cmds == nil || (q.DeviceID != 0 && d.id != q.DeviceID) {
			return
		}
		for _, dc := range d.cmds.q {
			if (q.JobID == 0 || dc.job.rec.ID == q.JobID) && (q.State == nil || *q.State == dc.state) && (q.JobID == 0 || d.id > q.After) {
				out = append(out, dc.record(d.id, dc.state, 0))
			}
		}
	})
	if len(out) > q.Limit {
		out = out[:q.Limit]
	}
	return out, nil
}

// WaitCommands waits for background job creation to stop (tests, shutdown
// after CancelJob).
func (c *commands) WaitCommands() { c.wg.Wait() }

// MarshalOutput and UnmarshalOutput are the stored form of a result's
// output lines (JSON text), shared by the adapters.
func MarshalOutput(lines []string) string {
	if len(lines) == 0 {
		return ""
	}
	b, _ := json.Marshal(lines)
	return string(b)
}

// UnmarshalOutput reads MarshalOutput's form.
func UnmarshalOutput(s string) ([]string, error) {
	if s == "" {
		return nil, nil
	}
	var out []string
	err := json.Unmarshal([]byte(s), &out)
	return out, err
}
