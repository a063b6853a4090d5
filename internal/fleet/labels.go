package fleet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"
)

// Label is a name operators attach to many devices at once: by hand
// (assigned to the devices a filter selects at that moment), or live
// (Filter set: carried by exactly the devices Filter selects, livelabels.go).
type Label struct {
	ID      uint16 `json:"id,string"`
	Name    string `json:"name"`
	Devices int    `json:"devices"` // devices carrying it (Labels only)
	// Filter is a live label's expression of the filter language
	// (where.go); "" for a manual label.
	Filter string `json:"filter,omitempty"`
}

// LabelStore keeps labels; every store backend implements it. Without one
// (memory mode), labels live in memory only.
type LabelStore interface {
	// LoadLabels returns every label and streams every assignment.
	LoadLabels(ctx context.Context, each func(deviceID uint64, labelID uint16) error) ([]Label, error)
	// MaxLabelID is the highest label ID ever stored, deleted ones
	// included: their IDs are never handed out again.
	MaxLabelID(ctx context.Context) (uint16, error)
	CreateLabel(ctx context.Context, l Label) error
	// SetLabelFilter changes a live label's filter.
	SetLabelFilter(ctx context.Context, id uint16, filter string) error
	// DeleteLabel removes the label and all its assignments.
	DeleteLabel(ctx context.Context, id uint16) error
	// AssignLabel adds (on) or removes the label on the devices, atomically.
	AssignLabel(ctx context.Context, id uint16, deviceIDs []uint64, on bool) error
}

// Errors of label operations.
var (
	ErrLabelName  = errors.New("label names are 1 to 64 bytes of printable UTF-8 without commas")
	ErrTooManyIDs = errors.New("too many labels")
	// ErrLabelLive is a manual assignment to a live label, or a live
	// definition of a manual one (livelabels.go).
	ErrLabelLive = errors.New("label conflict")
	// ErrLabelInUse is the deletion of a label a live label names.
	ErrLabelInUse = errors.New("label in use")
	// ErrTooManyFields is a filter needing a state path indexed when
	// MaxIndexedFields paths are and live labels use them all
	// (stateindex.go).
	ErrTooManyFields = &FieldError{Field: FilterWhere, Message: "where: too many reported fields in use by live labels; delete a live label first"}
)

// labels is the labels room: label names and their small IDs (devices
// hold the IDs), the live labels' definitions (livelabels.go) and the
// index of reported fields filters read (stateindex.go). The Service
// embeds it, so that its exported methods are the Service's; the devices'
// label lists are the registry's, written under each device's lock.
type labels struct {
	mu     sync.Mutex // serialises label changes
	store  LabelStore
	byName map[string]uint16
	names  map[uint16]string
	next   uint16
	gen    atomic.Uint64 // changes when labels are created or deleted
	// Live labels (livelabels.go): their filters, compiled, and the set
	// devices are evaluated against.
	filters  map[uint16]string
	compiled map[uint16]*compiledWhere
	live     atomic.Pointer[[]liveLabel]
	index    stateIndex // reported fields filters use (stateindex.go)

	// Set by New: what the room needs of the others.
	devs    deviceFinder
	cluster ClusterStore // nil: one server
	// loadStates reads the stored states (write-through: states stay in
	// the store); nil: they are in memory.
	loadStates func(ctx context.Context, each func(DeviceRecord) error) error
	now        func() time.Time
	log        *slog.Logger
	// note writes a change log entry (cluster glue, cluster.go).
	note func(ctx context.Context, kind ChangeKind, id uint64)
	// tellLayers hears that label id was assigned to or removed from
	// devs, with the names at generation gen, r.mu held (configuration
	// layers, layers.go).
	tellLayers func(id uint16, devs []uint64, names map[uint16]string, gen uint64)
}

// wire gives the room what it needs of the others (New, once the
// Service knows where states are kept).
func (r *labels) wire(s *Service) {
	r.devs, r.cluster, r.now, r.log, r.note = s, s.opts.Cluster, s.now, s.log, s.noteChange
	r.tellLayers = s.layerState.labelsChanged
	if s.states != nil && s.store != nil {
		st := s.store
		r.loadStates = func(ctx context.Context, each func(DeviceRecord) error) error {
			_, err := st.Load(ctx, LoadOptions{}, each)
			return err
		}
	}
}

