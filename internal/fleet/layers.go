package fleet

// Configuration layers (docs/configuration.md): a device's effective
// configuration is its profile's configuration with the values of its
// labels (group layers) and its own values (device layer) merged over it,
// then its variables resolved. Each layer has a history, a diff between
// two revisions and a rollback, like a profile.
//
// Memory: a device without layers and a profile without variables cost
// nothing per device (the device uses the profile's configuration and
// version as before); the others' effective versions are kept in a cache
// keyed by device, dropped whenever a layer changes.

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// LayerStore keeps every revision of every configuration layer; every
// store backend implements it. Without one (memory mode), layers live in
// memory only.
type LayerStore interface {
	// LoadConfigLayers returns the newest revision of every layer whose
	// newest revision is not a deletion.
	LoadConfigLayers(ctx context.Context) ([]ConfigLayer, error)
	// AddLayerRevision stores r as the next revision of its layer (the
	// store numbers it, ignoring r.Rev: two servers adding one at once
	// get different numbers) and returns it as stored.
	AddLayerRevision(ctx context.Context, r ConfigLayer) (ConfigLayer, error)
	// LayerRevisions lists one layer's revisions, oldest first (none:
	// empty).
	LayerRevisions(ctx context.Context, kind LayerKind, name string) ([]ConfigLayer, error)
}

// Errors of configuration layers.
var (
	// ErrSchema wraps a change refused because an effective configuration
	// would break its device type's JSON Schema.
	ErrSchema = errors.New("configuration does not match its device type's schema")
)

// LayerKind says what a configuration layer applies to.
type LayerKind string

// Layer kinds.
const (
	LayerDevice LayerKind = "device" // one device's own values; Name is its ID in decimal
	LayerLabel  LayerKind = "label"  // a group's values: every device carrying the label Name
	// LayerSchema is a device type's JSON Schema (Name: the device type),
	// kept with a history like the layers; it holds no values.
	LayerSchema LayerKind = "schema"
)

// ConfigLayer is one revision of a configuration layer.
type ConfigLayer struct {
	Kind LayerKind `json:"kind"`
	Name string    `json:"name"`
	Rev  int       `json:"rev"` // 1, 2, … per layer
	// Priority orders label layers: lower ones merge first, higher ones
	// over them; equal priorities go by label name.
	Priority int `json:"priority"`
	// Values is a JSON object merged over the layers below; null in a
	// revision that deleted the layer.
	Values  json.RawMessage `json:"values"`
	Deleted bool            `json:"deleted,omitempty"`
	By      string          `json:"by,omitempty"`
	At      time.Time       `json:"at"`
	// Note says what made it: "set", "deleted", "rollback to revision 2".
	Note string `json:"note,omitempty"`
}

// LayerUpdate sets a layer's values; a nil Priority keeps the layer's.
type LayerUpdate struct {
	Values   json.RawMessage `json:"values"`
	Priority *int            `json:"priority,omitempty"`
	By       string          `json:"-"`
	// DryRun checks the update and changes nothing.
	DryRun bool `json:"-"`
}

// EffectiveConfig is what a device is to run, and where each member comes
// from.
type EffectiveConfig struct {
	DeviceID       uint64          `json:"device_id,string"`
	ProfileID      uint64          `json:"profile_id,string"`
	Version        int64           `json:"version"`
	AppliedVersion int64           `json:"applied_version"`
	SyncState      string          `json:"sync_state"`
	Config         json.RawMessage `json:"config"`
	// Sources maps each member (a JSON pointer to a value that is not an
	// object, or to an empty object) to where it comes from: "profile",
	// "label NAME" or "device".
	Sources map[string]string `json:"sources"`
	// Layers are the layers merged over the profile, in order.
	Layers []LayerRef `json:"layers"`
	// Unresolved lists the variables the device has no value for; each
	// became its default, or the empty string.
	Unresolved []string `json:"unresolved,omitempty"`
}

