package fleet

// The index of reported fields (docs/groups.md): the state paths filters
// use (live labels' and recent queries'), one column each, a cell per
// device ID, so that a filter on a reported field answers from memory in
// every persistence mode, also write-through, where states stay in the
// store. A cell is 9 bytes: its JSON type and the value (a number's bits
// or the index of a string in the column's dictionary). Pushes update the
// columns of their device (noteReported); a new column is filled once
// from every device's state (memory) or from the store (write-through).

import (
	"context"
	"encoding/json"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

// MaxIndexedFields bounds how many state paths are indexed at once; past
// it, the path queried longest ago that no live label uses is dropped.
const MaxIndexedFields = 32

const (
	chunkBits = 12
	chunkLen  = 1 << chunkBits
)

// idxChunk holds the cells of chunkLen consecutive device IDs.
type idxChunk struct {
	kinds [chunkLen]valKind
	vals  [chunkLen]uint64
}

// column is the index of one state path. Cells are written and read
// under their device's lock; the chunk table and the dictionary are
// replaced, never changed in place where readers look.
type column struct {
	path     string
	segs     []string
	chunks   atomic.Pointer[[]*idxChunk]
	grow     sync.Mutex // adds chunks
	dictMu   sync.Mutex // adds strings
	dictIdx  map[string]uint32
	dict     atomic.Pointer[[]string]
	ready    chan struct{} // closed once filled
	pins     int           // live labels using it; stateIndex.mu held
	lastUsed atomic.Int64  // unix ns of the last query using it
}

func newColumn(path string, segs []string) *column {
	c := &column{path: path, segs: segs, dictIdx: map[string]uint32{}, ready: make(chan struct{})}
	c.chunks.Store(&[]*idxChunk{})
	c.dict.Store(&[]string{})
	return c
}

// chunk returns the chunk holding id's cell, adding it if needed.
func (c *column) chunk(id uint64) *idxChunk {
	ci := id >> chunkBits
	if t := *c.chunks.Load(); ci < uint64(len(t)) {
		return t[ci]
	}
	c.grow.Lock()
	defer c.grow.Unlock()
	t := *c.chunks.Load()
	if ci < uint64(len(t)) {
		return t[ci]
	}
	n := make([]*idxChunk, ci+1, ci+1+ci/4)
	copy(n, t)
	for i := len(t); i < len(n); i++ {
		n[i] = new(idxChunk)
	}
	c.chunks.Store(&n)
	return n[ci]
}

// cell reads id's cell (its device's lock held).
func (c *column) cell(id uint64) (valKind, uint64) {
	t := *c.chunks.Load()
	ci := id >> chunkBits
	if ci >= uint64(len(t)) {
		return kUnset, 0
	}
	ch := t[ci]
	return ch.kinds[id&(chunkLen-1)], ch.vals[id&(chunkLen-1)]
}

// text returns a string cell's value.
func (c *column) text(v uint64) string {
	d := *c.dict.Load()
	if v < uint64(len(d)) {
		return d[v]
	}
	return ""
}

// intern returns the dictionary index of s in c.
func intern(c *column, s string) uint32 {
	c.dictMu.Lock()
	defer c.dictMu.Unlock()
	if i, ok := c.dictIdx[string(s)]; ok {
		return i
	}
	d := *c.dict.Load()
	i := uint32(len(d))
	str := strings.Clone(s) // s may be part of a request's body
	d = append(d, str)
	c.dict.Store(&d)
	c.dictIdx[str] = i
	return i
}

// record sets id's cell from the state raw (its device's lock held).
// It allocates only for a string value the column has not seen.
func record(c *column, id uint64, raw string) {
	k, bits := kAbsent, uint64(0)
	if v, ok := lookupJSON(raw, c.segs); ok {
		var str string
		k, bits, str = classify(v)
		if k == kString {
			bits = uint64(intern(c, str))
		}
	}
	ch := c.chunk(id)
	ch.kinds[id&(chunkLen-1)], ch.vals[id&(chunkLen-1)] = k, bits
}

// classify reads a JSON value: its kind, a number's bits, a string's text.
func classify(v string) (k valKind, bits uint64, str string) {
	switch v[0] {
	case '"':
		in := v[1 : len(v)-1]
		for i := 0; i < len(in); i++ {
			if in[i] == '\\' {
				var s string
				if json.Unmarshal([]byte(v), &s) != nil {
					return kAbsent, 0, str
				}
				return kString, 0, s
			}
		}
		return kString, 0, in
	case 't':
		return kTrue, 0, str
	case 'f':
		return kFalse, 0, str
	case 'n':
		return kNull, 0, str
	case '{':
		return kObject, 0, str
	case '[':
		return kArray, 0, str
	}
	n, ok := parseNumber(v)
	if !ok {
		return kAbsent, 0, str
	}
	return kNumber, math.Float64bits(n), str
}

// stateIndex is the set of indexed columns.
type stateIndex struct {
	mu   sync.Mutex                // changes the set
	cols atomic.Pointer[[]*column] // sorted by path
}

// noteReported takes a device's newly reported state into the index and
// its live labels (d.mu held): the push's one call. Without indexed
// fields and live labels it returns at once; it allocates only when a
// live label's membership changes or a string value is new.
func (r *labels) noteReported(d *device, raw []byte) {
	if cols := r.index.cols.Load(); cols != nil && len(*cols) > 0 {
		// Read only during the call; intern copies what it keeps.
		st := unsafe.String(unsafe.SliceData(raw), len(raw))
		for _, c := range *cols {
			record(c, d.id, st)
		}
	}
	r.relabel(d)
}

// indexColumns returns the columns of paths, adding and filling those
// not indexed yet; pin counts a live label's use (unpin: unpinColumns).
func (r *labels) indexColumns(ctx context.Context, paths []string, pin bool) ([]*column, error) {
	if len(paths) == 0 {
		return nil, nil
	}
	x := &r.index
	x.mu.Lock()
	var cur []*column
	if p := x.cols.Load(); p != nil {
		cur = *p
	}
	out := make([]*column, len(paths))
	var added []*column
	next := slices.Clone(cur)
	now := r.now().UnixNano()
	for i, p := range paths {
		j, found := slices.BinarySearchFunc(next, p, func(c *column, p string) int { return strings.Compare(c.path, p) })
		if !found {
			if len(next) >= MaxIndexedFields {
				victim := -1
				for k, c := range next {
					if c.pins == 0 && !slices.Contains(out, c) && (victim < 0 || c.lastUsed.Load() < next[victim].lastUsed.Load()) {
						victim = k
					}
				}
				if victim < 0 {
					x.mu.Unlock()
					return nil, ErrTooManyFields
				}
				next = slices.Delete(next, victim, victim+1)
				j, _ = slices.BinarySearchFunc(next, p, func(c *column, p string) int { return strings.Compare(c.path, p) })
			}
			w, _ := ParseWhere("state." + p + " exists")
			c := newColumn(p, w.conds[0].segs)
			next = slices.Insert(next, j, c)
			added = append(added, c)
		}
		out[i] = next[j]
		if pin {
			out[i].pins++
		}
		out[i].lastUsed.Store(now)
	}
	if len(added) > 0 {
		x.cols.Store(&next)
	}
	x.mu.Unlock()
	if len(added) > 0 {
		r.fillColumns(ctx, added)
	}
	for _, c := range out {
		select {
		case <-c.ready:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return out, nil
}

// preset indexes paths with nothing to fill (New, before the devices
// load: the load records their states).
func (x *stateIndex) preset(paths []string) []*column {
	if len(paths) == 0 {
		return nil
	}
	slices.Sort(paths)
	paths = slices.Compact(paths)
	if len(paths) > MaxIndexedFields {
		paths = paths[:MaxIndexedFields]
	}
	cols := make([]*column, len(paths))
	for i, p := range paths {
		w, _ := ParseWhere("state." + p + " exists")
		cols[i] = newColumn(p, w.conds[0].segs)
		close(cols[i].ready)
	}
	x.mu.Lock()
	x.cols.Store(&cols)
	x.mu.Unlock()
	return slices.Clone(cols)
}

// unpinColumns gives back a live label's use of cols.
func (r *labels) unpinColumns(cols []*column) {
	r.index.mu.Lock()
	for _, c := range cols {
		c.pins--
	}
	r.index.mu.Unlock()
}

// fillColumns fills new columns: from memory's states, or, with states
// in the store (write-through), from the store. Pushes write the columns
// meanwhile; a cell a push wrote is newer than the store's and stays.
func (r *labels) fillColumns(ctx context.Context, cols []*column) {
	defer func() {
		for _, c := range cols {
			close(c.ready)
		}
	}()
	start := time.Now()
	if r.loadStates == nil {
		r.devs.each(func(d *device) {
			for _, c := range cols {
				if k, _ := c.cell(d.id); k == kUnset {
					record(c, d.id, d.state)
				}
			}
		})
		return
	}
	err := r.loadStates(context.WithoutCancel(ctx), func(rec DeviceRecord) error {
		d := r.devs.get(rec.ID)
		if d == nil {
			return nil
		}
		d.mu.Lock()
		for _, c := range cols {
			if k, _ := c.cell(d.id); k == kUnset {
				record(c, d.id, string(rec.State.State))
			}
		}
		d.mu.Unlock()
		return nil
	})
	if err != nil {
		r.log.Warn("indexing reported fields: reading states failed; devices not pushing since read as not reporting them", "err", err)
		return
	}
	r.log.Info("indexed reported fields from the store", "fields", len(cols), "took", time.Since(start).Round(time.Millisecond))
}

// Indexing says whether any state path is indexed: filters read reported
// fields, so other nodes need this node's pushed states (cluster mode).
func (r *labels) Indexing() bool {
	p := r.index.cols.Load()
	return p != nil && len(*p) > 0
}

// IndexedFields lists the indexed state paths.
func (r *labels) IndexedFields() []string {
	var out []string
	if p := r.index.cols.Load(); p != nil {
		for _, c := range *p {
			out = append(out, c.path)
		}
	}
	return out
}

// lookupJSON finds the value at segs in the JSON document raw (object
// members by name, the last of a repeated name as encoding/json does;
// array elements by position). It allocates only for member names with
// escapes.
func lookupJSON(raw string, segs []string) (string, bool) {
	var zero string
	i := skipWS(raw, 0)
	for _, seg := range segs {
		if i >= len(raw) {
			return zero, false
		}
		var ok bool
		switch raw[i] {
		case '{':
			i, ok = findMember(raw, i, seg)
		case '[':
			i, ok = findElem(raw, i, seg)
		}
		if !ok {
			return zero, false
		}
	}
	end, ok := skipValue(raw, i)
	if !ok || end == i {
		return zero, false
	}
	return raw[i:end], true
}

func skipWS(raw string, i int) int {
	for i < len(raw) && (raw[i] == ' ' || raw[i] == '\t' || raw[i] == '\n' || raw[i] == '\r') {
		i++
	}
	return i
}

// skipString returns the end of the string starting at i, and whether it
// has escapes.
func skipString(raw string, i int) (int, bool, bool) {
	for j := i + 1; j < len(raw); {
		k := strings.IndexByte(raw[j:], '"')
		if k < 0 {
			return 0, false, false
		}
		q := j + k
		bs := 0
		for b := q - 1; b > i && raw[b] == '\\'; b-- {
			bs++
		}
		if bs%2 == 0 {
			return q + 1, strings.IndexByte(raw[i+1:q], '\\') >= 0, true
		}
		j = q + 1
	}
	return 0, false, false
}

// skipValue returns the end of the value starting at i.
func skipValue(raw string, i int) (int, bool) {
	if i >= len(raw) {
		return 0, false
	}
	switch raw[i] {
	case '"':
		end, _, ok := skipString(raw, i)
		return end, ok
	case '{', '[':
		depth := 0
		for j := i; j < len(raw); j++ {
			switch raw[j] {
			case '"':
				end, _, ok := skipString(raw, j)
				if !ok {
					return 0, false
				}
				j = end - 1
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return j + 1, true
				}
			}
		}
		return 0, false
	}
	j := i
	for j < len(raw) && raw[j] != ',' && raw[j] != '}' && raw[j] != ']' && raw[j] != ' ' && raw[j] != '\t' && raw[j] != '\n' && raw[j] != '\r' {
		j++
	}
	return j, j > i
}

// findMember returns where the value of member name starts in the object
// at i.
func findMember(raw string, i int, name string) (int, bool) {
	at, found := 0, false
	i = skipWS(raw, i+1)
	if i < len(raw) && raw[i] == '}' {
		return 0, false
	}
	for i < len(raw) {
		if raw[i] != '"' {
			return 0, false
		}
		end, esc, ok := skipString(raw, i)
		if !ok {
			return 0, false
		}
		key := raw[i+1 : end-1]
		match := false
		if esc {
			var k string
			match = json.Unmarshal([]byte(raw[i:end]), &k) == nil && k == name
		} else {
			match = string(key) == name
		}
		i = skipWS(raw, end)
		if i >= len(raw) || raw[i] != ':' {
			return 0, false
		}
		i = skipWS(raw, i+1)
		if match {
			at, found = i, true
		}
		if i, ok = skipValue(raw, i); !ok {
			return 0, false
		}
		i = skipWS(raw, i)
		if i >= len(raw) {
			return 0, false
		}
		switch raw[i] {
		case ',':
			i = skipWS(raw, i+1)
		case '}':
			return at, found
		default:
			return 0, false
		}
	}
	return 0, false
}

// findElem returns where element pos (decimal digits) starts in the array
// at i.
func findElem(raw string, i int, pos string) (int, bool) {
	n := 0
	for k := 0; k < len(pos); k++ {
		if pos[k] < '0' || pos[k] > '9' || n > 1<<20 {
			return 0, false
		}
		n = n*10 + int(pos[k]-'0')
	}
	i = skipWS(raw, i+1)
	if i < len(raw) && raw[i] == ']' {
		return 0, false
	}
	for e := 0; i < len(raw); e++ {
		if e == n {
			return i, true
		}
		var ok bool
		if i, ok = skipValue(raw, i); !ok {
			return 0, false
		}
		i = skipWS(raw, i)
		if i >= len(raw) || raw[i] != ',' {
			return 0, false
		}
		i = skipWS(raw, i+1)
	}
	return 0, false
}
