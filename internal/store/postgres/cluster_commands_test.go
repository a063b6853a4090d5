package postgres

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/drover/drover/internal/fleet"
	"github.com/drover/drover/internal/protocol"
	"github.com/drover/drover/internal/store/dbtest"
)

// clusterFleet is one node's fleet over its own cluster store, on a clock
// the test moves.
type clusterFleet struct {
	name string
	st   *Store
	f    *fleet.Service
	seen int64 // change log position
}

// follow applies the change log entries of other nodes (what
// internal/cluster's loop does at each NATS nudge or poll).
func (n *clusterFleet) follow(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	cs, err := n.st.ChangesAfter(ctx, n.seen, nil, 10000)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cs {
		if c.Node != n.name {
			if err := n.f.ApplyChange(ctx, c); err != nil {
				t.Fatalf("%s applies %+v: %v", n.name, c, err)
			}
		}
		n.seen = c.Seq
	}
}

// openClusterFleet opens node name's fleet on the database dsn.
func openClusterFleet(t *testing.T, dsn, name string, now func() time.Time) *clusterFleet {
	t.Helper()
	ctx := context.Background()
	st, err := OpenCluster(ctx, dsn, name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	wt := fleet.NewWriteThrough(st, 1000, nil)
	f, err := fleet.New(ctx, fleet.StoresOf(st), wt, fleet.Options{EnrollmentSecret: "s", Cluster: st, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.WaitCommands(); wt.Close(ctx) })
	return &clusterFleet{name: name, st: st, f: f}
}

// TestClusterJobDoneWhenLastCopyEnds: a job's last two copies end at the
// same moment on two nodes; the job is done on both at once (no sweep),
// and a cancel on either is refused without relabelling it.
func TestClusterJobDoneWhenLastCopyEnds(t *testing.T) {
	ctx := context.Background()
	dsn := dbtest.Need(t, dbtest.Postgres, server).NewDB(t)
	a, b := openClusterFleet(t, dsn, "a", time.Now), openClusterFleet(t, dsn, "b", time.Now)
	var tokens []string
	for i := range 2 {
		r, err := a.f.Register(ctx, protocol.RegisterRequest{MachineID: fmt.Sprintf("m-done-%d", i), DeviceType: "ICR", Firmware: "1", EnrollmentSecret: "s"})
		if err != nil {
			t.Fatal(err)
		}
		tokens = append(tokens, r.Token)
	}
	b.follow(t)
	nodes := []*clusterFleet{a, b}
	var seq atomic.Uint64
	push := func(n *clusterFleet, i int, results ...protocol.CommandResult) ([]protocol.Command, error) {
		resp, err := n.f.Push(ctx, tokens[i], protocol.PushRequest{Seq: seq.Add(1), RawState: json.RawMessage(`{}`), Results: results})
		return resp.Commands, err
	}
	for round := range 5 {
		job, err := nodes[round%2].f.SendCommand(ctx, fleet.CommandSpec{Kind: "ping", Args: []string{"127.0.0.1"}},
			fleet.Target{Filter: map[string][]string{"q": {"m-done"}}})
		if err != nil {
			t.Fatal(err)
		}
		nodes[round%2].f.WaitCommands()
		a.follow(t)
		b.follow(t)
		for i, n := range nodes {
			if cmds, err := push(n, i); err != nil || len(cmds) != 1 || cmds[0].ID != job.ID {
				t.Fatalf("round %d: device %d on %s got %+v %v", round, i, n.name, cmds, err)
			}
		}
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for i, n := range nodes {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, errs[i] = push(n, i, protocol.CommandResult{ID: job.ID, StartedAt: 1, FinishedAt: 2})
			}()
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		for _, n := range nodes {
			if j, err := n.f.Job(job.ID); err != nil || j.State != "done" || j.Counts["succeeded"] != 2 {
				t.Fatalf("round %d, on %s, no sweep: %+v %v", round, n.name, j, err)
			}
			if _, err := n.f.CancelJob(ctx, job.ID); err != fleet.ErrJobState {
				t.Fatalf("round %d: cancel of a done job on %s: %v", round, n.name, err)
			}
			if j, _ := n.f.Job(job.ID); j.State != "done" || j.Counts["cancelled"] != 0 {
				t.Fatalf("round %d, on %s, after the refused cancel: %+v", round, n.name, j)
			}
		}
	}
}

// TestClusterCommandsSweep: two nodes on one database sweep remote
// commands at the same moment (as two leaders might for a moment): every
// expiry happens once, a result reported after its command expired is
// not recorded, and the job ends done on both nodes.
func TestClusterCommandsSweep(t *testing.T) {
	ctx := context.Background()
	dsn := dbtest.Need(t, dbtest.Postgres, server).NewDB(t)
	var clock atomic.Int64
	clock.Store(time.Now().UnixNano())
	now := func() time.Time { return time.Unix(0, clock.Load()) }
	a, b := openClusterFleet(t, dsn, "a", now), openClusterFleet(t, dsn, "b", now)
	var tokens []string
	var ids []uint64
	for i := range 3 {
		r, err := a.f.Register(ctx, protocol.RegisterRequest{MachineID: fmt.Sprintf("m-sweep-%d", i), DeviceType: "ICR", Firmware: "1", EnrollmentSecret: "s"})
		if err != nil {
			t.Fatal(err)
		}
		id, _ := strconv.ParseUint(r.DeviceID, 10, 64)
		tokens, ids = append(tokens, r.Token), append(ids, id)
	}
	b.follow(t)
	job, err := a.f.SendCommand(ctx, fleet.CommandSpec{Kind: "ping", Args: []string{"127.0.0.1"}, Timeout: 10, TTL: time.Minute},
		fleet.Target{Filter: map[string][]string{"q": {"m-sweep"}}})
	if err != nil {
		t.Fatal(err)
	}
	a.f.WaitCommands()
	b.follow(t)
	var seq uint64
	push := func(n *clusterFleet, i int, results ...protocol.CommandResult) []protocol.Command {
		t.Helper()
		seq++
		resp, err := n.f.Push(ctx, tokens[i], protocol.PushRequest{Seq: seq, RawState: json.RawMessage(`{}`), Results: results})
		if err != nil {
			t.Fatalf("push of device %d on %s: %v", ids[i], n.name, err)
		}
		return resp.Commands
	}
	if cmds := push(b, 0); len(cmds) != 1 || cmds[0].ID != job.ID {
		t.Fatalf("device 0 on B got %+v", cmds)
	}
	if cmds := push(a, 1); len(cmds) != 1 {
		t.Fatalf("device 1 on A got %+v", cmds)
	}
	sweepBoth := func() {
		t.Helper()
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for i, n := range []*clusterFleet{a, b} {
			wg.Add(1)
			go func() { defer wg.Done(); errs[i] = n.f.SweepCommands(ctx) }()
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		a.follow(t)
		b.follow(t)
	}
	counts := func(n *clusterFleet) fleet.Job {
		t.Helper()
		j, err := n.f.Job(job.ID)
		if err != nil {
			t.Fatal(err)
		}
		return j
	}
	// Device 1 reports; the job expires (device 2 never pushed).
	push(a, 1, protocol.CommandResult{ID: job.ID, Output: []string{"ok"}})
	clock.Add(int64(2 * time.Minute))
	sweepBoth()
	for _, n := range []*clusterFleet{a, b} {
		if j := counts(n); j.Counts["expired"] != 1 || j.Counts["delivered"] != 1 || j.Counts["succeeded"] != 1 || j.State != "active" {
			t.Fatalf("after the job's expiry, on %s: %+v", n.name, j)
		}
	}
	queries := b.f.ClusterCommandQueries()
	if cmds := push(b, 2); len(cmds) != 0 {
		t.Fatalf("an expired command delivered: %+v", cmds)
	}
	if q := b.f.ClusterCommandQueries() - queries; q != 0 {
		t.Fatalf("B still held device 2's expired command: its push asked the database %d times", q)
	}
	// Device 0's result is overdue: its timeout, two push intervals and
	// a minute. Expired once; the late result is not recorded.
	clock.Add(int64(10*time.Second + 2*200*time.Second + 2*time.Minute))
	sweepBoth()
	push(a, 0, protocol.CommandResult{ID: job.ID, ExitCode: 1, Output: []string{"late"}})
	sweepBoth()
	for _, n := range []*clusterFleet{a, b} {
		j := counts(n)
		if j.Counts["expired"] != 2 || j.Counts["failed"] != 0 || j.Counts["succeeded"] != 1 || j.State != "done" || j.Total != 3 {
			t.Fatalf("on %s: %+v", n.name, j)
		}
	}
	st := fleet.CmdExpired
	got, err := b.f.JobCommands(ctx, fleet.CommandQuery{JobID: job.ID, State: &st})
	if err != nil || len(got) != 2 {
		t.Fatalf("expired commands: %+v %v", got, err)
	}
	for _, c := range got {
		if c.DeviceID == ids[0] && (c.Error != "no result in time" || len(c.Output) != 0) {
			t.Fatalf("device 0's command: %+v", c)
		}
	}
	// Done: pause and cancel are refused on both nodes.
	for _, n := range []*clusterFleet{a, b} {
		if _, err := n.f.CancelJob(ctx, job.ID); err != fleet.ErrJobState {
			t.Fatalf("cancel of a done job on %s: %v", n.name, err)
		}
	}

	// A bulk job whose node died after its first batch (one device of
	// three queued): the sweep takes its creation over once it stalled
	// for a minute, and the devices get their commands on any node.
	id, err := a.st.NextJobID(ctx)
	if err != nil {
		t.Fatal(err)
	}
	at := now().UTC()
	stalled := fleet.JobRecord{ID: id, Kind: "ping", Args: []string{"10.0.0.1"}, Timeout: 10, Target: "devices q=m-sweep", Filter: "q=m-sweep",
		State: fleet.JobActive, CreatedAt: at, ExpiresAt: at.Add(time.Hour), Total: 3, Creating: true, Cursor: ids[0], LastID: ids[2]}
	if err := a.st.AddDeviceCommands(ctx, stalled, []fleet.DeviceCommand{{JobID: id, DeviceID: ids[0], State: fleet.CmdQueued, QueuedAt: at}}); err != nil {
		t.Fatal(err)
	}
	if err := a.st.NoteChange(ctx, fleet.ChangeJob, id); err != nil {
		t.Fatal(err)
	}
	b.follow(t)
	if err := b.f.SweepCommands(ctx); err != nil {
		t.Fatal(err)
	}
	b.f.WaitCommands()
	if j, err := b.f.Job(id); err != nil || !j.Creating || j.Counts["queued"] != 1 {
		t.Fatalf("taken over before it stalled: %+v %v", j, err)
	}
	clock.Add(int64(2 * time.Minute))
	if err := b.f.SweepCommands(ctx); err != nil {
		t.Fatal(err)
	}
	b.f.WaitCommands()
	a.follow(t)
	if j, err := a.f.Job(id); err != nil || j.Creating || j.Counts["queued"] != 3 || j.Total != 3 {
		t.Fatalf("after the takeover: %+v %v", j, err)
	}
	for i, n := range []*clusterFleet{a, b, a} {
		if cmds := push(n, i); len(cmds) != 1 || cmds[0].ID != id {
			t.Fatalf("device %d on %s after the takeover: %+v", ids[i], n.name, cmds)
		}
	}
}