// LayerRef names a layer at one revision.
type LayerRef struct {
	Kind     LayerKind `json:"kind"`
	Name     string    `json:"name"`
	Rev      int       `json:"rev"`
	Priority int       `json:"priority"`
}

type layerKey struct {
	kind LayerKind
	name string
}

// layerState is the configuration layers room: the layers, the device
// types' schemas (layerschema.go) and the effective configurations
// cached (layermerge.go). The Service embeds it, so that its exported
// methods are the Service's. mu is a leaf lock: it is taken with a
// device's lock held (sync state), never the reverse.
type layerState struct {
	write sync.Mutex // serialises layer changes
	store LayerStore

	mu      sync.RWMutex
	devices map[uint64]*ConfigLayer
	labels  map[string]*ConfigLayer
	ordered []*ConfigLayer // label layers in merge order
	schemas map[string]*layerSchema
	revs    map[layerKey][]ConfigLayer // memory mode: every revision
	staged  map[string]*configStage    // label layers a rollout stages (layerstage.go)

	any   atomic.Bool   // some device or label layer exists
	gen   atomic.Uint64 // changes with every layer change
	names atomic.Pointer[labelNames]

	cacheMu sync.Mutex
	cache   map[uint64]*effCache

	// Set by New: what the room needs of the others.
	devs   deviceFinder
	events *subscribers
	now    func() time.Time
	log    *slog.Logger
	// note writes a change log entry (cluster glue, cluster.go).
	note func(ctx context.Context, kind ChangeKind, id uint64)
	// The labels room (labels.go): names to IDs, whether a device
	// carries a label, the names' generation, and the copy of the names
	// renewed (it calls labelsChanged under its lock).
	labelIDs   func(names []string) []uint16
	hasLabel   func(id uint64, label uint16) bool
	labelsGen  func() uint64
	renewNames func()
	// syncStages reads back the rollouts other nodes started (a no-op on
	// one server), so that a change of a label's values another node
	// staged a moment ago is refused here too (rollout_cluster.go).
	syncStages func(ctx context.Context) error
}

// wire gives the room what it needs of the others (New).
func (l *layerState) wire(s *Service) {
	l.devs, l.events, l.now, l.log, l.note = s, &s.events, s.now, s.log, s.noteChange
	l.labelIDs, l.hasLabel, l.labelsGen = s.labels.LabelIDs, s.labels.HasLabel, s.labels.LabelsGeneration
	l.renewNames = s.labels.renewNames
	l.syncStages = func(ctx context.Context) error { return s.firmwareState.SyncRollouts(ctx) }
}

// syncStaged reads the rollouts back before an operator changes a label's
// values (kind LayerLabel); an unreadable store refuses the change.
func (l *layerState) syncStaged(ctx context.Context, kind LayerKind) error {
	if kind != LayerLabel || l.syncStages == nil {
		return nil
	}
	if err := l.syncStages(ctx); err != nil {
		return errors.Join(ErrUnavailable, err)
	}
	return nil
}

// labelNames is a copy of the label registry's names for reading under a
// device's lock. A label ID's name never changes (IDs are not handed out
// again), so an old copy only lacks labels made since.
type labelNames struct {
	gen    uint64
	byID   map[uint16]string
	byName map[string]uint16
}

// effCache is a device's effective configuration as last computed, valid
// while its inputs hash to fp.
type effCache struct {
	fp      uint64
	version int64
	config  json.RawMessage
	// state holds the ${state.…} values it was resolved with (nil: none
	// used): a push reporting others computes it again.
	state map[string]stateValue
}

func (l *layerState) init() {
	l.devices, l.labels = map[uint64]*ConfigLayer{}, map[string]*ConfigLayer{}
	l.schemas, l.revs, l.cache = map[string]*layerSchema{}, map[layerKey][]ConfigLayer{}, map[uint64]*effCache{}
	l.staged = map[string]*configStage{}
	l.names.Store(&labelNames{byID: map[uint16]string{}, byName: map[string]uint16{}})
}

// loadLayers reads every layer from ls and keeps later changes there.
func (l *layerState) loadLayers(ctx context.Context, ls LayerStore) error {
	l.store = ls
	return l.reloadLayers(ctx)
}

