package storetest

import (
	"slices"
	"testing"

	"github.com/drover/drover/internal/fleet"
)

// testLiveLabels: a label's filter is stored as given (any text), changed
// in place, and read back after a restart; a manual label has none.
func testLiveLabels(t *testing.T, h *handle) {
	ctx := testCtx(t)
	s := h.store
	const f1, f2 = `state.extra.site = "nörth 'x' \"q\"" and state.temperature >= 60`, `state.a.0 exists and label = "m"`
	for _, l := range []fleet.Label{{ID: 1, Name: "m"}, {ID: 2, Name: "hot", Filter: f1}, {ID: 3, Name: "other", Filter: "state.x missing"}} {
		if err := s.CreateLabel(ctx, l); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.SetLabelFilter(ctx, 3, f2); err != nil {
		t.Fatal(err)
	}
	s = h.reopen()
	labels, err := s.LoadLabels(ctx, func(uint64, uint16) error { return nil })
	want := []fleet.Label{{ID: 1, Name: "m"}, {ID: 2, Name: "hot", Filter: f1}, {ID: 3, Name: "other", Filter: f2}}
	if err != nil || !slices.Equal(labels, want) {
		t.Fatalf("labels after restart: %+v %v; want %+v", labels, err, want)
	}
}

// svcLiveLabels: a live label follows pushes, and after a restart its
// devices are those its filter selects on the stored states.
func svcLiveLabels(t *testing.T, e *env) {
	ctx := e.ctx
	var tokens []string
	for _, m := range []string{"a", "b", "c"} {
		tokens = append(tokens, e.register(m, "T", "1.0").Token)
	}
	for i, tok := range tokens {
		e.push(tok, pushReq(t, 1, 0, []string{"north", "south", "north"}[i]))
	}
	l, err := e.svc.DefineLabel(ctx, "north", `state.extra.note = north`)
	if err != nil || l.Devices != 2 {
		t.Fatalf("define: %+v %v", l, err)
	}
	e.push(tokens[0], pushReq(t, 2, 0, "east"))
	e.sync()
	e.restart()
	l, err = e.svc.Label("north")
	if err != nil || l.Devices != 1 || l.Filter != `state.extra.note = "north"` {
		t.Fatalf("after restart: %+v %v", l, err)
	}
	if got := e.svc.DeviceLabels(3); !slices.Equal(got, []string{"north"}) {
		t.Fatalf("device 3 after restart: %v", got)
	}
	e.push(tokens[1], pushReq(t, 2, 0, "north"))
	if got := e.svc.DeviceLabels(2); !slices.Equal(got, []string{"north"}) {
		t.Fatalf("device 2 after its push: %v", got)
	}
}
