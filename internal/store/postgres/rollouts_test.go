package postgres

import (
	"context"
	"testing"
	"time"

	"github.com/drover/drover/internal/fleet"
	"github.com/drover/drover/internal/store/dbtest"
)

// clusterStore opens a fresh database as node "a" of a cluster, closed
// when t ends.
func clusterStore(t *testing.T) *Store {
	t.Helper()
	s, err := OpenCluster(context.Background(), dbtest.Need(t, dbtest.Postgres, server).NewDB(t), "a")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// The cluster's rollout writes: a rollout row changes only from the state
// and wave the change started from (a wave starts once), a wave's rows go
// with it, device reports merge (a stored final state stays, the newer
// report wins otherwise), an abort cancels what is pending or downloading,
// and the read-back returns what was written since.
func TestRolloutClusterWrites(t *testing.T) {
	ctx := context.Background()
	s := clusterStore(t)
	id, err := s.NextRolloutID(ctx)
	if err != nil {
		t.Fatal(err)
	}
	id2, err := s.NextRolloutID(ctx)
	if err != nil || id2 == id {
		t.Fatalf("rollout IDs %d, %d: %v", id, id2, err)
	}
	now := time.Now().UTC().Truncate(time.Millisecond)
	r := fleet.Rollout{ID: id, RolloutSpec: fleet.DefaultRolloutSpec(), State: fleet.RolloutRunning, CreatedAt: now, UpdatedAt: now}
	if err := s.SaveRollout(ctx, r); err != nil {
		t.Fatal(err)
	}
	dev := func(d uint64, state string, at time.Time) fleet.RolloutDevice {
		return fleet.RolloutDevice{RolloutID: id, DeviceID: d, Wave: 1, State: state, UpdatedAt: at}
	}
	next := r
	next.Wave = 1
	wave := []fleet.RolloutDevice{dev(1, fleet.DevicePending, now), dev(2, fleet.DevicePending, now), dev(3, fleet.DevicePending, now)}
	if ok, err := s.SaveRolloutIf(ctx, next, fleet.RolloutRunning, 0, wave); err != nil || !ok {
		t.Fatalf("wave 1: %v %v", ok, err)
	}
	// A second driver starting wave 1 again writes nothing.
	if ok, err := s.SaveRolloutIf(ctx, next, fleet.RolloutRunning, 0, []fleet.RolloutDevice{dev(4, fleet.DevicePending, now)}); err != nil || ok {
		t.Fatalf("wave 1 again: %v %v, want refused", ok, err)
	}
	since := int64(0)
	got, dbNow, err := s.RolloutDevicesWritten(ctx, []uint64{id}, since)
	if err != nil || len(got) != 3 || dbNow == 0 {
		t.Fatalf("read back: %d rows, %v", len(got), err)
	}
	// Device 1 fails on one node; a later progress report from another
	// node does not undo it. Device 2: an older report loses to a newer.
	later := now.Add(time.Second)
	if err := s.MergeRolloutDevices(ctx, []fleet.RolloutDevice{dev(1, fleet.DeviceFailed, now), dev(2, fleet.DeviceDownloading, later)}); err != nil {
		t.Fatal(err)
	}
	d2 := dev(2, fleet.DeviceDownloading, now)
	d2.Progress = 5
	if err := s.MergeRolloutDevices(ctx, []fleet.RolloutDevice{dev(1, fleet.DeviceDownloading, later), d2}); err != nil {
		t.Fatal(err)
	}
	all, err := s.RolloutDevices(ctx, id)
	if err != nil || len(all) != 3 {
		t.Fatal(all, err)
	}
	if all[0].State != fleet.DeviceFailed || all[1].State != fleet.DeviceDownloading || all[1].Progress != 0 || all[2].State != fleet.DevicePending {
		t.Fatalf("merged: %+v", all)
	}
	// A pause that started from another wave is refused; the abort from
	// the stored state cancels the pending and downloading devices.
	paused := next
	paused.State = fleet.RolloutPaused
	if ok, err := s.SaveRolloutIf(ctx, paused, fleet.RolloutRunning, 0, nil); err != nil || ok {
		t.Fatalf("pause from wave 0: %v %v, want refused", ok, err)
	}
	aborted := next
	aborted.State, aborted.UpdatedAt = fleet.RolloutAborted, later
	if ok, err := s.SaveRolloutIf(ctx, aborted, fleet.RolloutRunning, 1, nil); err != nil || !ok {
		t.Fatalf("abort: %v %v", ok, err)
	}
	all, _ = s.RolloutDevices(ctx, id)
	if all[0].State != fleet.DeviceFailed || all[1].State != fleet.DeviceCanceled || all[2].State != fleet.DeviceCanceled {
		t.Fatalf("after the abort: %+v", all)
	}
	rs, err := s.SyncRollouts(ctx, nil, 0)
	if err != nil || len(rs) != 1 || rs[0].State != fleet.RolloutAborted {
		t.Fatalf("sync: %+v %v", rs, err)
	}
	if rs, err := s.SyncRollouts(ctx, nil, id); err != nil || len(rs) != 0 {
		t.Fatalf("sync after %d: %+v %v (finished rollouts are not read again)", id, rs, err)
	}
	got, _, err = s.RolloutDevicesWritten(ctx, []uint64{id}, dbNow+60_000)
	if err != nil || len(got) != 0 {
		t.Fatalf("read back from the future: %d rows, %v", len(got), err)
	}
}
