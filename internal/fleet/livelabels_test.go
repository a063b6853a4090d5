package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/internal/protocol"
)

// pushRaw is a push reporting the state raw.
func pushRaw(seq uint64, raw string) protocol.PushRequest {
	p := protocol.PushRequest{Seq: seq, RawState: json.RawMessage(raw)}
	if err := json.Unmarshal(p.RawState, &p.State); err != nil {
		panic(err)
	}
	return p
}

// states is a StateReader over a recStore: states out of memory, as in
// write-through mode.
type states struct{ st *recStore }

func (r states) DeviceState(ctx context.Context, id uint64) (json.RawMessage, error) {
	r.st.mu.Lock()
	defer r.st.mu.Unlock()
	return r.st.states[id].State, nil
}

// members lists the machine IDs carrying label, sorted.
func members(t *testing.T, s *Service, label string) []string {
	t.Helper()
	var out []string
	for _, d := range page(t, s, Filter{Labels: s.LabelIDs([]string{label})}, "", 1000).Devices {
		out = append(out, d.MachineID)
	}
	slices.Sort(out)
	return out
}

func labelNamed(s *Service, name string) Label {
	for _, l := range s.Labels() {
		if l.Name == name {
			return l
		}
	}
	return Label{}
}

func TestLiveLabelsFollowDevices(t *testing.T) {
	ctx := context.Background()
	st := newRecStore()
	ls := newMemLabels()
	s := newLabelService(t, st, ls)
	tokens := map[string]string{}
	seq := uint64(0)
	pushAs := func(s *Service, m, raw string) {
		t.Helper()
		seq++
		if _, err := s.Push(ctx, tokens[m], pushRaw(seq, raw)); err != nil {
			t.Fatal(err)
		}
	}
	for _, m := range []string{"a", "b", "c", "d"} {
		r, err := s.Register(ctx, reg(m))
		if err != nil {
			t.Fatal(err)
		}
		tokens[m] = r.Token
	}
	pushAs(s, "a", `{"temperature":70,"extra":{"site":"north"}}`)
	pushAs(s, "b", `{"temperature":40,"extra":{"site":"north"}}`)
	pushAs(s, "c", `{"temperature":80,"extra":{"site":"south"}}`)

	l, err := s.DefineLabel(ctx, "hot-north", `state.extra.site = north and state.temperature >= 60`)
	if err != nil || l.Devices != 1 || l.Filter != `state.extra.site = "north" and state.temperature >= 60` {
		t.Fatalf("define: %+v %v", l, err)
	}
	if got := members(t, s, "hot-north"); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("members %v", got)
	}
	// A push joins, another leaves.
	pushAs(s, "b", `{"temperature":65,"extra":{"site":"north"}}`)
	pushAs(s, "a", `{"temperature":50,"extra":{"site":"north"}}`)
	if got := members(t, s, "hot-north"); !slices.Equal(got, []string{"b"}) {
		t.Fatalf("after pushes: %v", got)
	}
	if got := s.DeviceLabels(page(t, s, Filter{Text: "b"}, "", 1).Devices[0].ID); !slices.Equal(got, []string{"hot-north"}) {
		t.Fatalf("device labels %v", got)
	}
	// The devices filter reads reported fields too.
	f, err := s.ParseFilter(url.Values{FilterWhere: {`state.temperature > 60`, `state.extra.site != north`}})
	if err != nil || f.Where != `state.temperature > 60 and state.extra.site != "north"` {
		t.Fatalf("parse filter: %+v %v", f, err)
	}
	if got := page(t, s, f, "", 10).Devices; len(got) != 1 || got[0].MachineID != "c" {
		t.Fatalf("where: %+v", got)
	}
	if _, err := s.ParseFilter(url.Values{FilterWhere: {`state.temperature >`}}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("bad where: %v", err)
	}

	// Manual labels stay manual; a live label may name them.
	if _, err := s.AssignLabel(ctx, "vip", Filter{Text: "c"}, false); err != nil {
		t.Fatal(err)
	}
	if _, err := s.DefineLabel(ctx, "vip-hot", `label = vip and state.temperature > 50`); err != nil {
		t.Fatal(err)
	}
	if got := members(t, s, "vip-hot"); !slices.Equal(got, []string{"c"}) {
		t.Fatalf("vip-hot %v", got)
	}
	if _, err := s.AssignLabel(ctx, "vip", Filter{Text: "b"}, false); err != nil { // b is at 65
		t.Fatal(err)
	}
	if got := members(t, s, "vip-hot"); !slices.Equal(got, []string{"b", "c"}) {
		t.Fatalf("vip-hot after assigning vip to b: %v", got)
	}
	if _, err := s.AssignLabel(ctx, "vip-hot", Filter{}, false); !errors.Is(err, ErrLabelLive) {
		t.Fatalf("manual assignment of a live label: %v", err)
	}
	if _, err := s.DefineLabel(ctx, "vip", `state.cpu > 1`); !errors.Is(err, ErrLabelLive) {
		t.Fatalf("defining a manual label: %v", err)
	}
	if err := s.DeleteLabel(ctx, "vip"); !errors.Is(err, ErrLabelInUse) {
		t.Fatalf("deleting a named label: %v", err)
	}
	for _, bad := range []string{`label = nope`, `label = hot-x`, `state.temperature >`} {
		if _, err := s.DefineLabel(ctx, "hot-x", bad); !errors.Is(err, ErrInvalid) {
			t.Fatalf("define %q: %v", bad, err)
		}
	}
	// A live label names only live labels made before it.
	if _, err := s.DefineLabel(ctx, "hot-north", `label = vip-hot`); !errors.Is(err, ErrInvalid) {
		t.Fatalf("naming a later live label: %v", err)
	}

	// Registration and firmware: registry fields.
	if _, err := s.DefineLabel(ctx, "fw7", `firmware prefix 7. and device_type = ICR-3241`); err != nil {
		t.Fatal(err)
	}
	if got := members(t, s, "fw7"); len(got) != 0 {
		t.Fatalf("fw7 %v", got)
	}
	p := pushRaw(100, `{"firmware":"7.0.1","temperature":1}`)
	if _, err := s.Push(ctx, tokens["d"], p); err != nil {
		t.Fatal(err)
	}
	if got := members(t, s, "fw7"); !slices.Equal(got, []string{"d"}) {
		t.Fatalf("fw7 after d moved to 7.0.1: %v", got)
	}
	r := reg("e")
	r.Firmware = "7.2"
	if _, err := s.Register(ctx, r); err != nil {
		t.Fatal(err)
	}
	if got := members(t, s, "fw7"); !slices.Equal(got, []string{"d", "e"}) {
		t.Fatalf("fw7 after e registered on 7.2: %v", got)
	}

	// A changed filter takes effect at once.
	if l, err := s.DefineLabel(ctx, "hot-north", `state.temperature >= 60`); err != nil || l.Devices != 2 {
		t.Fatalf("redefine: %+v %v", l, err)
	}

	// Restart: definitions from the store, membership from the states.
	s2 := newLabelService(t, st, ls)
	for _, c := range []struct {
		label string
		want  []string
	}{{"hot-north", []string{"b", "c"}}, {"vip-hot", []string{"b", "c"}}, {"fw7", []string{"d", "e"}}, {"vip", []string{"b", "c"}}} {
		if got := members(t, s2, c.label); !slices.Equal(got, c.want) {
			t.Errorf("after restart, %s: %v; want %v", c.label, got, c.want)
		}
	}
	if l := labelNamed(s2, "hot-north"); l.Filter != "state.temperature >= 60" || l.Devices != 2 {
		t.Errorf("after restart: %+v", l)
	}

	// Deleting a live label drops it from every device and the index
	// keeps answering.
	if err := s2.DeleteLabel(ctx, "vip-hot"); err != nil {
		t.Fatal(err)
	}
	if err := s2.DeleteLabel(ctx, "vip"); err != nil {
		t.Fatal(err)
	}
	if got := members(t, s2, "vip-hot"); len(got) != 0 {
		t.Fatalf("deleted live label: %v", got)
	}
}

