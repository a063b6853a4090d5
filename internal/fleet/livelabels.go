package fleet

// Live labels (docs/groups.md): a label defined by an expression of the
// filter language (where.go) carries exactly the devices the expression
// selects, kept so as devices change: a device's live labels are
// evaluated again, under its lock, whenever what they read of it
// changes, with no pass over the fleet:
//
//   - a push or another node's push (noteReported): reported fields,
//     firmware;
//   - a registration or re-registration, a device read back from the
//     database in cluster mode: device type, model, firmware, serial;
//   - a manual label assigned or removed (AssignLabel);
//
// and the whole fleet is evaluated when a live label is defined or its
// expression changes, and when labels are loaded (start, and in cluster
// mode when another node changed labels). Live labels sit in the
// devices' label lists with the manual ones, so every use of labels (the
// devices filter, label counts, rollouts and commands to a label) sees
// them; only their definitions are stored, never their devices.
//
// A live label may name manual labels, and live labels made before it
// (lower IDs: evaluated first, no cycles).

import (
	"context"
	"errors"
	"math"
	"slices"
	"strconv"
)

// ccond is a condition with what it reads resolved.
type ccond struct {
	cond
	col   *column // state fields
	label uint16  // label fields; 0: unknown (no device has it)
}

// compiledWhere is a Where resolved against the labels and the index.
type compiledWhere struct {
	conds []ccond
	cols  []*column
}

// match evaluates w on d (d.mu held).
func (w *compiledWhere) match(d *device) bool {
	for i := range w.conds {
		c := &w.conds[i]
		ok := false
		switch c.field {
		case wState:
			k, v := c.col.cell(d.id)
			var num float64
			var str string
			switch k {
			case kNumber:
				num = math.Float64frombits(v)
			case kString:
				str = c.col.text(v)
			}
			ok = c.matchValue(k, num, str)
		case wDeviceType:
			ok = c.matchText(d.deviceType)
		case wFirmware:
			ok = c.matchText(d.firmware)
		case wModel:
			ok = c.matchText(d.model)
		case wMachineID:
			ok = c.matchText(d.machineID())
		case wSerial:
			ok = c.matchText(d.serial())
		case wLabel:
			_, has := slices.BinarySearch(d.labels, c.label)
			ok = has == (c.op == opEq)
		}
		if !ok {
			return false
		}
	}
	return true
}

// compileWhere resolves w: label names by labelID, state paths to index
// columns (added and filled when new; pin: for a live label).
func (r *labels) compileWhere(ctx context.Context, w Where, pin bool, labelID func(string) uint16) (*compiledWhere, error) {
	cols, err := r.indexColumns(ctx, w.StatePaths(), pin)
	if err != nil {
		return nil, err
	}
	cw := &compiledWhere{conds: make([]ccond, len(w.conds)), cols: cols}
	n := 0
	for i, c := range w.conds {
		cw.conds[i].cond = c
		switch c.field {
		case wState:
			cw.conds[i].col = cols[n]
			n++
		case wLabel:
			cw.conds[i].label = labelID(c.lit.str)
		}
	}
	return cw, nil
}

// liveLabel is a live label as devices are evaluated against it.
type liveLabel struct {
	id uint16
	w  *compiledWhere
}

// relabel evaluates d's live labels again (d.mu held). It allocates only
// when d's membership changes.
func (r *labels) relabel(d *device) {
	live := r.live.Load()
	if live == nil {
		return
	}
	for i := range *live {
		l := &(*live)[i]
		want := l.w.match(d)
		j, has := slices.BinarySearch(d.labels, l.id)
		switch {
		case want && !has:
			d.labels = slices.Insert(slices.Clip(d.labels), j, l.id)
		case !want && has:
			d.labels = slices.Delete(slices.Clone(d.labels), j, j+1)
		}
	}
}

// relabelAll evaluates every device's live labels again.
func (r *labels) relabelAll() {
	if r.live.Load() == nil {
		return
	}
	r.devs.each(r.relabel)
}

// publishLive makes the live label set of r.compiled the one devices are
// evaluated against (r.mu held).
func (r *labels) publishLive() {
	if len(r.compiled) == 0 {
		r.live.Store(nil)
		return
	}
	live := make([]liveLabel, 0, len(r.compiled))
	for id, w := range r.compiled {
		live = append(live, liveLabel{id: id, w: w})
	}
	slices.SortFunc(live, func(a, b liveLabel) int { return int(a.id) - int(b.id) })
	r.live.Store(&live)
}

