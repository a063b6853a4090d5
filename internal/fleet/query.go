package fleet

import (
	"context"
	"encoding/base64"
	"sort"
	"strconv"
	"strings"
)

// SortBy is an order of the devices table.
type SortBy uint8

const (
	SortID SortBy = iota
	SortMachineID
	SortType
	SortFirmware
	SortLastSeen
	SortSyncState
)

var sortNames = [...]string{"id", "machine_id", "device_type", "firmware", "last_seen", "sync_state"}

func (s SortBy) String() string { return sortNames[s] }

// ParseSortBy accepts the names String returns.
func ParseSortBy(v string) (SortBy, bool) {
	for i, n := range sortNames {
		if n == v {
			return SortBy(i), true
		}
	}
	return 0, false
}

// Query asks for one page of devices in any order: the one way to list
// devices, for the API and the dashboard.
type Query struct {
	Filter Filter
	Sort   SortBy
	Desc   bool
	After  string // a Result.Next; "" for the first page
	Limit  int    // 1..1000, default 100
	// NoTotal leaves Result.Total 0; in ID order the page then costs its
	// own devices, not a pass over the whole fleet.
	NoTotal bool
}

// Result is one page; Next is "" on the last page (in ID order, the last
// device's ID). Total counts every device matching the filter.
type Result struct {
	Devices []Device `json:"devices"`
	Next    string   `json:"next_cursor,omitempty"`
	Total   int      `json:"total"`
}

// sortKey orders devices: by num, then str, then id.
type sortKey struct {
	num int64
	str string
	id  uint64
	d   *device
}

func (a *sortKey) less(b *sortKey) bool {
	if a.num != b.num {
		return a.num < b.num
	}
	if a.str != b.str {
		return a.str < b.str
	}
	return a.id < b.id
}

// keyOf computes d's key for by; d.mu held.
func keyOf(d *device, by SortBy) sortKey {
	k := sortKey{id: d.id, d: d}
	switch by {
	case SortMachineID:
		k.str = d.machineID()
	case SortType:
		k.str = d.deviceType
	case SortFirmware:
		k.str = d.firmware
	case SortLastSeen:
		k.num = d.lastSeen
	case SortSyncState:
		k.num = int64(d.syncState())
	}
	return k
}

func encodeCursor(k sortKey) string {
	s := strconv.FormatInt(k.num, 10) + "," + strconv.FormatUint(k.id, 10) + "," + k.str
	return base64.RawURLEncoding.EncodeToString([]byte(s))
}

func decodeCursor(c string) (sortKey, error) {
	b, err := base64.RawURLEncoding.DecodeString(c)
	if err != nil {
		return sortKey{}, ErrCursor
	}
	parts := strings.SplitN(string(b), ",", 3)
	if len(parts) != 3 {
		return sortKey{}, ErrCursor
	}
	var k sortKey
	if k.num, err = strconv.ParseInt(parts[0], 10, 64); err != nil {
		return sortKey{}, ErrCursor
	}
	if k.id, err = strconv.ParseUint(parts[1], 10, 64); err != nil {
		return sortKey{}, ErrCursor
	}
	k.str = parts[2]
	return k, nil
}

// keyHeap keeps the best limit+1 keys; its root is the worst kept.
type keyHeap struct {
	keys []sortKey
	desc bool
}

func (h *keyHeap) before(a, b *sortKey) bool {
	if h.desc {
		return b.less(a)
	}
	return a.less(b)
}

// worse orders the heap: the worst key first.
func (h *keyHeap) worse(i, j int) bool { return h.before(&h.keys[j], &h.keys[i]) }

func (h *keyHeap) push(k sortKey) {
	h.keys = append(h.keys, k)
	for i := len(h.keys) - 1; i > 0; {
		p := (i - 1) / 2
		if !h.worse(i, p) {
			break
		}
		h.keys[i], h.keys[p] = h.keys[p], h.keys[i]
		i = p
	}
}

// down restores the heap from the root.
func (h *keyHeap) down() {
	n := len(h.keys)
	for i := 0; ; {
		c := 2*i + 1
		if c >= n {
			return
		}
		if c+1 < n && h.worse(c+1, c) {
			c++
		}
		if !h.worse(c, i) {
			return
		}
		h.keys[i], h.keys[c] = h.keys[c], h.keys[i]
		i = c
	}
}