// reloadLayers replaces the layers with the stored ones (cluster mode:
// another node changed one) and tells the devices whose layers changed.
func (l *layerState) reloadLayers(ctx context.Context) error {
	if l.store == nil {
		return nil
	}
	l.write.Lock()
	defer l.write.Unlock()
	all, err := l.store.LoadConfigLayers(ctx)
	if err != nil {
		return err
	}
	devs, labels := map[uint64]*ConfigLayer{}, map[string]*ConfigLayer{}
	schemas := map[string]*layerSchema{}
	for i := range all {
		c := all[i]
		switch c.Kind {
		case LayerDevice:
			id, err := strconv.ParseUint(c.Name, 10, 64)
			if err != nil {
				continue
			}
			devs[id] = &c
		case LayerLabel:
			labels[c.Name] = &c
		case LayerSchema:
			sc, err := compileSchema(c.Name, c.Values)
			if err != nil {
				l.log.Warn("configuration schema does not compile; ignored", "device_type", c.Name, "err", err)
				continue
			}
			sc.layer = c
			schemas[c.Name] = sc
		}
	}
	l.mu.Lock()
	var changedDevs []uint64
	var changedLabels []string
	for id, c := range devs {
		if o := l.devices[id]; o == nil || o.Rev != c.Rev {
			changedDevs = append(changedDevs, id)
		}
	}
	for id := range l.devices {
		if devs[id] == nil {
			changedDevs = append(changedDevs, id)
		}
	}
	for n, c := range labels {
		if o := l.labels[n]; o == nil || o.Rev != c.Rev {
			changedLabels = append(changedLabels, n)
		}
	}
	for n := range l.labels {
		if labels[n] == nil {
			changedLabels = append(changedLabels, n)
		}
	}
	l.devices, l.labels, l.schemas = devs, labels, schemas
	l.reorderLocked()
	l.mu.Unlock()
	l.changed()
	if len(changedDevs)+len(changedLabels) > 0 {
		l.tellLayerChange(changedDevs, changedLabels)
	}
	return nil
}

// reorderLocked sorts the label layers into merge order; l.mu held.
func (l *layerState) reorderLocked() {
	l.ordered = l.ordered[:0:0]
	for _, c := range l.labels {
		l.ordered = append(l.ordered, c)
	}
	sort.Slice(l.ordered, func(i, j int) bool {
		a, b := l.ordered[i], l.ordered[j]
		if a.Priority != b.Priority {
			return a.Priority < b.Priority
		}
		return a.Name < b.Name
	})
	l.any.Store(len(l.devices)+len(l.labels) > 0)
}

// changed drops every cached effective configuration.
func (l *layerState) changed() {
	l.gen.Add(1)
	l.cacheMu.Lock()
	clear(l.cache)
	l.cacheMu.Unlock()
}

// tellLayerChange tells the devices holding a connection whose layers
// changed to push (Events.ConfigChanged).
func (l *layerState) tellLayerChange(devs []uint64, labels []string) {
	ids := l.labelIDs(labels)
	l.events.configChanged(func(id uint64) bool {
		if slices.Contains(devs, id) {
			return true
		}
		for _, lid := range ids {
			if lid != 0 && l.hasLabel(id, lid) {
				return true
			}
		}
		return false
	})
}

// labelsChanged is called by the labels room, its lock held, after
// label id was assigned to or removed from devs (nil: deleted, every
// device may have lost it; id 0: every label was read back from the
// store), with its names at generation gen: the copy of the names is
// renewed, and when the label has a layer its devices are told. Labels
// read back (another node assigned them) tell nobody: as the labels
// themselves, their values hold at the devices' next push.
func (l *layerState) labelsChanged(id uint16, devs []uint64, names map[uint16]string, gen uint64) {
	n := &labelNames{gen: gen, byID: make(map[uint16]string, len(names)), byName: make(map[string]uint16, len(names))}
	for i, name := range names {
		n.byID[i], n.byName[name] = name, i
	}
	l.names.Store(n)
	if !l.any.Load() {
		return
	}
	l.mu.RLock()
	_, has := l.labels[names[id]]
	l.mu.RUnlock()
	if !has || id == 0 {
		return
	}
	if devs == nil {
		l.events.configChanged(func(uint64) bool { return true })
		return
	}
	devs = slices.Clone(devs)
	slices.Sort(devs)
	l.events.configChanged(func(dev uint64) bool {
		_, ok := slices.BinarySearch(devs, dev)
		return ok
	})
}

