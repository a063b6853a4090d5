package fleet

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/drover/drover/internal/protocol"
)

func registerN(t *testing.T, s *Service, n int) []protocol.RegisterResponse {
	t.Helper()
	out := make([]protocol.RegisterResponse, n)
	for i := range out {
		r, err := s.Register(context.Background(), reg(fmt.Sprintf("m-%d", i)))
		if err != nil {
			t.Fatal(err)
		}
		out[i] = r
	}
	return out
}

func TestCommandOneDevice(t *testing.T) {
	ctx := context.Background()
	s, clk, _ := newService(t, newRecStore())
	devs := registerN(t, s, 2)
	var id uint64
	fmt.Sscan(devs[0].DeviceID, &id)
	if _, err := s.SendCommand(ctx, CommandSpec{Kind: "shell", Args: []string{"ls"}}, Target{DeviceID: id}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("unknown kind: %v", err)
	}
	if _, err := s.SendCommand(ctx, CommandSpec{Kind: protocol.KindReboot}, Target{DeviceID: 999}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("unknown device: %v", err)
	}
	j, err := s.SendCommand(ctx, CommandSpec{Kind: protocol.KindPing, Args: []string{"192.0.2.1"}, Timeout: 5}, Target{DeviceID: id})
	if err != nil || j.Total != 1 || j.Counts["queued"] != 1 || j.Creating {
		t.Fatalf("%+v %v", j, err)
	}
	if !s.HasCommands(id) {
		t.Fatal("HasCommands false with a queued command")
	}
	other, _ := s.Push(ctx, devs[1].Token, push(1, 0))
	if len(other.Commands) != 0 {
		t.Fatalf("other device got %+v", other.Commands)
	}
	resp, err := s.Push(ctx, devs[0].Token, push(1, 0))
	if err != nil || len(resp.Commands) != 1 || resp.Commands[0].ID != j.ID || resp.Commands[0].Kind != "ping" || resp.Commands[0].Timeout != 5 {
		t.Fatalf("%+v %v", resp, err)
	}
	if resp, _ := s.Push(ctx, devs[0].Token, push(2, 0)); len(resp.Commands) != 0 {
		t.Fatalf("delivered twice: %+v", resp.Commands)
	}
	if j, _ := s.Job(j.ID); j.Counts["delivered"] != 1 || j.Counts["queued"] != 0 {
		t.Fatalf("after delivery %+v", j.Counts)
	}
	clk.add(time.Second)
	p := push(3, 0)
	p.Results = []protocol.CommandResult{{ID: j.ID, ExitCode: 0, Output: []string{"64 bytes"}, StartedAt: 1, FinishedAt: 2}, {ID: 12345}}
	if _, err := s.Push(ctx, devs[0].Token, p); err != nil {
		t.Fatal(err)
	}
	if err := s.SweepCommands(ctx); err != nil {
		t.Fatal(err)
	}
	if j, _ := s.Job(j.ID); j.Counts["succeeded"] != 1 || j.Counts["delivered"] != 0 || j.State != "done" {
		t.Fatalf("after result %+v", j)
	}
	if s.HasCommands(id) || s.get(id).cmds != nil {
		t.Fatal("queue not emptied")
	}
}

