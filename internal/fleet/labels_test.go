package fleet

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"
)

// memLabels is an in-memory LabelStore.
type memLabels struct {
	mu     sync.Mutex
	labels map[uint16]string
	assign map[[2]uint64]bool
	high   uint16 // highest label ID ever created
	fail   bool
	filter map[uint16]string
}

func newMemLabels() *memLabels {
	return &memLabels{labels: map[uint16]string{}, assign: map[[2]uint64]bool{}}
}

func (m *memLabels) LoadLabels(ctx context.Context, each func(uint64, uint16) error) ([]Label, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []Label
	for id, n := range m.labels {
		out = append(out, Label{ID: id, Name: n, Filter: m.filter[id]})
	}
	for k := range m.assign {
		if err := each(k[0], uint16(k[1])); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func (m *memLabels) CreateLabel(ctx context.Context, l Label) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fail {
		return errors.New("disk on fire")
	}
	m.labels[l.ID] = l.Name
	m.high = max(m.high, l.ID)
	if l.Filter != "" {
		if m.filter == nil {
			m.filter = map[uint16]string{}
		}
		m.filter[l.ID] = l.Filter
	}
	return nil
}

func (m *memLabels) SetLabelFilter(ctx context.Context, id uint16, filter string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fail {
		return errors.New("disk on fire")
	}
	if m.filter == nil {
		m.filter = map[uint16]string{}
	}
	m.filter[id] = filter
	return nil
}

func (m *memLabels) MaxLabelID(ctx context.Context) (uint16, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.high, nil
}

func (m *memLabels) DeleteLabel(ctx context.Context, id uint16) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.labels, id)
	delete(m.filter, id)
	for k := range m.assign {
		if k[1] == uint64(id) {
			delete(m.assign, k)
		}
	}
	return nil
}

func (m *memLabels) AssignLabel(ctx context.Context, id uint16, devs []uint64, on bool) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fail {
		return errors.New("disk on fire")
	}
	for _, d := range devs {
		if on {
			m.assign[[2]uint64{d, uint64(id)}] = true
		} else {
			delete(m.assign, [2]uint64{d, uint64(id)})
		}
	}
	return nil
}

