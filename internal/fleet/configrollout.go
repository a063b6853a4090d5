package fleet

// Configuration rollouts (docs/configuration.md#staged-changes): a label
// layer's new values, or a profile's new configuration, go out in waves on
// the rollouts' engine (rollout.go). The new values are stored as the
// layer's newest revision (the profile's configuration) at once; a stage
// (layerstage.go) keeps the previous one for every device the rollout has
// not released. A wave releases its devices: their next push
// answer carries the new effective configuration. The devices' applies
// settle their state — pending (released), installing (sent), verified
// (applied) or failed (the device reported an error applying it) — and
// the failures count toward the wave's failure rate as firmware failures
// do. Done: the stage ends and every device has the new values. Aborted:
// the previous values are stored again as the newest revision first.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"
)

// ConfigChange is what a configuration rollout rolls out: new values of
// one label's layer, or (ProfileID set) a profile's new configuration.
type ConfigChange struct {
	Label     string          `json:"label,omitempty"`
	ProfileID uint64          `json:"profile_id,omitempty,string"`
	Values    json.RawMessage `json:"values"`
	// FromRev is the layer's revision before (0: it had no values), kept
	// by the devices not released; Previous and PreviousPriority are its
	// values and priority. ToRev is the revision the rollout stored.
	FromRev          int             `json:"from_rev"`
	ToRev            int             `json:"to_rev,omitempty"`
	Previous         json.RawMessage `json:"previous,omitempty"`
	PreviousPriority int             `json:"previous_priority,omitempty"`
	// PreviousVersion and ToVersion are a profile's configuration
	// versions before and after.
	PreviousVersion int64 `json:"previous_version,omitempty"`
	ToVersion       int64 `json:"to_version,omitempty"`
}

// configStager is what the rollouts need of the configuration layers
// (layerstage.go); the Service implements it.
type configStager interface {
	LabelIDs(names []string) []uint16
	// checkStaged checks values as the next revision of label's layer and
	// returns them normalized with the layer's current revision (Rev 0:
	// none).
	checkStaged(label string, values json.RawMessage) (cur ConfigLayer, vals json.RawMessage, err error)
	// writeStaged stores a revision of st's layer (values nil: a
	// deletion) past the stage's refusal of other changes; revert: not
	// when the layer has these values already.
	writeStaged(ctx context.Context, st *configStage, values json.RawMessage, priority int, by, note string, revert bool) (ConfigLayer, error)
	startStage(st *configStage)
	releaseStage(st *configStage, ids []uint64)
	endStage(st *configStage)
	// The same for a profile's configuration (the profiles room);
	// profileStage starts (on) or ends a profile's stage.
	checkStagedProfile(id uint64, config json.RawMessage) (cur Profile, cfg json.RawMessage, err error)
	writeStagedProfile(ctx context.Context, st *configStage, config json.RawMessage, by, note string, revert bool) (Profile, error)
	profileStage(st *configStage, on bool)
}

// configFilter completes a configuration rollout's filter f: the label
// is implied.
func (r *rollout) configFilter(f Filter, devs firmwareDevices) error {
	if p := r.Config.ProfileID; p != 0 {
		if f.ProfileID != 0 && f.ProfileID != p {
			return &FieldError{Field: "filter", Message: "filter names another profile than the rollout's"}
		}
		f.ProfileID = p
		r.filter, r.parsed = f, true
		return nil
	}
	id := devs.LabelIDs([]string{r.Config.Label})[0]
	if id == 0 {
		return &FieldError{Field: "config.label", Message: "no label " + strconv.Quote(r.Config.Label)}
	}
	f.Labels = append(f.Labels, id)
	r.filter, r.parsed = f, true
	return nil
}