func TestCommandBulkPauseCancelExpire(t *testing.T) {
	ctx := context.Background()
	s, clk, _ := newService(t, newRecStore())
	devs := registerN(t, s, 5)
	if _, err := s.SendCommand(ctx, CommandSpec{Kind: protocol.KindReboot}, Target{Filter: url.Values{FilterSyncState: {"bogus"}}}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("bad filter: %v", err)
	}
	j, err := s.SendCommand(ctx, CommandSpec{Kind: protocol.KindReboot, TTL: time.Hour}, Target{Filter: url.Values{}})
	if err != nil || j.Total != 5 {
		t.Fatalf("%+v %v", j, err)
	}
	s.WaitCommands()
	if j, _ := s.Job(j.ID); j.Counts["queued"] != 5 || j.Creating {
		t.Fatalf("%+v", j)
	}
	if r, _ := s.Push(ctx, devs[0].Token, push(1, 0)); len(r.Commands) != 1 {
		t.Fatalf("%+v", r)
	}
	if _, err := s.PauseJob(ctx, j.ID, true); err != nil {
		t.Fatal(err)
	}
	if r, _ := s.Push(ctx, devs[1].Token, push(1, 0)); len(r.Commands) != 0 {
		t.Fatalf("paused job delivered: %+v", r)
	}
	if _, err := s.PauseJob(ctx, j.ID, false); err != nil {
		t.Fatal(err)
	}
	if r, _ := s.Push(ctx, devs[1].Token, push(2, 0)); len(r.Commands) != 1 {
		t.Fatalf("resumed job not delivered: %+v", r)
	}
	// A second job expires undelivered.
	j2, err := s.SendCommand(ctx, CommandSpec{Kind: protocol.KindReadLog, Args: []string{"messages"}, TTL: time.Minute}, Target{Filter: url.Values{}})
	if err != nil {
		t.Fatal(err)
	}
	s.WaitCommands()
	j, err = s.CancelJob(ctx, j.ID)
	if err != nil || j.Counts["cancelled"] != 3 || j.Counts["delivered"] != 2 || j.State != "cancelled" {
		t.Fatalf("cancel %+v %v", j, err)
	}
	if _, err := s.PauseJob(ctx, j.ID, true); !errors.Is(err, ErrJobState) {
		t.Fatalf("pause cancelled: %v", err)
	}
	clk.add(2 * time.Minute)
	if r, _ := s.Push(ctx, devs[2].Token, push(1, 0)); len(r.Commands) != 0 {
		t.Fatalf("expired job delivered: %+v", r)
	}
	// Delivered commands without a result expire after timeout + 2 intervals + grace.
	clk.add(time.Duration(DefaultCommandTimeout)*time.Second + 200*time.Second + resultGrace)
	if err := s.SweepCommands(ctx); err != nil {
		t.Fatal(err)
	}
	if j2, _ := s.Job(j2.ID); j2.Counts["expired"] != 5 || j2.State != "done" {
		t.Fatalf("expiry %+v", j2)
	}
	if j, _ := s.Job(j.ID); j.Counts["expired"] != 2 || j.Counts["delivered"] != 0 {
		t.Fatalf("overdue results %+v", j)
	}
	if got := s.Jobs(0); len(got) != 2 || got[0].ID != j2.ID {
		t.Fatalf("jobs %+v", got)
	}
}