// newLabelService is newService with labels kept in ls.
func newLabelService(t *testing.T, st *recStore, ls *memLabels) *Service {
	t.Helper()
	wt := NewWriteThrough(st, 0, nil)
	t.Cleanup(func() { wt.Close(context.Background()) })
	s, err := New(context.Background(), Stores{Devices: st, Labels: ls}, wt, Options{EnrollmentSecret: "sesame", DefaultPushInterval: 100})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestLabelsAssignFilterAndRestart(t *testing.T) {
	ctx := context.Background()
	st := newRecStore()
	ls := newMemLabels()
	s := newLabelService(t, st, ls)
	for i := range 30 {
		r, err := s.Register(ctx, reg(fmt.Sprintf("m-%02d", i)))
		if err != nil {
			t.Fatal(err)
		}
		if i < 10 {
			s.Push(ctx, r.Token, push(1, 0))
		}
	}
	// "m-1x" are devices 11..20.
	n, err := s.AssignLabel(ctx, "north", Filter{Text: "m-1"}, false)
	if err != nil || n != 10 {
		t.Fatalf("assign: %d %v", n, err)
	}
	if n, _ := s.AssignLabel(ctx, "north", Filter{Text: "m-1"}, false); n != 0 {
		t.Fatalf("second assign changed %d devices", n)
	}
	synced := Synchronized
	if n, _ := s.AssignLabel(ctx, "pushed", Filter{SyncState: &synced}, false); n != 10 {
		t.Fatalf("assign by state: %d", n)
	}
	both := page(t, s, Filter{Labels: s.LabelIDs([]string{"north", "pushed"})}, "", 100)
	if len(both.Devices) != 0 {
		t.Fatalf("north and pushed: %d devices", len(both.Devices))
	}
	north := page(t, s, Filter{Labels: s.LabelIDs([]string{"north"})}, "", 100)
	if len(north.Devices) != 10 || north.Devices[0].MachineID != "m-10" {
		t.Fatalf("north: %+v", north.Devices)
	}
	if got := page(t, s, Filter{Labels: s.LabelIDs([]string{"nope"})}, "", 100); len(got.Devices) != 0 {
		t.Fatalf("unknown label matched %d", len(got.Devices))
	}
	if got := s.DeviceLabels(north.Devices[0].ID); !slices.Equal(got, []string{"north"}) {
		t.Fatalf("device labels %v", got)
	}
	if n, err := s.AssignLabel(ctx, "north", Filter{Text: "m-15"}, true); err != nil || n != 1 {
		t.Fatalf("remove: %d %v", n, err)
	}
	labels := s.Labels()
	if len(labels) != 2 || labels[0].Name != "north" || labels[0].Devices != 9 || labels[1].Devices != 10 {
		t.Fatalf("labels %+v", labels)
	}
	if _, err := s.CreateLabel(ctx, "bad,name"); !errors.Is(err, ErrLabelName) {
		t.Fatalf("bad name: %v", err)
	}
	// A store failure changes nothing in memory.
	ls.fail = true
	if _, err := s.AssignLabel(ctx, "north", Filter{}, false); err == nil {
		t.Fatal("assign with a failing store succeeded")
	}
	ls.fail = false
	if got := s.Labels(); got[0].Devices != 9 {
		t.Fatalf("after failed assign: %+v", got)
	}

	// Restart: labels come back from the stores.
	s2 := newLabelService(t, st, ls)
	if got := s2.Labels(); len(got) != 2 || got[0].Devices != 9 || got[1].Devices != 10 {
		t.Fatalf("after restart %+v", got)
	}
	if err := s2.DeleteLabel(ctx, "north"); err != nil {
		t.Fatal(err)
	}
	if got := page(t, s2, Filter{Labels: s2.LabelIDs([]string{"north"})}, "", 100); len(got.Devices) != 0 {
		t.Fatalf("deleted label still matches %d", len(got.Devices))
	}
	if l, _ := s2.CreateLabel(ctx, "again"); l.ID != 3 {
		t.Fatalf("new label reused an ID: %+v", l)
	}
}

func TestQuerySortAndPaging(t *testing.T) {
	ctx := context.Background()
	s, clk, _ := newService(t, newRecStore())
	const n = 57
	for i := range n {
		r, err := s.Register(ctx, reg(fmt.Sprintf("m-%03d", (i*37)%n)))
		if err != nil {
			t.Fatal(err)
		}
		if i%3 != 0 {
			clk.add(time.Second)
			s.Push(ctx, r.Token, push(1, 0))
		}
	}
	for _, tc := range []struct {
		by   SortBy
		desc bool
		less func(a, b Device) bool
	}{
		{SortID, false, func(a, b Device) bool { return a.ID < b.ID }},
		{SortID, true, func(a, b Device) bool { return a.ID > b.ID }},
		{SortMachineID, false, func(a, b Device) bool { return a.MachineID < b.MachineID }},
		{SortMachineID, true, func(a, b Device) bool { return a.MachineID > b.MachineID }},
		{SortLastSeen, true, func(a, b Device) bool {
			ta, tb := seen(a), seen(b)
			return ta > tb || ta == tb && a.ID > b.ID
		}},
		{SortSyncState, false, func(a, b Device) bool {
			return a.SyncState < b.SyncState || a.SyncState == b.SyncState && a.ID < b.ID
		}},
	} {
		t.Run(fmt.Sprintf("%s desc=%v", tc.by, tc.desc), func(t *testing.T) {
			var got []Device
			after := ""
			for pages := 0; ; pages++ {
				r, err := s.Query(Query{Sort: tc.by, Desc: tc.desc, After: after, Limit: 10})
				if err != nil {
					t.Fatal(err)
				}
				if r.Total != n {
					t.Fatalf("total %d", r.Total)
				}
				got = append(got, r.Devices...)
				if r.Next == "" {
					break
				}
				if pages > 10 {
					t.Fatal("paging does not end")
				}
				after = r.Next
			}
			if len(got) != n {
				t.Fatalf("%d devices over all pages", len(got))
			}
			for i := 1; i < n; i++ {
				if !tc.less(got[i-1], got[i]) {
					t.Fatalf("out of order at %d: %+v then %+v", i, got[i-1], got[i])
				}
			}
			// Without the total, the same pages.
			after = ""
			for i := 0; ; i += 10 {
				r, err := s.Query(Query{Sort: tc.by, Desc: tc.desc, After: after, Limit: 10, NoTotal: true})
				if err != nil || r.Total != 0 || len(r.Devices) != min(10, n-i) {
					t.Fatalf("no total, page at %d: %d devices, total %d, %v", i, len(r.Devices), r.Total, err)
				}
				for j, d := range r.Devices {
					if d.ID != got[i+j].ID {
						t.Fatalf("no total: device %d is %d, with the total %d", i+j, d.ID, got[i+j].ID)
					}
				}
				if r.Next == "" {
					if i+len(r.Devices) != n {
						t.Fatalf("no total: paging ended after %d devices", i+len(r.Devices))
					}
					break
				}
				after = r.Next
			}
		})
	}
	arriving := Arriving
	r, err := s.Query(Query{Filter: Filter{SyncState: &arriving}, Limit: 5})
	if err != nil || r.Total != 19 || len(r.Devices) != 5 || r.Next == "" {
		t.Fatalf("filtered: total %d, %d devices, next %q, %v", r.Total, len(r.Devices), r.Next, err)
	}
	if _, err := s.Query(Query{After: "!!"}); !errors.Is(err, ErrCursor) {
		t.Fatalf("bad cursor: %v", err)
	}
	ps := s.ProfileSync()
	if len(ps) != 1 {
		t.Fatalf("profile sync %v", ps)
	}
	for _, c := range ps {
		if c[Arriving] != 19 || c[Synchronized] != 38 {
			t.Fatalf("profile sync %v", c)
		}
	}
	var scanned []uint64
	s.Scan(func(d DeviceInfo) { scanned = append(scanned, d.ID) })
	if len(scanned) != n || !sort.SliceIsSorted(scanned, func(i, j int) bool { return scanned[i] < scanned[j] }) {
		t.Fatalf("scan gave %d devices", len(scanned))
	}
}

func seen(d Device) int64 {
	if d.LastSeen == nil {
		return 0
	}
	return d.LastSeen.UnixNano()
}

func BenchmarkQueryMillion(b *testing.B) {
	ctx := context.Background()
	s, err := New(ctx, Stores{}, nil, Options{EnrollmentSecret: "sesame"})
	if err != nil {
		b.Fatal(err)
	}
	for i := range 1_000_000 {
		r := reg(fmt.Sprintf("machine-%07d", i))
		if i%2 == 0 {
			r.Firmware = "7.0.1"
		}
		if _, err := s.Register(ctx, r); err != nil {
			b.Fatal(err)
		}
	}
	for _, bc := range []struct {
		name string
		q    Query
	}{
		{"first-page", Query{Limit: 50}},
		{"by-machine-desc", Query{Sort: SortMachineID, Desc: true, Limit: 50}},
		{"filtered-text", Query{Filter: Filter{Text: "machine-09999"}, Limit: 50}},
		{"filtered-firmware", Query{Filter: Filter{Firmware: "7.0.1"}, Sort: SortLastSeen, Limit: 50}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			for b.Loop() {
				if _, err := s.Query(bc.q); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	// What every scrape of /metrics walks.
	b.Run("counts", func(b *testing.B) {
		for b.Loop() {
			s.Counts()
		}
	})
	b.Run("admission-counts", func(b *testing.B) {
		for b.Loop() {
			s.AdmissionCounts()
		}
	})
}
