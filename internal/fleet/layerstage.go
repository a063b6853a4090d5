package fleet

// Staged label layers (docs/configuration.md#staged-changes): while a
// configuration rollout (configrollout.go) runs, its label's layer is
// staged: the devices the rollout released merge the layer's newest
// revision, the others the revision before it, and no other change of
// the layer is taken.

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
)

// configStage is one staged label layer or profile configuration. Its
// lock is a leaf, taken with a device's lock and the layers' read lock
// held.
type configStage struct {
	label   string
	profile uint64 // a profile's stage: prevProfile, not prev
	rollout uint64
	prev    *ConfigLayer // the revision devices not released keep; nil: none
	// prevProfile is the profile's version and configuration devices not
	// released keep.
	prevProfile *Profile
	writing     atomic.Bool // the rollout stores a revision (layers' write lock held)

	mu       sync.Mutex
	released map[uint64]struct{}
}

func (st *configStage) isReleased(dev uint64) bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	_, ok := st.released[dev]
	return ok
}

// pinned is label layer c as device dev merges it: c, or the revision a
// stage keeps for a device not released (nil: none); l.mu held.
func (l *layerState) pinned(c *ConfigLayer, dev uint64) *ConfigLayer {
	if len(l.staged) == 0 {
		return c
	}
	st := l.staged[c.Name]
	if st == nil || st.isReleased(dev) {
		return c
	}
	return st.prev
}

// refuseStaged refuses a change of a staged layer but the rollout's own
// (l.write held).
func (l *layerState) refuseStaged(next ConfigLayer) error {
	if next.Kind != LayerLabel {
		return nil
	}
	l.mu.RLock()
	st := l.staged[next.Name]
	l.mu.RUnlock()
	if st == nil || st.writing.Load() {
		return nil
	}
	return fmt.Errorf("%w: rollout %d stages the values of label %s; abort it or let it finish first", ErrRolloutState, st.rollout, next.Name)
}

// checkStaged implements configStager.
func (l *layerState) checkStaged(label string, values json.RawMessage) (ConfigLayer, json.RawMessage, error) {
	name, err := l.layerName(LayerLabel, label)
	if err != nil {
		return ConfigLayer{}, nil, err // ErrNotFound
	}
	vals, err := NormalizeConfig(values)
	if err != nil {
		return ConfigLayer{}, nil, &FieldError{Field: "config.values", Message: strings.Replace(err.Error(), "config", "config.values", 2)}
	}
	if err := CheckVariables("config.values", vals); err != nil {
		return ConfigLayer{}, nil, err
	}
	cur, _ := l.ConfigLayer(LayerLabel, name)
	if err := l.refuseStaged(ConfigLayer{Kind: LayerLabel, Name: name}); err != nil {
		return ConfigLayer{}, nil, err
	}
	if err := l.checkSchemas(ConfigLayer{Kind: LayerLabel, Name: name, Priority: cur.Priority, Values: vals}); err != nil {
		return ConfigLayer{}, nil, err
	}
	return cur, vals, nil
}

// writeStaged implements configStager.
func (l *layerState) writeStaged(ctx context.Context, st *configStage, values json.RawMessage, priority int, by, note string, revert bool) (ConfigLayer, error) {
	l.write.Lock()
	defer l.write.Unlock()
	next := ConfigLayer{Kind: LayerLabel, Name: st.label, Priority: priority, Values: values, By: by, Note: note}
	cur, err := l.ConfigLayer(LayerLabel, st.label)
	switch {
	case values == nil && err != nil:
		return cur, nil // no values already
	case values == nil:
		next.Values, next.Deleted = json.RawMessage("null"), true
	case revert && err == nil && SameConfig(cur.Values, values) && cur.Priority == priority:
		return cur, nil // back already
	}
	st.writing.Store(true)
	defer st.writing.Store(false)
	return l.storeLayer(ctx, next)
}

// startStage implements configStager: nobody's configuration changes.
func (l *layerState) startStage(st *configStage) {
	l.mu.Lock()
	l.staged[st.label] = st
	l.mu.Unlock()
	l.changed()
}

// releaseStage implements configStager: ids take the newest revision and
// are told.
func (l *layerState) releaseStage(st *configStage, ids []uint64) {
	if len(ids) == 0 {
		return
	}
	st.mu.Lock()
	for _, id := range ids {
		st.released[id] = struct{}{}
	}
	st.mu.Unlock()
	l.changed()
	set := make(map[uint64]struct{}, len(ids))
	for _, id := range ids {
		set[id] = struct{}{}
	}
	l.events.configChanged(func(id uint64) bool {
		_, ok := set[id]
		return ok
	})
}

// endStage implements configStager: every device takes the newest
// revision, and the label's devices are told.
func (l *layerState) endStage(st *configStage) {
	l.mu.Lock()
	if l.staged[st.label] == st {
		delete(l.staged, st.label)
	}
	l.mu.Unlock()
	l.changed()
	l.tellLayerChange(nil, []string{st.label})
}

// pinnedFor is the profile device dev merges its layers over (d.mu held):
// e's, or the one a stage keeps for a device not released.
func (e *profileEntry) pinnedFor(dev uint64) *Profile {
	if st := e.stage.Load(); st != nil && !st.isReleased(dev) {
		return st.prevProfile
	}
	return e.get()
}

// refuseStaged refuses a change of a staged profile's configuration but
// the rollout's own.
func (e *profileEntry) refuseStaged(id uint64) error {
	if st := e.stage.Load(); st != nil && !st.writing.Load() {
		return fmt.Errorf("%w: rollout %d stages the configuration of profile %d; abort it or let it finish first", ErrRolloutState, st.rollout, id)
	}
	return nil
}

// checkStagedProfile implements configStager.
func (ps *profiles) checkStagedProfile(id uint64, config json.RawMessage) (Profile, json.RawMessage, error) {
	u := ProfileUpdate{Config: config}
	if err := u.Normalize(); err != nil {
		return Profile{}, nil, err
	}
	if u.Config == nil {
		return Profile{}, nil, &FieldError{Field: "config", Message: "config is required"}
	}
	ps.mu.Lock()
	e := ps.byID[id]
	ps.mu.Unlock()
	if e == nil {
		return Profile{}, nil, ErrNotFound
	}
	<-e.ready
	if e.err != nil {
		return Profile{}, nil, ErrNotFound
	}
	if err := e.refuseStaged(id); err != nil {
		return Profile{}, nil, err
	}
	cur := *e.get()
	next := cur
	next.Config = u.Config
	if err := ps.checkSchema(e, &next); err != nil {
		return Profile{}, nil, err
	}
	return cur, u.Config, nil
}

// writeStagedProfile implements configStager.
func (ps *profiles) writeStagedProfile(ctx context.Context, st *configStage, config json.RawMessage, by, note string, revert bool) (Profile, error) {
	st.writing.Store(true)
	defer st.writing.Store(false)
	p, _, err := ps.updateProfile(ctx, st.profile, ProfileUpdate{Config: config}, by, note, !revert)
	return p, err
}

// profileStage implements configStager: started, nobody's configuration
// changes; ended, the profile's devices are told.
func (ps *profiles) profileStage(st *configStage, on bool) {
	ps.mu.Lock()
	e := ps.byID[st.profile]
	ps.mu.Unlock()
	if e == nil {
		return
	}
	if on {
		e.stage.Store(st)
	} else if e.stage.CompareAndSwap(st, nil) {
		ps.events.profileChanged(st.profile)
	}
	ps.layers.changed()
}
