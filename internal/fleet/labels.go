package fleet

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
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

// labelRegistry maps label names to small IDs. Devices hold the IDs.
type labelRegistry struct {
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
}

// LabelsGeneration changes whenever a label is created or deleted, so that
// holders of resolved label IDs know when to resolve again.
func (s *Service) LabelsGeneration() uint64 { return s.labels.gen.Load() }

func (r *labelRegistry) init() {
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
func (s *Service) loadLabels(ctx context.Context, ls LabelStore, rd labelsRead) error {
	r := &s.labels
	r.mu.Lock()
	defer r.mu.Unlock()
	return s.applyLabelsLocked(ctx, ls, rd, false)
}

// loadLabelsLocked reads every label and assignment from ls; replace
// first forgets what memory holds (cluster mode: another node changed
// them). r.mu held.
func (s *Service) loadLabelsLocked(ctx context.Context, ls LabelStore, replace bool) error {
	rd, err := readLabels(ctx, ls)
	if err != nil {
		return err
	}
	return s.applyLabelsLocked(ctx, ls, rd, replace)
}

// applyLabelsLocked takes what readLabels read, and evaluates the live
// labels over the fleet. r.mu held.
func (s *Service) applyLabelsLocked(ctx context.Context, ls LabelStore, rd labelsRead, replace bool) error {
	r := &s.labels
	r.init()
	labels, perDevice, high := rd.labels, rd.perDevice, rd.high
	if replace {
		clear(r.byName)
		clear(r.names)
		for id := range r.compiled {
			s.dropLiveLocked(id)
		}
		s.publishLive()
		s.each(func(d *device) {
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
		if d := s.get(dev); d != nil {
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
			s.compileLiveLocked(ctx, l.ID, l.Filter)
		}
	}
	s.publishLive()
	s.relabelAll()
	r.gen.Add(1)
	s.labelsChanged(0, nil) // configuration layers (layers.go)
	return nil
}

// LabelIDs resolves names; an unknown name gives 0, which no device has.
func (s *Service) LabelIDs(names []string) []uint16 {
	r := &s.labels
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]uint16, len(names))
	for i, n := range names {
		out[i] = r.byName[n]
	}
	return out
}

// LabelNames returns the names of ids ("" for unknown ones).
func (s *Service) LabelNames(ids []uint16) []string {
	r := &s.labels
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = r.names[id]
	}
	return out
}

// DeviceLabels returns the names of a device's labels, sorted.
func (s *Service) DeviceLabels(id uint64) []string {
	d := s.get(id)
	if d == nil {
		return nil
	}
	d.mu.Lock()
	ids := d.labels
	d.mu.Unlock()
	names := s.LabelNames(ids)
	sort.Strings(names)
	return names
}

// HasLabel reports whether device id carries label.
func (s *Service) HasLabel(id uint64, label uint16) bool {
	d := s.get(id)
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
func (s *Service) LabelNamesSorted() []string {
	r := &s.labels
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
func (s *Service) Labels() []Label {
	r := &s.labels
	r.mu.Lock()
	out := make([]Label, 0, len(r.names))
	index := map[uint16]int{}
	for id, n := range r.names {
		index[id] = len(out)
		out = append(out, Label{ID: id, Name: n, Filter: r.filters[id]})
	}
	r.mu.Unlock()
	if len(out) > 0 {
		s.each(func(d *device) {
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

// each calls fn for every registered device with d.mu held.
func (s *Service) each(fn func(d *device)) {
	s.devMu.RLock()
	all := s.devices
	s.devMu.RUnlock()
	for _, d := range all {
		if d == nil {
			continue
		}
		d.mu.Lock()
		if d.profile != nil {
			fn(d)
		}
		d.mu.Unlock()
	}
}

// CreateLabel adds a label, or returns the existing one of that name.
func (s *Service) CreateLabel(ctx context.Context, name string) (Label, error) {
	r := &s.labels
	r.mu.Lock()
	defer r.mu.Unlock()
	return s.createLabelLocked(ctx, name, "")
}

// createLabelLocked makes a label (live: filter set), or returns the
// existing one of that name. r.mu held.
func (s *Service) createLabelLocked(ctx context.Context, name, filter string) (Label, error) {
	r := &s.labels
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
	cs := s.opts.Cluster
	if cs != nil && r.store != nil {
		// Another node may have made labels since: take its IDs and names.
		if err := s.loadLabelsLocked(ctx, r.store, true); err != nil {
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
			if cs != nil && s.loadLabelsLocked(ctx, r.store, true) == nil {
				// Another node made the same name a moment ago.
				if id, ok := r.byName[name]; ok {
					return Label{ID: id, Name: name, Filter: r.filters[id]}, nil
				}
			}
			return Label{}, err
		}
		s.noteChange(ctx, ChangeLabels, uint64(l.ID))
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
func (s *Service) DeleteLabel(ctx context.Context, name string) error {
	r := &s.labels
	r.mu.Lock()
	defer r.mu.Unlock()
	id, ok := r.byName[name]
	if !ok {
		return ErrNotFound
	}
	if by := s.usedBy(id); by != "" {
		return errors.Join(ErrLabelInUse, errors.New("label "+strconv.Quote(name)+" is named by live label "+strconv.Quote(by)+": change or delete that first"))
	}
	if r.store != nil {
		if err := r.store.DeleteLabel(ctx, id); err != nil {
			return err
		}
		s.noteChange(ctx, ChangeLabels, uint64(id))
	}
	if _, live := r.filters[id]; live {
		s.dropLiveLocked(id)
		s.publishLive()
	}
	s.labelsChanged(id, nil) // configuration layers (layers.go)
	s.each(func(d *device) {
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
func (s *Service) AssignLabel(ctx context.Context, name string, f Filter, remove bool) (int, error) {
	r := &s.labels
	r.mu.Lock()
	defer r.mu.Unlock()
	var id uint16
	if remove {
		var ok bool
		if id, ok = r.byName[name]; !ok {
			return 0, ErrNotFound
		}
	} else {
		l, err := s.createLabelLocked(ctx, name, "")
		if err != nil {
			return 0, err
		}
		id = l.ID
	}
	if r.filters[id] != "" {
		return 0, errors.Join(ErrLabelLive, errors.New("label "+strconv.Quote(name)+" is live: its devices are those its filter selects"))
	}
	now := s.now().UnixNano()
	var ids []uint64
	s.each(func(d *device) {
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
		s.noteChange(ctx, ChangeLabels, uint64(id))
	}
	for _, dev := range ids {
		d := s.get(dev)
		d.mu.Lock()
		i, has := slices.BinarySearch(d.labels, id)
		switch {
		case remove && has:
			d.labels = slices.Delete(slices.Clone(d.labels), i, i+1)
		case !remove && !has:
			d.labels = slices.Insert(slices.Clip(d.labels), i, id)
		}
		s.relabel(d) // live labels naming this one
		d.mu.Unlock()
	}
	s.labelsChanged(id, ids) // configuration layers (layers.go)
	return len(ids), nil
}

func (s *Service) labelStore() LabelStore {
	s.labels.mu.Lock()
	defer s.labels.mu.Unlock()
	return s.labels.store
}