// TestLiveLabelsStatesInStore: with states kept out of memory (write
// through), the index is filled from the store, then kept by pushes.
func TestLiveLabelsStatesInStore(t *testing.T) {
	ctx := context.Background()
	st := newRecStore()
	ls := newMemLabels()
	open := func() *Service {
		wt := NewWriteThrough(st, 0, nil)
		t.Cleanup(func() { wt.Close(context.Background()) })
		s, err := New(ctx, Stores{Devices: st, States: states{st}, Labels: ls}, wt, Options{EnrollmentSecret: "sesame", DefaultPushInterval: 100})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	s := open()
	var tokens []string
	for i := range 6 {
		r, err := s.Register(ctx, reg(fmt.Sprintf("m%d", i)))
		if err != nil {
			t.Fatal(err)
		}
		tokens = append(tokens, r.Token)
		if _, err := s.Push(ctx, r.Token, pushRaw(1, fmt.Sprintf(`{"extra":{"zone":"z%d"},"cpu":%d}`, i%2, i*10))); err != nil {
			t.Fatal(err)
		}
	}
	if s.states == nil || s.get(1).state != "" {
		t.Fatal("states are in memory")
	}
	// A path not indexed yet is read from the store.
	f, err := s.ParseFilter(url.Values{FilterWhere: {`state.extra.zone = z1 and state.cpu >= 30`}})
	if err != nil {
		t.Fatal(err)
	}
	if got := page(t, s, f, "", 10).Devices; len(got) != 2 || got[0].MachineID != "m3" || got[1].MachineID != "m5" {
		t.Fatalf("where on stored states: %+v", got)
	}
	if got := s.IndexedFields(); !slices.Equal(got, []string{"cpu", "extra.zone"}) {
		t.Fatalf("indexed %v", got)
	}
	if _, err := s.DefineLabel(ctx, "zone0", `state.extra.zone = z0`); err != nil {
		t.Fatal(err)
	}
	if got := members(t, s, "zone0"); !slices.Equal(got, []string{"m0", "m2", "m4"}) {
		t.Fatalf("zone0 %v", got)
	}
	if _, err := s.Push(ctx, tokens[0], pushRaw(2, `{"extra":{"zone":"z1"}}`)); err != nil {
		t.Fatal(err)
	}
	if got := members(t, s, "zone0"); !slices.Equal(got, []string{"m2", "m4"}) {
		t.Fatalf("zone0 after m0 moved: %v", got)
	}
	s2 := open()
	if got := members(t, s2, "zone0"); !slices.Equal(got, []string{"m2", "m4"}) {
		t.Fatalf("zone0 after a restart: %v", got)
	}
}

// TestNoteReportedAllocates nothing: the push's hook, with indexed fields
// and live labels, when membership does not change.
func TestNoteReportedAllocs(t *testing.T) {
	ctx := context.Background()
	s, _, _ := newService(t, newRecStore())
	r, err := s.Register(ctx, reg("m"))
	if err != nil {
		t.Fatal(err)
	}
	raw := []byte(`{"uptime":100,"cpu":12.5,"extra":{"site":"north","rack":"r1"},"interfaces":[{"name":"eth0","rx_bytes":1}]}`)
	if _, err := s.Push(ctx, r.Token, pushRaw(1, string(raw))); err != nil {
		t.Fatal(err)
	}
	for i, expr := range []string{`state.extra.site = north`, `state.cpu > 10 and firmware prefix 6`, `state.interfaces.0.name = eth0 and label = l0`} {
		if _, err := s.DefineLabel(ctx, fmt.Sprintf("l%d", i), expr); err != nil {
			t.Fatal(err)
		}
	}
	d := s.get(1)
	if got := s.DeviceLabels(1); len(got) != 3 {
		t.Fatalf("labels %v", got)
	}
	if n := testing.AllocsPerRun(100, func() {
		d.mu.Lock()
		s.noteReported(d, raw)
		d.mu.Unlock()
	}); n != 0 {
		t.Fatalf("noteReported allocates %v times", n)
	}
}

// FuzzLiveLabelSequence runs sequences of operations (define a live
// label, push a state, assign a manual label, restart) and checks every
// device's live labels against an evaluation of the filters with
// encoding/json on the last pushed states.
func FuzzLiveLabelSequence(f *testing.F) {
	f.Add([]byte{0, 1, 1, 2, 3, 4, 0, 5, 2, 9, 7})
	f.Add([]byte("live labels follow pushes"))
	exprs := []string{
		`state.v > 50`, `state.extra.site = north`, `state.extra.site prefix no and state.v <= 70`,
		`state.list.1 exists`, `state.v missing`, `label = m and state.v != 10`, `state.ok = true`,
		`state.extra.site contains r`, `serial missing and state.v >= 0`,
	}
	docs := []string{
		`{"v":60,"extra":{"site":"north"}}`, `{"v":10}`, `{"extra":{"site":"south"},"list":[1,2]}`,
		`{"v":"70","ok":true}`, `{}`, `{"v":70.0,"extra":{"site":"nord"},"ok":false}`, `{"v":null,"list":[]}`,
	}
	f.Fuzz(func(t *testing.T, ops []byte) {
		if len(ops) > 64 {
			ops = ops[:64]
		}
		ctx := context.Background()
		st := newRecStore()
		ls := newMemLabels()
		s := newLabelService(t, st, ls)
		const n = 4
		var tokens []string
		for i := range n {
			r, err := s.Register(ctx, reg(fmt.Sprintf("d%d", i)))
			if err != nil {
				t.Fatal(err)
			}
			tokens = append(tokens, r.Token)
		}
		if _, err := s.CreateLabel(ctx, "m"); err != nil {
			t.Fatal(err)
		}
		last := make([]string, n)
		manual := make([]bool, n)
		defs := map[string]string{}
		seq := uint64(0)
		for i := 0; i+1 < len(ops); i += 2 {
			a, b := ops[i], int(ops[i+1])
			switch a % 4 {
			case 0:
				name := fmt.Sprintf("g%d", b%3)
				if _, err := s.DefineLabel(ctx, name, exprs[b%len(exprs)]); err != nil {
					t.Fatal(err)
				}
				defs[name] = exprs[b%len(exprs)]
			case 1:
				dev := b % n
				seq++
				if _, err := s.Push(ctx, tokens[dev], pushRaw(seq, docs[(b/n)%len(docs)])); err != nil {
					t.Fatal(err)
				}
				last[dev] = docs[(b/n)%len(docs)]
			case 2:
				dev := b % n
				_, err := s.AssignLabel(ctx, "m", Filter{Text: fmt.Sprintf("d%d", dev)}, manual[dev])
				if err != nil {
					t.Fatal(err)
				}
				manual[dev] = !manual[dev]
			case 3:
				s = newLabelService(t, st, ls)
			}
		}
		for dev := range n {
			got := s.DeviceLabels(uint64(dev + 1))
			var want []string
			if manual[dev] {
				want = append(want, "m")
			}
			for name, expr := range defs {
				w, _ := ParseWhere(expr)
				ok := true
				for _, c := range w.conds {
					switch c.field {
					case wState:
						doc := last[dev]
						if doc == "" {
							doc = "{}"
						}
						ok = ok && oracleMatch(c, doc)
					case wLabel:
						ok = ok && manual[dev] == (c.op == opEq)
					case wSerial:
						ok = ok && c.op == opMissing
					}
				}
				if ok {
					want = append(want, name)
				}
			}
			slices.Sort(want)
			if !slices.Equal(got, want) {
				t.Fatalf("device %d (state %s, manual %v): labels %v; want %v (%s)", dev, last[dev], manual[dev], got, want, strings.Join(ops2str(ops), " "))
			}
		}
	})
}

func ops2str(ops []byte) []string {
	var out []string
	for _, o := range ops {
		out = append(out, fmt.Sprint(o))
	}
	return out
}

// TestLiveLabelsAdoptedFromAnotherNode: a node reading labels back after
// a change log entry (ApplyChange) takes another node's live label, and
// other nodes' pushes (ApplyStates) move devices in and out of it.
func TestLiveLabelsAdoptedFromAnotherNode(t *testing.T) {
	ctx := context.Background()
	st := newRecStore()
	ls := newMemLabels()
	a := newLabelService(t, st, ls)
	var tokens []string
	for i := range 3 {
		r, err := a.Register(ctx, reg(fmt.Sprintf("n%d", i)))
		if err != nil {
			t.Fatal(err)
		}
		tokens = append(tokens, r.Token)
		if _, err := a.Push(ctx, r.Token, pushRaw(1, fmt.Sprintf(`{"extra":{"rack":"r%d"}}`, i))); err != nil {
			t.Fatal(err)
		}
	}
	b := newLabelService(t, st, ls) // the other node, loaded from the same stores
	if _, err := a.DefineLabel(ctx, "rack1", `state.extra.rack = r1`); err != nil {
		t.Fatal(err)
	}
	if got := members(t, b, "rack1"); len(got) != 0 {
		t.Fatalf("b knows rack1 before reading labels back: %v", got)
	}
	if err := b.ApplyChange(ctx, Change{Kind: ChangeLabels, ID: 1}); err != nil {
		t.Fatal(err)
	}
	if got := members(t, b, "rack1"); !slices.Equal(got, []string{"n1"}) {
		t.Fatalf("b after the change: %v", got)
	}
	if l := labelNamed(b, "rack1"); l.Filter != `state.extra.rack = "r1"` {
		t.Fatalf("b's label: %+v", l)
	}
	// n0 pushes to a; b hears of it through the pushes a shares.
	now := time.Now()
	b.ApplyStates([]StateRecord{{DeviceID: 1, LastSeen: now, Seq: 2, State: json.RawMessage(`{"extra":{"rack":"r1"}}`)},
		{DeviceID: 2, LastSeen: now, Seq: 2, State: json.RawMessage(`{"extra":{"rack":"r9"}}`)}})
	if got := members(t, b, "rack1"); !slices.Equal(got, []string{"n0"}) {
		t.Fatalf("b after other nodes' pushes: %v", got)
	}
	// A push summary without its state (the sender indexes nothing)
	// leaves what b knows of the reported fields.
	b.ApplyStates([]StateRecord{{DeviceID: 1, LastSeen: now.Add(time.Second), Seq: 3}})
	if got := members(t, b, "rack1"); !slices.Equal(got, []string{"n0"}) {
		t.Fatalf("b after a push without its state: %v", got)
	}
	// A changed filter reaches b the same way.
	if _, err := a.DefineLabel(ctx, "rack1", `state.extra.rack prefix r`); err != nil {
		t.Fatal(err)
	}
	if err := b.ApplyChange(ctx, Change{Kind: ChangeLabels, ID: 1}); err != nil {
		t.Fatal(err)
	}
	if got := members(t, b, "rack1"); len(got) != 3 {
		t.Fatalf("b after the filter changed: %v", got)
	}
}