// CreateConfigRollout checks spec (its Config set, FirmwareID 0) and
// starts a configuration rollout: the label layer's new values are stored
// and released to the devices wave by wave, the first wave with the
// engine's next step.
func (fs *firmwareState) CreateConfigRollout(ctx context.Context, spec RolloutSpec, by string) (Rollout, error) {
	// Held until the values are stored: no wave starts before.
	fs.stepMu.Lock()
	defer fs.stepMu.Unlock()
	if err := fs.syncStagingLocked(ctx); err != nil {
		return Rollout{}, err
	}
	spec, err := fs.checkConfigSpec(spec)
	if err != nil {
		return Rollout{}, err
	}
	c := *spec.Config
	r := fs.newRollout(spec, RolloutConfig, by)
	if err := fs.match(r); err != nil {
		return Rollout{}, err
	}
	if err := fs.register(ctx, r, func() { fs.stageLoaded(r) }); err != nil {
		return Rollout{}, err
	}
	note := "staged in rollout " + strconv.FormatUint(r.ID, 10)
	cc := *r.Config
	if c.ProfileID != 0 {
		var p Profile
		p, err = fs.devs.writeStagedProfile(ctx, r.stage, c.Values, by, note, false)
		cc.ToVersion = p.Version
	} else {
		var l ConfigLayer
		l, err = fs.devs.writeStaged(ctx, r.stage, c.Values, c.PreviousPriority, by, note, false)
		cc.ToRev = l.Rev
	}
	fs.mu.Lock()
	if err != nil {
		r.State, r.Reason = RolloutAborted, "storing the values failed: "+err.Error()
		fs.finishLocked(r)
	} else {
		r.Config = &cc
	}
	v := r.view()
	fs.mu.Unlock()
	if serr := fs.saveStepChange(ctx, v); err == nil {
		err = serr
	}
	if err != nil {
		return Rollout{}, err
	}
	fs.log.Info("rollout created", "rollout", r.ID, "label", c.Label, "profile_id", c.ProfileID, "devices", r.Total, "by", by)
	return v, nil
}

// CheckConfigRollout checks spec as CreateConfigRollout does and returns
// the rollout it would start now — no ID, its devices counted, the
// values it would store — storing and staging nothing.
func (fs *firmwareState) CheckConfigRollout(ctx context.Context, spec RolloutSpec, by string) (Rollout, error) {
	fs.stepMu.Lock()
	err := fs.syncStagingLocked(ctx)
	fs.stepMu.Unlock()
	if err != nil {
		return Rollout{}, err
	}
	spec, err = fs.checkConfigSpec(spec)
	if err != nil {
		return Rollout{}, err
	}
	r := fs.newRollout(spec, RolloutConfig, by)
	if err := fs.match(r); err != nil {
		return Rollout{}, err
	}
	return r.view(), nil
}

// syncStagingLocked reads back the rollouts other nodes started (cluster
// mode; fs.stepMu held), so that a label or profile another node's rollout
// staged a moment ago is refused here too; an unreadable store refuses.
func (fs *firmwareState) syncStagingLocked(ctx context.Context) error {
	if !fs.clustered() {
		return nil
	}
	if err := fs.syncRolloutsLocked(ctx); err != nil {
		return errors.Join(ErrUnavailable, err)
	}
	return nil
}

// checkConfigSpec checks spec (its Config set, FirmwareID 0) and the new
// values against their layer or profile, and returns it with its Config
// completed from the values there now.
func (fs *firmwareState) checkConfigSpec(spec RolloutSpec) (RolloutSpec, error) {
	if err := spec.Check(); err != nil {
		return spec, err
	}
	if spec.Config == nil || spec.FirmwareID != 0 {
		return spec, &FieldError{Field: "config", Message: "a configuration rollout has a config and no firmware_id"}
	}
	c := *spec.Config
	c.FromRev, c.ToRev, c.Previous, c.PreviousPriority, c.PreviousVersion, c.ToVersion = 0, 0, nil, 0, 0, 0
	if c.ProfileID != 0 {
		c.Label = ""
		cur, cfg, err := fs.devs.checkStagedProfile(c.ProfileID, c.Values)
		if err != nil {
			return spec, err
		}
		c.Values, c.Previous, c.PreviousVersion = cfg, cur.Config, cur.Version
	} else {
		cur, vals, err := fs.devs.checkStaged(c.Label, c.Values)
		if err != nil {
			return spec, err
		}
		c.Values, c.FromRev, c.PreviousPriority = vals, cur.Rev, cur.Priority
		if cur.Rev > 0 {
			c.Previous = cur.Values
		}
	}
	spec.Config = &c
	return spec, nil
}