// labelNames returns a copy of the label names no older than the
// registry's last change; the caller holds no device's lock.
func (l *layerState) labelNames() *labelNames {
	if n := l.names.Load(); n != nil && n.gen == l.labelsGen() {
		return n
	}
	l.renewNames()
	return l.names.Load()
}

// layerName is a layer's name as stored, checked.
func (l *layerState) layerName(kind LayerKind, name string) (string, error) {
	switch kind {
	case LayerDevice:
		id, err := strconv.ParseUint(name, 10, 64)
		if err != nil || l.devs.get(id) == nil {
			return "", ErrNotFound
		}
		return strconv.FormatUint(id, 10), nil
	case LayerLabel:
		if ValidLabelName(name) != nil || l.labelIDs([]string{name})[0] == 0 {
			return "", ErrNotFound
		}
		return name, nil
	case LayerSchema:
		if name == "" {
			return "", ErrNotFound
		}
		return name, nil
	}
	return "", ErrNotFound
}

// ConfigLayers returns every layer's current revision: devices' by ID,
// labels' in merge order, then schemas by device type.
func (l *layerState) ConfigLayers() []ConfigLayer {
	l.mu.RLock()
	defer l.mu.RUnlock()
	out := make([]ConfigLayer, 0, len(l.devices)+len(l.ordered)+len(l.schemas))
	for _, c := range l.devices {
		out = append(out, *c)
	}
	slices.SortFunc(out, func(a, b ConfigLayer) int { return cmp.Compare(a.Name, b.Name) })
	slices.SortStableFunc(out, func(a, b ConfigLayer) int { return cmp.Compare(len(a.Name), len(b.Name)) })
	for _, c := range l.ordered {
		out = append(out, *c)
	}
	n := len(out)
	for _, sc := range l.schemas {
		out = append(out, sc.layer)
	}
	slices.SortFunc(out[n:], func(a, b ConfigLayer) int { return cmp.Compare(a.Name, b.Name) })
	return out
}

// ConfigLayer returns a layer's current revision; ErrNotFound when it
// has none (never set, or deleted).
func (l *layerState) ConfigLayer(kind LayerKind, name string) (ConfigLayer, error) {
	name, err := l.layerName(kind, name)
	if err != nil {
		return ConfigLayer{}, err
	}
	l.mu.RLock()
	defer l.mu.RUnlock()
	var c *ConfigLayer
	switch kind {
	case LayerDevice:
		id, _ := strconv.ParseUint(name, 10, 64)
		c = l.devices[id]
	case LayerLabel:
		c = l.labels[name]
	case LayerSchema:
		if sc := l.schemas[name]; sc != nil {
			c = &sc.layer
		}
	}
	if c == nil {
		return ConfigLayer{}, ErrNotFound
	}
	return *c, nil
}

