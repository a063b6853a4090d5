package fleet

// Rollouts in cluster mode (docs/firmware.md#rollouts-in-a-cluster): every
// node keeps every unfinished rollout in memory, as a single server does,
// so that a push costs no database read; the database is the truth.
//
//   - Device reports change the memory of the node that took the push;
//     every node writes its changes at each step (MergeRolloutDevices: a
//     stored final state stays, so a report counts once whichever node took
//     it) and reads back what the others wrote (RolloutDevicesWritten).
//   - One node drives (the cluster's leader, RolloutDriver): it starts
//     waves, pauses a rollout whose wave fails, fails stalled devices and
//     finishes rollouts. Every change of a rollout row is conditional
//     (SaveRolloutIf: only if the stored rollout is still in the state and
//     wave the change started from), so that two nodes that both believe
//     they drive, for a moment after a leader change, never advance a wave
//     twice; a wave's device rows are written in the same transaction.
//   - Pause, resume and abort from any node are the same conditional
//     writes; a change log entry (ChangeRollout) makes the others read the
//     rollout back at once.

import (
	"context"
	"fmt"
	"time"
)

// ChangeRollout: a rollout created, started a wave, paused, resumed,
// aborted or finished: read the rollouts back. (A number of its own, apart
// from the kinds of cluster.go.)
const ChangeRollout ChangeKind = 21

// rereadWindow is how far back each read of rollout devices reaches
// before the last one: a write that took its time when it began is read
// even if it committed after the last read.
const rereadWindow = 10 * time.Second

// errRolloutRace is a pause, resume or abort that another node's change
// of the same rollout overtook.
var errRolloutRace = fmt.Errorf("%w: another node changed it meanwhile; read it again and retry", ErrRolloutState)

// clustered reports whether rollouts run in cluster mode.
func (fs *firmwareState) clustered() bool { return fs.rc != nil }

// driving says whether this node drives the rollouts.
func (fs *firmwareState) driving() bool {
	return fs.rc == nil || fs.driver == nil || fs.driver()
}

// SyncRollouts reads back, in cluster mode, the rollouts and the rollout
// devices other nodes changed (change log entries of kind ChangeRollout).
func (fs *firmwareState) SyncRollouts(ctx context.Context) error {
	if !fs.clustered() {
		return nil
	}
	fs.stepMu.Lock()
	defer fs.stepMu.Unlock()
	return fs.syncRolloutsLocked(ctx)
}

// syncRolloutsLocked is SyncRollouts with fs.stepMu held.
func (fs *firmwareState) syncRolloutsLocked(ctx context.Context) error {
	fs.mu.Lock()
	var known []uint64
	var after uint64
	for id, r := range fs.rollouts {
		if !r.finished() {
			known = append(known, id)
		}
		after = max(after, id)
	}
	fs.mu.Unlock()
	stored, err := fs.rc.SyncRollouts(ctx, known, after)
	if err != nil {
		return err
	}
	var full, active []uint64 // rollouts to read whole (new, or a new wave), and all unfinished
	var finishing []Rollout   // finished by another node
	fs.mu.Lock()
	for _, sr := range stored {
		r := fs.rollouts[sr.ID]
		if r == nil {
			fw := fs.artifacts[sr.FirmwareID]
			if fw == nil && sr.Config == nil {
				continue // its artifact is read back with its change log entry
			}
			r = &rollout{Rollout: sr, fw: fw, targets: map[uint64]*target{}, count: map[string]int{}}
			fs.rollouts[sr.ID] = r
			if sr.Config != nil {
				fs.stageLoaded(r)
			}
			if !r.finished() {
				full = append(full, sr.ID)
				active = append(active, sr.ID)
			}
			continue
		}
		if r.finished() {
			if sr.finished() {
				continue
			}
			// This node finished it, but another node's change (a pause)
			// was stored first: it is not finished.
			r.Rollout, r.Counts = sr, nil
			if r.Config != nil {
				fs.stageLoaded(r)
				fs.release(r, nil)
			}
			for id, t := range r.targets {
				if !terminal(t.State) {
					fs.places(r)[id] = t
					fs.placed(r)
				}
			}
			full = append(full, sr.ID)
			active = append(active, sr.ID)
			continue
		}
		if sr.finished() {
			finishing = append(finishing, sr)
			continue
		}
		wave := r.Wave
		r.Rollout = sr
		active = append(active, sr.ID)
		if r.Wave != wave {
			full = append(full, sr.ID)
		}
	}
	fs.mu.Unlock()
	// A rollout another node finished: its devices as stored (an abort
	// canceled some), then its counts from them.
	for _, sr := range finishing {
		ds, err := fs.store.RolloutDevices(ctx, sr.ID)
		if err != nil {
			return err
		}
		fs.adoptDevices(ds)
		fs.mu.Lock()
		if r := fs.rollouts[sr.ID]; r != nil && !r.finished() {
			r.Rollout = sr
			fs.finishLocked(r)
		}
		fs.mu.Unlock()
	}
	for _, id := range full {
		ds, err := fs.store.RolloutDevices(ctx, id)
		if err != nil {
			return err
		}
		fs.adoptDevices(ds)
	}
	if len(active) == 0 {
		return nil
	}
	ds, now, err := fs.rc.RolloutDevicesWritten(ctx, active, fs.readSince)
	if err != nil {
		return err
	}
	fs.adoptDevices(ds)
	fs.readSince = now - rereadWindow.Milliseconds()
	return nil
}