// LabelsGeneration changes whenever a label is created or deleted, so that
// holders of resolved label IDs know when to resolve again.
func (r *labels) LabelsGeneration() uint64 { return r.gen.Load() }
func (r *labels) init() {
	if r.byName == nil {
		r.byName, r.names, r.next = map[string]uint16{}, map[uint16]string{}, 1
		r.filters, r.compiled = map[uint16]string{}, map[uint16]*compiledWhere{}
	}
}

// hasLabels reports whether d carries every label in want; d.mu held.
func (d *device) hasLabels(want []uint16) bool {
	for _, w := range want {
		if _, ok := slices.BinarySearch(d.labels, w); !ok {
			return false
		}
	}
	return true
}

// ValidLabelName checks a label name.
func ValidLabelName(name string) error {
	if name == "" || len(name) > 64 || !utf8.ValidString(name) || strings.ContainsRune(name, ',') || strings.TrimSpace(name) != name {
		return ErrLabelName
	}
	for _, r := range name {
		if r < 0x20 || r == 0x7f {
			return ErrLabelName
		}
	}
	return nil
}

// labelsRead is what a LabelStore holds.
type labelsRead struct {
	labels    []Label
	perDevice map[uint64][]uint16
	high      uint16
}

// readLabels reads every label and assignment from ls.
func readLabels(ctx context.Context, ls LabelStore) (labelsRead, error) {
	rd := labelsRead{perDevice: map[uint64][]uint16{}}
	var err error
	rd.labels, err = ls.LoadLabels(ctx, func(dev uint64, id uint16) error {
		rd.perDevice[dev] = append(rd.perDevice[dev], id)
		return nil
	})
	if err != nil {
		return rd, fmt.Errorf("load labels: %w", err)
	}
	if rd.high, err = ls.MaxLabelID(ctx); err != nil {
		return rd, fmt.Errorf("load labels: %w", err)
	}
	return rd, nil
}

// statePaths lists the state paths the live labels of rd read.
func (rd *labelsRead) statePaths() []string {
	var out []string
	for _, l := range rd.labels {
		if w, err := ParseWhere(l.Filter); l.Filter != "" && err == nil {
			for _, p := range w.StatePaths() {
				if !slices.Contains(out, p) {
					out = append(out, p)
				}
			}
		}
	}
	return out
}

// loadLabels takes labels read from ls (New, after the devices) and
// keeps later changes there.
func (r *labels) loadLabels(ctx context.Context, ls LabelStore, rd labelsRead) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.applyLabelsLocked(ctx, ls, rd, false)
}

// loadLabelsLocked reads every label and assignment from ls; replace
// first forgets what memory holds (cluster mode: another node changed
// them). r.mu held.
func (r *labels) loadLabelsLocked(ctx context.Context, ls LabelStore, replace bool) error {
	rd, err := readLabels(ctx, ls)
	if err != nil {
		return err
	}
	return r.applyLabelsLocked(ctx, ls, rd, replace)
}

// applyLabelsLocked takes what readLabels read, and evaluates the live
// labels over the fleet. r.mu held.
func (r *labels) applyLabelsLocked(ctx context.Context, ls LabelStore, rd labelsRead, replace bool) error {
	r.init()
	labels, perDevice, high := rd.labels, rd.perDevice, rd.high
	if replace {
		clear(r.byName)
		clear(r.names)
		for id := range r.compiled {
			r.dropLiveLocked(id)
		}
		r.publishLive()
		r.devs.each(func(d *device) {
			if _, ok := perDevice[d.id]; !ok {
				d.labels = nil
			}
		})
	}
	for _, l := range labels {
		r.byName[l.Name], r.names[l.ID] = l.ID, l.Name
		high = max(high, l.ID)
	}
	if high >= r.next {
		r.next = high + 1 // 0 after 65535: no more labels
	}
	for dev, ids := range perDevice {
		if d := r.devs.get(dev); d != nil {
			slices.Sort(ids)
			d.mu.Lock()
			d.labels = slices.Compact(ids)
			d.mu.Unlock()
		}
	}
	r.store = ls
	for _, l := range labels {
		if l.Filter != "" {
			r.filters[l.ID] = l.Filter
			r.compileLiveLocked(ctx, l.ID, l.Filter)
		}
	}
	r.publishLive()
	r.relabelAll()
	r.gen.Add(1)
	r.tellLayers(0, nil, r.names, r.gen.Load()) // configuration layers (layers.go)
	return nil
}