// stageLoaded makes the stage of configuration rollout r, unless it is
// finished (fs.mu held or r not yet shared).
func (fs *firmwareState) stageLoaded(r *rollout) {
	if r.Config == nil || r.finished() || r.stage != nil {
		return
	}
	c := r.Config
	st := &configStage{label: c.Label, profile: c.ProfileID, rollout: r.ID, released: map[uint64]struct{}{}}
	if c.ProfileID != 0 {
		st.prevProfile = &Profile{ID: c.ProfileID, Version: c.PreviousVersion, Config: c.Previous}
		r.stage = st
		fs.devs.profileStage(st, true)
		return
	}
	if r.Config.FromRev > 0 {
		st.prev = &ConfigLayer{Kind: LayerLabel, Name: r.Config.Label, Rev: r.Config.FromRev,
			Priority: r.Config.PreviousPriority, Values: r.Config.Previous}
	}
	r.stage = st
	fs.devs.startStage(st)
}

// release lets ds (nil: every device of r) have r's new configuration
// (fs.mu held).
func (fs *firmwareState) release(r *rollout, ds []RolloutDevice) {
	if r.stage == nil {
		return
	}
	var ids []uint64
	if ds == nil {
		for id := range r.targets {
			ids = append(ids, id)
		}
	}
	for _, d := range ds {
		ids = append(ids, d.DeviceID)
	}
	fs.devs.releaseStage(r.stage, ids)
}

// revertConfig stores the previous values of configuration rollout id
// again as its layer's newest revision, when it is not finished and they
// are not the newest already.
func (fs *firmwareState) revertConfig(ctx context.Context, id uint64, by string) error {
	fs.mu.Lock()
	r := fs.rollouts[id]
	if r == nil || r.finished() || r.stage == nil {
		fs.mu.Unlock()
		return nil
	}
	st, c := r.stage, *r.Config
	fs.mu.Unlock()
	if c.ProfileID != 0 {
		_, err := fs.devs.writeStagedProfile(ctx, st, c.Previous, by, fmt.Sprintf("rollout %d aborted: back to version %d", id, c.PreviousVersion), true)
		return err
	}
	_, err := fs.devs.writeStaged(ctx, st, c.Previous, c.PreviousPriority, by,
		fmt.Sprintf("rollout %d aborted: back to revision %d", id, c.FromRev), true)
	return err
}

// configOnPush settles the pushing device's place in a configuration
// rollout from its applied version and error, desired the version the
// answer holds. It reads memory only.
func (fs *firmwareState) configOnPush(id uint64, applied, desired int64, configErr string, now time.Time) {
	if !fs.configTargets.Load() {
		return
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	t := fs.byConfig[id]
	if t == nil {
		return
	}
	ts := now.UTC().Truncate(time.Millisecond)
	behind := Behind(applied, desired)
	switch t.State {
	case DevicePending:
		if !behind {
			fs.setState(t, DeviceVerified, "", ts)
		} else {
			fs.setState(t, DeviceInstalling, "", ts) // this answer sends it
		}
	case DeviceInstalling:
		switch {
		case configErr != "":
			fs.setState(t, DeviceFailed, configErr, ts)
		case !behind:
			fs.setState(t, DeviceVerified, "", ts)
		}
	}
}