// TestJobDoneWhenLastCopyEnds: a job is done at the moment its last copy
// ends, not at the next sweep; cancelling it then is refused (nothing is
// relabelled), and so are pause and resume.
func TestJobDoneWhenLastCopyEnds(t *testing.T) {
	ctx := context.Background()
	s, _, _ := newService(t, newRecStore())
	devs := registerN(t, s, 3)
	j, err := s.SendCommand(ctx, CommandSpec{Kind: protocol.KindPing, Args: []string{"192.0.2.1"}}, Target{Filter: url.Values{}})
	if err != nil {
		t.Fatal(err)
	}
	s.WaitCommands()
	for i, d := range devs {
		if r, _ := s.Push(ctx, d.Token, push(1, 0)); len(r.Commands) != 1 {
			t.Fatalf("device %d: %+v", i, r)
		}
	}
	result := func(i int, seq uint64, code int) {
		t.Helper()
		p := push(seq, 0)
		p.Results = []protocol.CommandResult{{ID: j.ID, ExitCode: code, StartedAt: 1, FinishedAt: 2}}
		if _, err := s.Push(ctx, devs[i].Token, p); err != nil {
			t.Fatal(err)
		}
	}
	result(0, 2, 0)
	result(1, 2, 1)
	if got, _ := s.Job(j.ID); got.State != "active" || got.Counts["delivered"] != 1 {
		t.Fatalf("one copy still delivered: %+v", got)
	}
	result(2, 2, 0)
	got, _ := s.Job(j.ID)
	if got.State != "done" || got.Counts["succeeded"] != 2 || got.Counts["failed"] != 1 {
		t.Fatalf("every copy ended, no sweep yet: %+v", got)
	}
	if _, err := s.CancelJob(ctx, j.ID); !errors.Is(err, ErrJobState) {
		t.Fatalf("cancel of a done job: %v", err)
	}
	for _, pause := range []bool{true, false} {
		if _, err := s.PauseJob(ctx, j.ID, pause); !errors.Is(err, ErrJobState) {
			t.Fatalf("pause %v of a done job: %v", pause, err)
		}
	}
	if after, _ := s.Job(j.ID); after.State != "done" || after.Counts["succeeded"] != 2 || after.Counts["cancelled"] != 0 {
		t.Fatalf("after the refused cancel: %+v", after)
	}

	// The last two copies ending at the same moment: done all the same.
	for round := range 20 {
		jr, err := s.SendCommand(ctx, CommandSpec{Kind: protocol.KindPing, Args: []string{"192.0.2.3"}}, Target{Filter: url.Values{}})
		if err != nil {
			t.Fatal(err)
		}
		s.WaitCommands()
		seq := uint64(10 + 2*round)
		for i, d := range devs {
			if r, _ := s.Push(ctx, d.Token, push(seq, 0)); len(r.Commands) != 1 {
				t.Fatalf("round %d, device %d: %+v", round, i, r)
			}
		}
		var wg sync.WaitGroup
		for _, d := range devs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				p := push(seq+1, 0)
				p.Results = []protocol.CommandResult{{ID: jr.ID, StartedAt: 1, FinishedAt: 2}}
				if _, err := s.Push(ctx, d.Token, p); err != nil {
					t.Error(err)
				}
			}()
		}
		wg.Wait()
		if got, _ := s.Job(jr.ID); got.State != "done" || got.Counts["succeeded"] != len(devs) {
			t.Fatalf("round %d: every copy ended at once: %+v", round, got)
		}
	}

	// Ended while paused: done as it is resumed.
	j2, err := s.SendCommand(ctx, CommandSpec{Kind: protocol.KindPing, Args: []string{"192.0.2.2"}}, Target{DeviceID: mustID(t, devs[0].DeviceID)})
	if err != nil {
		t.Fatal(err)
	}
	if r, _ := s.Push(ctx, devs[0].Token, push(100, 0)); len(r.Commands) != 1 {
		t.Fatalf("%+v", r)
	}
	if _, err := s.PauseJob(ctx, j2.ID, true); err != nil {
		t.Fatal(err)
	}
	p := push(101, 0)
	p.Results = []protocol.CommandResult{{ID: j2.ID, StartedAt: 1, FinishedAt: 2}}
	if _, err := s.Push(ctx, devs[0].Token, p); err != nil {
		t.Fatal(err)
	}
	if got, err := s.PauseJob(ctx, j2.ID, false); err != nil || got.State != "done" {
		t.Fatalf("resumed with every copy ended: %+v %v", got, err)
	}

	// A filter matching no device: done once created.
	j3, err := s.SendCommand(ctx, CommandSpec{Kind: protocol.KindReboot}, Target{Filter: url.Values{FilterDeviceType: {"none-such"}}})
	if err != nil {
		t.Fatal(err)
	}
	s.WaitCommands()
	if got, _ := s.Job(j3.ID); got.State != "done" || got.Total != 0 {
		t.Fatalf("job of no device: %+v", got)
	}
}

func mustID(t *testing.T, s string) uint64 {
	t.Helper()
	var id uint64
	if _, err := fmt.Sscan(s, &id); err != nil {
		t.Fatal(err)
	}
	return id
}