// compileLiveLocked compiles the stored definition of live label id and
// takes it into r.compiled (r.mu held). A definition this server cannot
// read selects no device.
func (r *labels) compileLiveLocked(ctx context.Context, id uint16, filter string) {
	w, err := ParseWhere(filter)
	var cw *compiledWhere
	if err == nil {
		cw, err = r.compileWhere(ctx, w, true, func(n string) uint16 { return r.byName[n] })
	}
	if err != nil {
		r.log.Warn("live label: its filter cannot be used; it selects no device", "label", r.names[id], "filter", filter, "err", err)
		cw = &compiledWhere{conds: []ccond{{cond: cond{field: wLabel, op: opEq}}}} // label 0: nobody
	}
	if old := r.compiled[id]; old != nil {
		r.unpinColumns(old.cols)
	}
	r.compiled[id] = cw
}

// dropLiveLocked forgets live label id's definition (r.mu held).
func (r *labels) dropLiveLocked(id uint16) {
	if old := r.compiled[id]; old != nil {
		r.unpinColumns(old.cols)
		delete(r.compiled, id)
	}
	delete(r.filters, id)
}

// DefineLabel makes name a live label of the devices filter selects (an
// expression of the filter language), or changes the expression of the
// live label name. It returns the label with its device count.
func (r *labels) DefineLabel(ctx context.Context, name, filter string) (Label, error) {
	return r.defineLabel(ctx, name, filter, false)
}

// CheckLabelDefinition checks what DefineLabel would, and changes nothing:
// the label as it would be defined (without devices), or DefineLabel's
// error.
func (r *labels) CheckLabelDefinition(ctx context.Context, name, filter string) (Label, error) {
	return r.defineLabel(ctx, name, filter, true)
}

func (r *labels) defineLabel(ctx context.Context, name, filter string, check bool) (Label, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.init()
	if err := ValidLabelName(name); err != nil {
		return Label{}, err
	}
	w, err := ParseWhere(filter)
	if err != nil {
		return Label{}, err
	}
	id, exists := r.byName[name]
	if exists && r.filters[id] == "" {
		return Label{}, errors.Join(ErrLabelLive, errors.New("label "+strconv.Quote(name)+" is a manual label: delete it first, or choose another name"))
	}
	for _, ln := range w.LabelNames() {
		ref, ok := r.byName[ln]
		switch {
		case ln == name:
			return Label{}, whereError("a live label cannot name itself")
		case !ok:
			return Label{}, whereError("no label %q", ln)
		case exists && r.filters[ref] != "" && ref > id:
			return Label{}, whereError("live label %q was made after %q: a live label names only live labels made before it", ln, name)
		}
	}
	text := w.String()
	cw, err := r.compileWhere(ctx, w, true, func(n string) uint16 { return r.byName[n] })
	if err != nil {
		return Label{}, err
	}
	if check {
		r.unpinColumns(cw.cols)
		return Label{ID: id, Name: name, Filter: text}, nil
	}
	if exists {
		if r.store != nil {
			if err := r.store.SetLabelFilter(ctx, id, text); err != nil {
				r.unpinColumns(cw.cols)
				return Label{}, err
			}
			r.note(ctx, ChangeLabels, uint64(id))
		}
	} else {
		l, err := r.createLabelLocked(ctx, name, text)
		if err != nil {
			r.unpinColumns(cw.cols)
			return Label{}, err
		}
		id = l.ID
		if r.filters[id] != text { // another node defined it otherwise a moment ago
			r.unpinColumns(cw.cols)
			return Label{}, errors.Join(ErrLabelLive, errors.New("label "+strconv.Quote(name)+" was made a moment ago elsewhere"))
		}
	}
	if old := r.compiled[id]; old != nil {
		r.unpinColumns(old.cols)
	}
	r.filters[id], r.compiled[id] = text, cw
	r.publishLive()
	r.relabelAll()
	return r.labelLocked(id), nil
}

// Label returns the label name with its device count.
func (r *labels) Label(name string) (Label, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	id, ok := r.byName[name]
	if !ok {
		return Label{}, ErrNotFound
	}
	return r.labelLocked(id), nil
}

// labelLocked is label id with its device count (r.mu held).
func (r *labels) labelLocked(id uint16) Label {
	l := Label{ID: id, Name: r.names[id], Filter: r.filters[id]}
	r.devs.each(func(d *device) {
		if _, ok := slices.BinarySearch(d.labels, id); ok {
			l.Devices++
		}
	})
	return l
}

// usedBy names a live label that names label id; "" when none (r.mu
// held).
func (r *labels) usedBy(id uint16) string {
	for lid, w := range r.compiled {
		for _, c := range w.conds {
			if c.field == wLabel && c.label == id {
				return r.names[lid]
			}
		}
	}
	return ""
}