// adoptDevices takes stored rollout devices into memory: a stored final
// state wins, a final state in memory (being written) stays, otherwise the
// newer report wins.
func (fs *firmwareState) adoptDevices(ds []RolloutDevice) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	recount := map[*rollout]bool{}
	released := map[*rollout][]RolloutDevice{}
	for _, d := range ds {
		r := fs.rollouts[d.RolloutID]
		if r == nil || r.finished() {
			continue
		}
		t := r.targets[d.DeviceID]
		if t == nil {
			t = &target{RolloutDevice: d, r: r}
			r.add(t)
			if !terminal(d.State) {
				fs.places(r)[d.DeviceID] = t
				fs.placed(r)
			}
			released[r] = append(released[r], d)
			recount[r] = true
			continue
		}
		switch {
		case terminal(d.State):
			if t.State == d.State && t.Reason == d.Reason {
				continue
			}
		case terminal(t.State), !d.UpdatedAt.After(t.UpdatedAt):
			continue
		}
		if t.State != d.State {
			r.count[t.State]--
			r.count[d.State]++
			recount[r] = true
			if places := fs.places(r); terminal(d.State) && places[d.DeviceID] == t {
				delete(places, d.DeviceID)
			}
		}
		t.RolloutDevice = d
	}
	for r, ds := range released {
		fs.release(r, ds)
	}
	for r := range recount {
		r.waveSize, r.waveFailed = 0, 0
		for _, t := range r.targets {
			if t.Wave == r.Wave {
				r.waveSize++
				if t.State == DeviceFailed {
					r.waveFailed++
				}
			}
		}
	}
}

// saveStepChange stores a rollout change the engine made (from running at
// its wave): conditionally in cluster mode, where a change another node
// made first wins and this one is dropped (the next read brings memory
// back in step).
func (fs *firmwareState) saveStepChange(ctx context.Context, v Rollout) error {
	if !fs.clustered() {
		return fs.saveRollout(ctx, v)
	}
	ok, err := fs.rc.SaveRolloutIf(ctx, v, RolloutRunning, v.Wave, nil)
	if err != nil {
		return err
	}
	if !ok {
		fs.log.Info("rollout changed by another node first; this node's change is dropped", "rollout", v.ID, "state", v.State)
		return nil
	}
	fs.note(ctx, ChangeRollout, v.ID)
	return nil
}

// startWaveClustered stores the next wave and r's new wave number in one
// conditional transaction; ok is false when another node changed r first.
func (fs *firmwareState) startWaveClustered(ctx context.Context, next Rollout, wave []RolloutDevice) (bool, error) {
	ok, err := fs.rc.SaveRolloutIf(ctx, next, RolloutRunning, next.Wave-1, wave)
	if err != nil || !ok {
		return false, err
	}
	fs.note(ctx, ChangeRollout, next.ID)
	return true, nil
}

// controlClustered stores an operator's pause, resume or abort of r
// (prev: the stored rollout it started from) and reads the rollouts back.
func (fs *firmwareState) controlClustered(ctx context.Context, v Rollout, prev Rollout) error {
	ok, err := fs.rc.SaveRolloutIf(ctx, v, prev.State, prev.Wave, nil)
	if err != nil {
		return err
	}
	if !ok {
		return errRolloutRace
	}
	fs.note(ctx, ChangeRollout, v.ID)
	// An abort canceled devices in the database: read them back.
	if err := fs.syncRolloutsLocked(ctx); err != nil {
		fs.log.Warn("rollouts: reading back after a change failed", "rollout", v.ID, "err", err)
	}
	return nil
}