// Query returns one page of the devices matching q.Filter in q's order,
// with keyset paging: one pass over the registry, keeping only the page's
// keys, so that a page costs the same anywhere in a million devices.
func (s *Service) Query(q Query) (Result, error) {
	if q.Limit <= 0 || q.Limit > 1000 {
		q.Limit = 100
	}
	if q.Sort == SortID {
		return s.queryByID(q)
	}
	var after *sortKey
	if q.After != "" {
		k, err := decodeCursor(q.After)
		if err != nil {
			return Result{}, err
		}
		after = &k
	}
	now := s.now().UnixNano()
	h := &keyHeap{keys: make([]sortKey, 0, q.Limit+1), desc: q.Desc}
	total := 0
	s.each(func(d *device) {
		if !q.Filter.match(d, now) {
			return
		}
		total++
		k := keyOf(d, q.Sort)
		if after != nil && !h.before(after, &k) {
			return
		}
		if len(h.keys) <= q.Limit {
			h.push(k)
		} else if h.before(&k, &h.keys[0]) {
			h.keys[0] = k
			h.down()
		}
	})
	keys := h.keys
	sort.Slice(keys, func(i, j int) bool { return h.before(&keys[i], &keys[j]) })
	res := Result{Total: total, Devices: make([]Device, 0, min(len(keys), q.Limit))}
	if len(keys) > q.Limit {
		keys = keys[:q.Limit]
		res.Next = encodeCursor(keys[q.Limit-1])
	}
	for _, k := range keys {
		res.Devices = append(res.Devices, k.d.snapshot(now, false))
	}
	if q.NoTotal {
		return res.noTotal(), nil
	}
	return res, nil
}

// queryByID walks the registry, which is kept in ID order, from the cursor
// on; its cursor is the last ID of the page before.
func (s *Service) queryByID(q Query) (Result, error) {
	var after uint64
	if q.After != "" {
		var err error
		if after, err = strconv.ParseUint(q.After, 10, 64); err != nil {
			return Result{}, ErrCursor
		}
	}
	inPage := func(id uint64) bool {
		switch {
		case q.After == "":
			return true
		case q.Desc:
			return id < after
		default:
			return id > after
		}
	}
	now := s.now().UnixNano()
	s.devMu.RLock()
	all := s.devices
	s.devMu.RUnlock()
	// Without a total, start at the cursor.
	lo, hi := 0, len(all)-1
	if q.NoTotal && q.After != "" {
		if q.Desc {
			hi = int(min(after, uint64(len(all)))) - 1
		} else {
			lo = int(min(after, uint64(len(all))))
		}
	}
	res := Result{Devices: make([]Device, 0, min(q.Limit, 64))}
	for i := lo; i <= hi; i++ {
		id := uint64(i)
		if q.Desc {
			id = uint64(hi - (i - lo))
		}
		d := all[id]
		if d == nil {
			continue
		}
		d.mu.Lock()
		ok := d.profile != nil && q.Filter.match(d, now)
		d.mu.Unlock()
		if !ok {
			continue
		}
		res.Total++
		switch {
		case !inPage(id) || res.Next != "":
		case len(res.Devices) < q.Limit:
			res.Devices = append(res.Devices, d.snapshot(now, false))
		default: // one more after a full page
			res.Next = strconv.FormatUint(res.Devices[q.Limit-1].ID, 10)
			if q.NoTotal {
				return res.noTotal(), nil
			}
		}
	}
	if q.NoTotal {
		return res.noTotal(), nil
	}
	return res, nil
}

func (r Result) noTotal() Result {
	r.Total = 0
	return r
}

// DeviceInfo is the light view of a device that Scan gives.
type DeviceInfo struct {
	ID         uint64
	DeviceType string
	LastSeen   int64 // unix ns, 0: never pushed
	SyncState  SyncState
	Labels     []uint16 // read only
}

// Scan calls fn for every device, without copying states or allocating.
// fn must not call into the Service.
func (s *Service) Scan(fn func(DeviceInfo)) {
	s.each(func(d *device) {
		fn(DeviceInfo{ID: d.id, DeviceType: d.deviceType, LastSeen: d.lastSeen, SyncState: d.syncState(), Labels: d.labels})
	})
}