// reloadLabels replaces every label and assignment with the stored ones.
func (r *labels) reloadLabels(ctx context.Context) error {
	if r.store == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.loadLabelsLocked(ctx, r.store, true)
}

// LabelIDs resolves names; an unknown name gives 0, which no device has.
func (r *labels) LabelIDs(names []string) []uint16 {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]uint16, len(names))
	for i, n := range names {
		out[i] = r.byName[n]
	}
	return out
}

// LabelNames returns the names of ids ("" for unknown ones).
func (r *labels) LabelNames(ids []uint16) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = r.names[id]
	}
	return out
}

// DeviceLabels returns the names of a device's labels, sorted.
func (r *labels) DeviceLabels(id uint64) []string {
	d := r.devs.get(id)
	if d == nil {
		return nil
	}
	d.mu.Lock()
	ids := d.labels
	d.mu.Unlock()
	names := r.LabelNames(ids)
	sort.Strings(names)
	return names
}

// HasLabel reports whether device id carries label.
func (r *labels) HasLabel(id uint64, label uint16) bool {
	d := r.devs.get(id)
	if d == nil {
		return false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	_, ok := slices.BinarySearch(d.labels, label)
	return ok
}

// LabelNamesSorted returns every label's name, sorted, without counting
// devices.
func (r *labels) LabelNamesSorted() []string {
	r.mu.Lock()
	out := make([]string, 0, len(r.names))
	for _, n := range r.names {
		out = append(out, n)
	}
	r.mu.Unlock()
	sort.Strings(out)
	return out
}

// Labels returns every label with its device count, ordered by name. It
// visits every device.
func (r *labels) Labels() []Label {
	r.mu.Lock()
	out := make([]Label, 0, len(r.names))
	index := map[uint16]int{}
	for id, n := range r.names {
		index[id] = len(out)
		out = append(out, Label{ID: id, Name: n, Filter: r.filters[id]})
	}
	r.mu.Unlock()
	if len(out) > 0 {
		r.devs.each(func(d *device) {
			for _, id := range d.labels {
				if i, ok := index[id]; ok {
					out[i].Devices++
				}
			}
		})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// CreateLabel adds a label, or returns the existing one of that name.
func (r *labels) CreateLabel(ctx context.Context, name string) (Label, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.createLabelLocked(ctx, name, "")
}

// createLabelLocked makes a label (live: filter set), or returns the
// existing one of that name. r.mu held.
func (r *labels) createLabelLocked(ctx context.Context, name, filter string) (Label, error) {
	r.init()
	if err := ValidLabelName(name); err != nil {
		return Label{}, err
	}
	if id, ok := r.byName[name]; ok {
		return Label{ID: id, Name: name, Filter: r.filters[id]}, nil
	}
	if r.next == 0 { // wrapped past 65535
		return Label{}, ErrTooManyIDs
	}
	l := Label{ID: r.next, Name: name, Filter: filter}
	cs := r.cluster
	if cs != nil && r.store != nil {
		// Another node may have made labels since: take its IDs and names.
		if err := r.loadLabelsLocked(ctx, r.store, true); err != nil {
			return Label{}, err
		}
		if id, ok := r.byName[name]; ok {
			return Label{ID: id, Name: name, Filter: r.filters[id]}, nil
		}
		// Other nodes make labels too: the database hands out the ID.
		id, err := cs.NextLabelID(ctx)
		if err != nil {
			return Label{}, errors.Join(ErrUnavailable, err)
		}
		if id == 0 || id > 1<<16-1 {
			return Label{}, ErrTooManyIDs
		}
		l.ID = uint16(id)
	}
	if r.store != nil {
		if err := r.store.CreateLabel(ctx, l); err != nil {
			if cs != nil && r.loadLabelsLocked(ctx, r.store, true) == nil {
				// Another node made the same name a moment ago.
				if id, ok := r.byName[name]; ok {
					return Label{ID: id, Name: name, Filter: r.filters[id]}, nil
				}
			}
			return Label{}, err
		}
		r.note(ctx, ChangeLabels, uint64(l.ID))
	}
	if l.ID >= r.next {
		r.next = l.ID + 1 // 0 after 65535: no more labels
	}
	r.byName[name], r.names[l.ID] = l.ID, name
	if filter != "" {
		r.filters[l.ID] = filter
	}
	r.gen.Add(1)
	return l, nil
}

// DeleteLabel removes a label from every device and forgets it.
func (r *labels) DeleteLabel(ctx context.Context, name string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	id, ok := r.byName[name]
	if !ok {
		return ErrNotFound
	}
	if by := r.usedBy(id); by != "" {
		return errors.Join(ErrLabelInUse, errors.New("label "+strconv.Quote(name)+" is named by live label "+strconv.Quote(by)+": change or delete that first"))
	}
	if r.store != nil {
		if err := r.store.DeleteLabel(ctx, id); err != nil {
			return err
		}
		r.note(ctx, ChangeLabels, uint64(id))
	}
	if _, live := r.filters[id]; live {
		r.dropLiveLocked(id)
		r.publishLive()
	}
	r.tellLayers(id, nil, r.names, r.gen.Load()) // configuration layers (layers.go)
	r.devs.each(func(d *device) {
		if i, ok := slices.BinarySearch(d.labels, id); ok {
			d.labels = slices.Delete(slices.Clone(d.labels), i, i+1)
		}
	})
	delete(r.byName, name)
	delete(r.names, id)
	r.gen.Add(1)
	return nil
}

// AssignLabel adds the label name (created if needed) to every device
// matching f, or removes it (remove true). It returns how many devices
// changed.
func (r *labels) AssignLabel(ctx context.Context, name string, f Filter, remove bool) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var id uint16
	if remove {
		var ok bool
		if id, ok = r.byName[name]; !ok {
			return 0, ErrNotFound
		}
	} else {
		l, err := r.createLabelLocked(ctx, name, "")
		if err != nil {
			return 0, err
		}
		id = l.ID
	}
	if r.filters[id] != "" {
		return 0, errors.Join(ErrLabelLive, errors.New("label "+strconv.Quote(name)+" is live: its devices are those its filter selects"))
	}
	now := r.now().UnixNano()
	var ids []uint64
	r.devs.each(func(d *device) {
		_, has := slices.BinarySearch(d.labels, id)
		if has == remove && f.match(d, now) {
			ids = append(ids, d.id)
		}
	})
	if len(ids) == 0 {
		return 0, nil
	}
	if r.store != nil {
		if err := r.store.AssignLabel(ctx, id, ids, !remove); err != nil {
			return 0, err
		}
		r.note(ctx, ChangeLabels, uint64(id))
	}
	for _, dev := range ids {
		d := r.devs.get(dev)
		d.mu.Lock()
		i, has := slices.BinarySearch(d.labels, id)
		switch {
		case remove && has:
			d.labels = slices.Delete(slices.Clone(d.labels), i, i+1)
		case !remove && !has:
			d.labels = slices.Insert(slices.Clip(d.labels), i, id)
		}
		r.relabel(d) // live labels naming this one
		d.mu.Unlock()
	}
	r.tellLayers(id, ids, r.names, r.gen.Load()) // configuration layers (layers.go)
	return len(ids), nil
}

// renewNames has the configuration layers' copy of the names renewed
// (labelNames, layers.go).
func (r *labels) renewNames() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.init()
	r.tellLayers(0xffff, []uint64{}, r.names, r.gen.Load()) // no label has this ID: nobody is told
}

func (r *labels) labelStore() LabelStore {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.store
}
