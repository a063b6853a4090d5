package storetest

import (
	"net/url"
	"reflect"
	"strconv"
	"testing"
	"time"

	"github.com/drover/drover/internal/fleet"
	"github.com/drover/drover/internal/protocol"
)

// testCommands: jobs and per-device commands survive a restart exactly
// (output lines included), with counts by state; FinishQueued moves only
// queued ones; listings page by device and by job.
func testCommands(t *testing.T, h *handle) {
	ctx := testCtx(t)
	s := h.store
	at := time.UnixMilli(time.Now().UnixMilli()).UTC()
	job := fleet.JobRecord{ID: 7, Kind: "hook", Args: []string{"a b", `q'"\`, "ü😀"}, Timeout: 30, Target: "devices label=x", Filter: "label=x",
		State: fleet.JobActive, CreatedAt: at, ExpiresAt: at.Add(time.Hour), Total: 4, Creating: true, Cursor: 0, LastID: 40}
	if err := s.SaveJob(ctx, job); err != nil {
		t.Fatal(err)
	}
	var cmds []fleet.DeviceCommand
	for _, dev := range []uint64{10, 20, 30} {
		cmds = append(cmds, fleet.DeviceCommand{JobID: 7, DeviceID: dev, State: fleet.CmdQueued, QueuedAt: at})
	}
	job.Cursor = 30
	if err := s.AddDeviceCommands(ctx, job, cmds); err != nil {
		t.Fatal(err)
	}
	job.Cursor, job.Creating = 40, false
	if err := s.AddDeviceCommands(ctx, job, append(cmds[:1:1], fleet.DeviceCommand{JobID: 7, DeviceID: 40, State: fleet.CmdQueued, QueuedAt: at})); err != nil {
		t.Fatal(err) // device 10 again: kept as it is
	}
	done := fleet.DeviceCommand{JobID: 7, DeviceID: 20, State: fleet.CmdFailed, QueuedAt: at, DeliveredAt: at.Add(time.Second),
		FinishedAt: at.Add(2 * time.Second), ExitCode: 3, Error: "exit 3 'x'", Output: []string{"line 1", `"q" \ ü`, ""}, StartedOn: 5, FinishedOn: 6}
	delivered := fleet.DeviceCommand{JobID: 7, DeviceID: 30, State: fleet.CmdDelivered, QueuedAt: at, DeliveredAt: at.Add(time.Second)}
	if err := s.SaveDeviceCommands(ctx, []fleet.DeviceCommand{done, delivered}); err != nil {
		t.Fatal(err)
	}
	if n, err := s.FinishQueued(ctx, 7, fleet.CmdCancelled, at.Add(time.Minute)); err != nil || n != 2 {
		t.Fatalf("finish queued: %d %v", n, err)
	}
	s = h.reopen()
	var pending []fleet.DeviceCommand
	jobs, err := s.LoadCommands(ctx, func(c fleet.DeviceCommand) error { pending = append(pending, c); return nil })
	if err != nil || len(jobs) != 1 {
		t.Fatalf("jobs %+v %v", jobs, err)
	}
	want := job
	want.Counts[fleet.CmdCancelled], want.Counts[fleet.CmdDelivered], want.Counts[fleet.CmdFailed] = 2, 1, 1
	if !reflect.DeepEqual(jobs[0], want) {
		t.Fatalf("job\n got %+v\nwant %+v", jobs[0], want)
	}
	if len(pending) != 1 || !reflect.DeepEqual(pending[0], delivered) {
		t.Fatalf("pending %+v", pending)
	}
	failed := fleet.CmdFailed
	got, err := s.DeviceCommands(ctx, fleet.CommandQuery{JobID: 7, State: &failed})
	if err != nil || len(got) != 1 || !reflect.DeepEqual(got[0], done) {
		t.Fatalf("failed ones: %+v %v", got, err)
	}
	got, err = s.DeviceCommands(ctx, fleet.CommandQuery{JobID: 7, After: 10, Limit: 2})
	if err != nil || len(got) != 2 || got[0].DeviceID != 20 || got[1].DeviceID != 30 {
		t.Fatalf("page: %+v %v", got, err)
	}
	if err := s.AddDeviceCommands(ctx, fleet.JobRecord{ID: 8, Kind: "reboot", Args: []string{}, State: fleet.JobDone, Timeout: 1, CreatedAt: at, ExpiresAt: at},
		[]fleet.DeviceCommand{{JobID: 8, DeviceID: 20, State: fleet.CmdSucceeded, QueuedAt: at}}); err != nil {
		t.Fatal(err)
	}
	got, err = s.DeviceCommands(ctx, fleet.CommandQuery{DeviceID: 20})
	if err != nil || len(got) != 2 || got[0].JobID != 8 || got[1].JobID != 7 {
		t.Fatalf("device's commands: %+v %v", got, err)
	}
}

// svcCommands: a bulk job and a one-device job through the fleet; a
// restart keeps queued, delivered and finished commands and the counts;
// nothing is delivered twice.
func svcCommands(t *testing.T, e *env) {
	var devs []protocol.RegisterResponse
	for i := range 3 {
		devs = append(devs, e.register("m-c"+strconv.Itoa(i), "trb140", "1.0"))
	}
	bulk, err := e.svc.SendCommand(e.ctx, fleet.CommandSpec{Kind: protocol.KindPing, Args: []string{"example.com"}}, fleet.Target{Filter: url.Values{}})
	if err != nil || bulk.Total != 3 {
		t.Fatalf("%+v %v", bulk, err)
	}
	e.svc.WaitCommands()
	id0, _ := strconv.ParseUint(devs[0].DeviceID, 10, 64)
	one, err := e.svc.SendCommand(e.ctx, fleet.CommandSpec{Kind: protocol.KindReboot}, fleet.Target{DeviceID: id0})
	if err != nil {
		t.Fatal(err)
	}
	r := e.push(devs[0].Token, pushReq(t, 1, 0, ""))
	if len(r.Commands) != 2 {
		t.Fatalf("device 0 got %+v", r.Commands)
	}
	p := pushReq(t, 2, 0, "")
	p.Results = []protocol.CommandResult{{ID: bulk.ID, ExitCode: 0, Output: []string{"pong"}, StartedAt: 1, FinishedAt: 2}}
	e.push(devs[0].Token, p)
	e.push(devs[1].Token, pushReq(t, 1, 0, ""))
	e.sync()
	e.restart() // fleet.New loads the commands again
	check := func(id uint64, want map[string]int) {
		t.Helper()
		j, err := e.svc.Job(id)
		if err != nil {
			t.Fatal(err)
		}
		for k, n := range want {
			if j.Counts[k] != n {
				t.Fatalf("job %d counts %v, want %v", id, j.Counts, want)
			}
		}
	}
	check(bulk.ID, map[string]int{"succeeded": 1, "delivered": 1, "queued": 1})
	check(one.ID, map[string]int{"delivered": 1})
	if r := e.push(devs[0].Token, pushReq(t, 3, 0, "")); len(r.Commands) != 0 {
		t.Fatalf("delivered again after restart: %+v", r.Commands)
	}
	if r := e.push(devs[2].Token, pushReq(t, 1, 0, "")); len(r.Commands) != 1 || r.Commands[0].ID != bulk.ID {
		t.Fatalf("queued one after restart: %+v", r.Commands)
	}
	got, err := e.svc.JobCommands(e.ctx, fleet.CommandQuery{JobID: bulk.ID})
	if err != nil || len(got) != 3 || got[0].State != fleet.CmdSucceeded || len(got[0].Output) != 1 || got[0].Output[0] != "pong" {
		t.Fatalf("job's commands %+v %v", got, err)
	}
	if j, err := e.svc.CancelJob(e.ctx, one.ID); err != nil || j.State != "cancelled" {
		t.Fatalf("cancel %+v %v", j, err)
	}
}