// ProfileSync counts each profile's devices by sync state.
func (s *Service) ProfileSync() map[uint64][4]int {
	out := map[uint64][4]int{}
	s.each(func(d *device) {
		id := d.profile.get().ID
		c := out[id]
		c[d.syncState()]++
		out[id] = c
	})
	return out
}

// DeviceTypes lists the device types and firmware versions in use.
func (s *Service) DeviceTypes() (types, firmware []string) {
	ts, fs := map[string]bool{}, map[string]bool{}
	for _, p := range s.Profiles() {
		ts[p.DeviceType], fs[p.Firmware] = true, true
	}
	for t := range ts {
		types = append(types, t)
	}
	for f := range fs {
		firmware = append(firmware, f)
	}
	sort.Strings(types)
	sort.Strings(firmware)
	return types, firmware
}

// Filter selects devices. Zero fields match everything.
type Filter struct {
	SyncState  *SyncState
	Liveness   *Liveness
	DeviceType string
	Firmware   string
	ProfileID  uint64
	Text       string   // substring of machine ID or serial
	Labels     []uint16 // label IDs (LabelIDs); a device must have all
	Admission  AdmissionFilter
	// Quota selects devices by quota (QuotaFilters); set by ParseFilter,
	// which resolves it.
	Quota    string
	quotaIDs map[uint64]struct{}
	// Where is an expression of the filter language (where.go), in its
	// canonical form; set by ParseFilter, which resolves it.
	Where string
	where *compiledWhere
}

func (f *Filter) match(d *device, now int64) bool {
	if f.DeviceType != "" && d.deviceType != f.DeviceType {
		return false
	}
	if f.Firmware != "" && d.firmware != f.Firmware {
		return false
	}
	if f.ProfileID != 0 && d.profile.get().ID != f.ProfileID {
		return false
	}
	if f.SyncState != nil && d.syncState() != *f.SyncState {
		return false
	}
	if f.Liveness != nil && d.liveness(now) != *f.Liveness {
		return false
	}
	if f.Text != "" && !strings.Contains(d.machineID(), f.Text) && !strings.Contains(d.serial(), f.Text) {
		return false
	}
	if len(f.Labels) > 0 && !d.hasLabels(f.Labels) {
		return false
	}
	if f.Quota != "" {
		if _, ok := f.quotaIDs[d.id]; !ok {
			return false
		}
	}
	if f.where != nil && !f.where.match(d) {
		return false
	}
	return f.Admission.match(d)
}

// Device returns one device with its current state.
func (s *Service) Device(ctx context.Context, id uint64) (Device, error) {
	d := s.get(id)
	if d == nil {
		return Device{}, ErrNotFound
	}
	snap := d.snapshot(s.now().UnixNano(), s.states == nil)
	if s.states != nil && snap.LastSeen != nil {
		st, err := s.states.DeviceState(ctx, id)
		if err != nil {
			return Device{}, err
		}
		snap.State = st
	}
	return snap, nil
}

// History reads a device's stored samples.
func (s *Service) History(ctx context.Context, id uint64, q HistoryQuery) ([]Sample, error) {
	if s.get(id) == nil {
		return nil, ErrNotFound
	}
	if s.store == nil {
		return []Sample{}, nil
	}
	return s.store.History(ctx, id, q)
}

// Stats counts devices by sync state and liveness.
type Stats struct {
	Devices  int            `json:"devices"`
	Sync     map[string]int `json:"sync"`
	Liveness map[string]int `json:"liveness"`
}

// Counts returns device counts by sync state and by liveness.
func (s *Service) Counts() (sync [4]int, live [4]int, total int) {
	now := s.now().UnixNano()
	s.each(func(d *device) {
		sync[d.syncState()]++
		live[d.liveness(now)]++
		total++
	})
	return sync, live, total
}

// Stats returns Counts with names.
func (s *Service) Stats() Stats {
	syncs, lives, total := s.Counts()
	st := Stats{Devices: total, Sync: map[string]int{}, Liveness: map[string]int{}}
	for _, v := range AllSyncStates() {
		st.Sync[v.String()] = syncs[v]
	}
	for _, v := range AllLiveness() {
		st.Liveness[v.String()] = lives[v]
	}
	return st
}