// PutConfigLayer sets a layer's values (a JSON object; for LayerSchema a
// JSON Schema). Values that break the variable syntax or, merged, a
// device type's schema are refused (a *FieldError, or ErrSchema) and
// nothing changes. The same values and priority change nothing (changed
// false).
func (l *layerState) PutConfigLayer(ctx context.Context, kind LayerKind, name string, u LayerUpdate) (ConfigLayer, bool, error) {
	name, err := l.layerName(kind, name)
	if err != nil {
		return ConfigLayer{}, false, err
	}
	vals, err := NormalizeConfig(u.Values)
	if err != nil {
		return ConfigLayer{}, false, &FieldError{Field: "values", Message: strings.Replace(err.Error(), "config", "values", 2)}
	}
	if kind == LayerSchema {
		if _, err := compileSchema(name, vals); err != nil {
			return ConfigLayer{}, false, &FieldError{Field: "values", Message: err.Error()}
		}
	} else if err := CheckVariables("values", vals); err != nil {
		return ConfigLayer{}, false, err
	}
	if err := l.syncStaged(ctx, kind); err != nil {
		return ConfigLayer{}, false, err
	}
	l.write.Lock()
	defer l.write.Unlock()
	cur, _ := l.ConfigLayer(kind, name)
	next := ConfigLayer{Kind: kind, Name: name, Priority: cur.Priority, Values: vals, By: u.By, Note: "set"}
	if u.Priority != nil {
		if kind != LayerLabel && *u.Priority != 0 {
			return ConfigLayer{}, false, &FieldError{Field: "priority", Message: "only label layers have a priority"}
		}
		next.Priority = *u.Priority
	}
	if cur.Rev > 0 && SameConfig(cur.Values, vals) && cur.Priority == next.Priority {
		return cur, false, nil
	}
	if u.DryRun {
		if err := l.refuseStaged(next); err != nil {
			return ConfigLayer{}, false, err
		}
		if err := l.checkSchemas(next); err != nil {
			return ConfigLayer{}, false, err
		}
		next.Rev = cur.Rev + 1
		return next, true, nil
	}
	c, err := l.storeLayer(ctx, next)
	return c, err == nil, err
}

// DeleteConfigLayer removes a layer's values; its history stays.
func (l *layerState) DeleteConfigLayer(ctx context.Context, kind LayerKind, name, by string) error {
	name, err := l.layerName(kind, name)
	if err != nil {
		return err
	}
	if err := l.syncStaged(ctx, kind); err != nil {
		return err
	}
	l.write.Lock()
	defer l.write.Unlock()
	cur, err := l.ConfigLayer(kind, name)
	if err != nil {
		return err
	}
	_, err = l.storeLayer(ctx, ConfigLayer{Kind: kind, Name: name, Priority: cur.Priority, Values: json.RawMessage("null"),
		Deleted: true, By: by, Note: "deleted"})
	return err
}

// storeLayer checks next against the schemas, stores it as a new revision
// and makes it current; l.write held.
func (l *layerState) storeLayer(ctx context.Context, next ConfigLayer) (ConfigLayer, error) {
	if err := l.refuseStaged(next); err != nil {
		return ConfigLayer{}, err
	}
	if err := l.checkSchemas(next); err != nil {
		return ConfigLayer{}, err
	}
	next.At = l.now().UTC().Truncate(time.Millisecond)
	if l.store != nil {
		stored, err := l.store.AddLayerRevision(ctx, next)
		if err != nil {
			return ConfigLayer{}, err
		}
		next = stored
	} else {
		l.mu.Lock()
		k := layerKey{next.Kind, next.Name}
		next.Rev = len(l.revs[k]) + 1
		l.revs[k] = append(l.revs[k], next)
		l.mu.Unlock()
	}
	l.setLayer(next)
	l.note(ctx, ChangeConfigLayers, 0)
	l.log.Info("configuration layer changed", "kind", next.Kind, "name", next.Name, "rev", next.Rev, "by", next.By, "note", next.Note)
	return next, nil
}

// setLayer makes c its layer's current revision in memory and tells the
// devices it applies to.
func (l *layerState) setLayer(c ConfigLayer) {
	l.mu.Lock()
	var devs []uint64
	var labels []string
	switch c.Kind {
	case LayerDevice:
		id, _ := strconv.ParseUint(c.Name, 10, 64)
		if c.Deleted {
			delete(l.devices, id)
		} else {
			l.devices[id] = &c
		}
		devs = []uint64{id}
	case LayerLabel:
		if c.Deleted {
			delete(l.labels, c.Name)
		} else {
			l.labels[c.Name] = &c
		}
		labels = []string{c.Name}
	case LayerSchema:
		if c.Deleted {
			delete(l.schemas, c.Name)
		} else if sc, err := compileSchema(c.Name, c.Values); err == nil {
			sc.layer = c
			l.schemas[c.Name] = sc
		}
	}
	l.reorderLocked()
	l.mu.Unlock()
	l.changed()
	if len(devs)+len(labels) > 0 {
		l.tellLayerChange(devs, labels)
	}
}

// LayerHistory returns a layer's revisions, oldest first.
func (l *layerState) LayerHistory(ctx context.Context, kind LayerKind, name string) ([]ConfigLayer, error) {
	name, err := l.layerName(kind, name)
	if err != nil {
		return nil, err
	}
	if l.store != nil {
		out, err := l.store.LayerRevisions(ctx, kind, name)
		if out == nil {
			out = []ConfigLayer{}
		}
		return out, err
	}
	l.mu.RLock()
	defer l.mu.RUnlock()
	return append([]ConfigLayer{}, l.revs[layerKey{kind, name}]...), nil
}

func (l *layerState) layerRevision(ctx context.Context, kind LayerKind, name string, rev int) (ConfigLayer, error) {
	all, err := l.LayerHistory(ctx, kind, name)
	if err != nil {
		return ConfigLayer{}, err
	}
	i := slices.IndexFunc(all, func(c ConfigLayer) bool { return c.Rev == rev })
	if i < 0 {
		return ConfigLayer{}, &FieldError{Field: "rev", Message: string(kind) + " layer " + name + " has no revision " + strconv.Itoa(rev)}
	}
	return all[i], nil
}

// LayerDiff compares revisions from and to of a layer (a deletion's values
// are null).
func (l *layerState) LayerDiff(ctx context.Context, kind LayerKind, name string, from, to int) ([]DiffEntry, error) {
	a, err := l.layerRevision(ctx, kind, name, from)
	if err != nil {
		return nil, err
	}
	b, err := l.layerRevision(ctx, kind, name, to)
	if err != nil {
		return nil, err
	}
	out := DiffJSON(a.Values, b.Values)
	if a.Priority != b.Priority {
		out = append(out, DiffEntry{Path: "priority", Op: "changed",
			Old: json.RawMessage(strconv.Itoa(a.Priority)), New: json.RawMessage(strconv.Itoa(b.Priority))})
	}
	return out, nil
}

// RollbackLayer makes revision rev's values and priority the layer's
// newest revision (rolling back to a deletion deletes the layer).
func (l *layerState) RollbackLayer(ctx context.Context, kind LayerKind, name string, rev int, by string) (ConfigLayer, error) {
	r, err := l.layerRevision(ctx, kind, name, rev)
	if err != nil {
		return ConfigLayer{}, err
	}
	name, _ = l.layerName(kind, name)
	if err := l.syncStaged(ctx, kind); err != nil {
		return ConfigLayer{}, err
	}
	l.write.Lock()
	defer l.write.Unlock()
	r.By, r.Note = by, "rollback to revision "+strconv.Itoa(rev)
	return l.storeLayer(ctx, r)
}

// EffectiveConfig returns what device id is to run, with each member's
// source.
func (l *layerState) EffectiveConfig(id uint64) (EffectiveConfig, error) {
	d := l.devs.get(id)
	if d == nil {
		return EffectiveConfig{}, ErrNotFound
	}
	names := l.labelNames()
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.profile == nil {
		return EffectiveConfig{}, ErrNotFound
	}
	p := d.profile.pinnedFor(d.id) // layerstage.go
	in := l.inputs(d, names)
	l.cacheMu.Lock()
	prev := l.cache[d.id]
	l.cacheMu.Unlock()
	e := in.compute(d, p, names, &stateSource{mem: d.state, prev: prev}, true)
	e.DeviceID, e.ProfileID, e.AppliedVersion = id, p.ID, d.appliedVersion
	e.SyncState = d.syncState().String()
	return e, nil
}

// layerInputs are the layers that apply to a device, in merge order.
type layerInputs struct {
	labels []*ConfigLayer
	device *ConfigLayer
}

// inputs collects the layers applying to d (d.mu held).
func (l *layerState) inputs(d *device, names *labelNames) layerInputs {
	var in layerInputs
	if !l.any.Load() {
		return in
	}
	l.mu.RLock()
	defer l.mu.RUnlock()
	in.device = l.devices[d.id]
	for _, c := range l.ordered {
		if id, ok := names.byName[c.Name]; ok {
			if _, has := slices.BinarySearch(d.labels, id); has {
				if c = l.pinned(c, d.id); c != nil {
					in.labels = append(in.labels, c)
				}
			}
		}
	}
	return in
}

// applies says whether any layer applies to d, without allocating (d.mu
// held).
func (l *layerState) applies(d *device, names *labelNames) bool {
	if !l.any.Load() {
		return false
	}
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.devices[d.id] != nil {
		return true
	}
	for _, c := range l.ordered {
		if id, ok := names.byName[c.Name]; ok {
			if _, has := slices.BinarySearch(d.labels, id); has && l.pinned(c, d.id) != nil {
				return true
			}
		}
	}
	return false
}

// effective is d's effective configuration version and content (d.mu
// held): the profile's own, without allocating, for a device without
// layers on a profile without variables; else computed, or the cached
// copy while its inputs are the same.
func (d *device) effective() (int64, json.RawMessage) { return d.effectiveAt(nil) }

// effectiveAt is effective for the answer to a push that reported state
// pushed: ${state.…} variables take their values from it.
func (d *device) effectiveAt(pushed []byte) (int64, json.RawMessage) {
	pe := d.profile
	p := pe.pinnedFor(d.id) // layerstage.go
	l := pe.layers
	if l == nil {
		return p.Version, p.Config
	}
	vars := pe.hasVariables(p)
	names := l.names.Load()
	if !vars && !l.applies(d, names) {
		return p.Version, p.Config
	}
	fp := l.fingerprint(d, p, names)
	l.cacheMu.Lock()
	c := l.cache[d.id]
	l.cacheMu.Unlock()
	if c != nil && c.fp == fp && (pushed == nil || c.sameState(pushed)) {
		return c.version, c.config
	}
	st := &stateSource{pushed: pushed, mem: d.state, prev: c}
	e := l.inputs(d, names).compute(d, p, names, st, false)
	l.cacheMu.Lock()
	l.cache[d.id] = &effCache{fp: fp, version: e.Version, config: e.Config, state: st.used}
	l.cacheMu.Unlock()
	return e.Version, e.Config
}

// desired is d's effective configuration version (d.mu held).
func (d *device) desired() int64 {
	v, _ := d.effective()
	return v
}

// fingerprint hashes what d's effective configuration depends on, without
// allocating (FNV-1a).
func (l *layerState) fingerprint(d *device, p *Profile, names *labelNames) uint64 {
	h := uint64(14695981039346656037)
	num := func(x uint64) {
		for range 8 {
			h = (h ^ (x & 0xff)) * 1099511628211
			x >>= 8
		}
	}
	str := func(s string) {
		num(uint64(len(s)))
		for i := 0; i < len(s); i++ {
			h = (h ^ uint64(s[i])) * 1099511628211
		}
	}
	num(uint64(p.Version))
	num(l.gen.Load())
	num(names.gen)
	num(d.id)
	for _, id := range d.labels {
		num(uint64(id))
	}
	str(d.ids)
	str(d.deviceType)
	str(d.model)
	str(d.firmware)
	return h
}

// hasVariables says whether p's configuration holds a variable, checked
// once per profile content.
func (e *profileEntry) hasVariables(p *Profile) bool {
	if c := e.vars.Load(); c != nil && c.p == p {
		return c.has
	}
	has := bytes.Contains(p.Config, []byte("${"))
	e.vars.Store(&profileVars{p: p, has: has})
	return has
}

// profileVars caches whether a profile's content holds a variable.
type profileVars struct {
	p   *Profile
	has bool
}
