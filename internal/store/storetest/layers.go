package storetest

import (
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/drover/drover/internal/fleet"
)

// testConfigLayers: layer revisions are numbered per layer (also when
// added at once), kept bytes-exact across a restart; the newest revision
// is the layer's values unless it is a deletion.
func testConfigLayers(t *testing.T, h *handle) {
	ctx := testCtx(t)
	s := h.store
	if got, err := s.LoadConfigLayers(ctx); err != nil || len(got) != 0 {
		t.Fatalf("empty store: %+v %v", got, err)
	}
	at := time.Unix(1_700_000_000, 123_000_000).UTC()
	label := "Nörth 😀 'x'"
	add := func(c fleet.ConfigLayer) fleet.ConfigLayer {
		t.Helper()
		c.At = at
		got, err := s.AddLayerRevision(ctx, c)
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	tricky := `{"a":"it's \"q\" \\ ü😀","n":1.50,"x":[1,2]}`
	if r := add(fleet.ConfigLayer{Kind: fleet.LayerDevice, Name: "7", Values: json.RawMessage(`{"a":1}`), By: "alice", Note: "set"}); r.Rev != 1 {
		t.Fatalf("first revision %+v", r)
	}
	add(fleet.ConfigLayer{Kind: fleet.LayerDevice, Name: "7", Values: json.RawMessage(tricky), By: "Zoë", Note: "set"})
	add(fleet.ConfigLayer{Kind: fleet.LayerLabel, Name: label, Priority: -3, Values: json.RawMessage(`{"b":true}`), Note: "set"})
	add(fleet.ConfigLayer{Kind: fleet.LayerLabel, Name: "gone", Values: json.RawMessage(`{"c":1}`), Note: "set"})
	if r := add(fleet.ConfigLayer{Kind: fleet.LayerLabel, Name: "gone", Deleted: true, Note: "deleted"}); r.Rev != 2 || string(r.Values) != "null" {
		t.Fatalf("deletion %+v", r)
	}
	add(fleet.ConfigLayer{Kind: fleet.LayerSchema, Name: "rut-x11", Values: json.RawMessage(`{"type":"object"}`), Note: "set"})
	// Writers at once: each revision gets its own number.
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := s.AddLayerRevision(ctx, fleet.ConfigLayer{Kind: fleet.LayerDevice, Name: "8", Values: json.RawMessage(`{}`), At: at}); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()

	s = h.reopen()
	cur, err := s.LoadConfigLayers(ctx)
	if err != nil || len(cur) != 4 {
		t.Fatalf("current layers: %+v %v", cur, err)
	}
	byKey := map[string]fleet.ConfigLayer{}
	for _, c := range cur {
		byKey[string(c.Kind)+" "+c.Name] = c
	}
	d := byKey["device 7"]
	if d.Rev != 2 || string(d.Values) != tricky || d.By != "Zoë" || !d.At.Equal(at) || d.Note != "set" || d.Deleted {
		t.Errorf("device layer %+v", d)
	}
	if l := byKey["label "+label]; l.Rev != 1 || l.Priority != -3 || string(l.Values) != `{"b":true}` {
		t.Errorf("label layer %+v", l)
	}
	if _, ok := byKey["label gone"]; ok {
		t.Error("a deleted layer was loaded")
	}
	if sc := byKey["schema rut-x11"]; string(sc.Values) != `{"type":"object"}` {
		t.Errorf("schema %+v", sc)
	}
	if d8 := byKey["device 8"]; d8.Rev != 4 {
		t.Errorf("concurrent revisions: newest %+v, want rev 4", d8)
	}
	revs, err := s.LayerRevisions(ctx, fleet.LayerLabel, "gone")
	if err != nil || len(revs) != 2 || revs[0].Rev != 1 || !revs[1].Deleted || revs[1].Note != "deleted" {
		t.Fatalf("revisions %+v %v", revs, err)
	}
	if none, err := s.LayerRevisions(ctx, fleet.LayerDevice, "99"); err != nil || len(none) != 0 {
		t.Fatalf("no revisions: %+v %v", none, err)
	}
}

// svcConfigLayers: a device's and a label's values survive a restart of
// the fleet on the store, with the same effective configuration and
// version, and their history.
func svcConfigLayers(t *testing.T, e *env) {
	r := e.register("m-layers", "rut-x11", "7.04.2")
	if _, err := e.svc.AssignLabel(e.ctx, "site=north", fleet.Filter{Text: "m-layers"}, false); err != nil {
		t.Fatal(err)
	}
	put := func(kind fleet.LayerKind, name, values string) {
		t.Helper()
		if _, _, err := e.svc.PutConfigLayer(e.ctx, kind, name, fleet.LayerUpdate{Values: json.RawMessage(values), By: "alice"}); err != nil {
			t.Fatal(err)
		}
	}
	put(fleet.LayerLabel, "site=north", `{"apn":"north.iot","log":{"level":"info"}}`)
	put(fleet.LayerDevice, r.DeviceID, `{"log":{"level":"debug"},"name":"${device.serial}@${label.site}"}`)
	put(fleet.LayerDevice, r.DeviceID, `{"log":{"level":"warn"},"name":"${device.serial}@${label.site}"}`)
	put(fleet.LayerSchema, "rut-x11", `{"properties":{"log":{"properties":{"level":{"enum":["debug","info","warn"]}}}}}`)
	before, err := e.svc.EffectiveConfig(1)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"apn":"north.iot","log":{"level":"warn"},"name":"S-m-layers@north"}`
	if string(before.Config) != want || before.Sources["/apn"] != "label site=north" || before.Sources["/log/level"] != "device" {
		t.Fatalf("effective %s %v; want %s", before.Config, before.Sources, want)
	}
	e.sync()
	e.restart()
	after, err := e.svc.EffectiveConfig(1)
	if err != nil || string(after.Config) != want || after.Version != before.Version {
		t.Fatalf("after restart: %+v %v; before %+v", after, err, before)
	}
	if sc, err := e.svc.ConfigLayer(fleet.LayerSchema, "rut-x11"); err != nil || sc.Rev != 1 || sc.By != "alice" {
		t.Fatalf("schema after restart: %+v %v", sc, err)
	}
	if _, _, err := e.svc.PutConfigLayer(e.ctx, fleet.LayerDevice, r.DeviceID, fleet.LayerUpdate{Values: json.RawMessage(`{"log":{"level":"loud"}}`)}); !errors.Is(err, fleet.ErrSchema) {
		t.Fatalf("values breaking the schema after restart: %v", err)
	}
	h, err := e.svc.LayerHistory(e.ctx, fleet.LayerDevice, r.DeviceID)
	if err != nil || len(h) != 2 || h[1].By != "alice" {
		t.Fatalf("history after restart: %+v %v", h, err)
	}
	// ${state.…} from the pushed state, in every persistence mode.
	put(fleet.LayerDevice, r.DeviceID, `{"note":"${state.extra.note}"}`)
	ans := e.push(r.Token, pushReq(t, 1, 0, "n-1"))
	if ans.Config == nil || !strings.Contains(string(ans.Config.Data), `"note":"n-1"`) {
		t.Fatalf("answer with a state variable: %+v", ans.Config)
	}
	if d, _ := e.svc.Device(e.ctx, 1); d.DesiredVersion != ans.Config.Version || d.SyncState != "sync_pending" {
		t.Fatalf("device %+v, answered version %d", d, ans.Config.Version)
	}
	if again := e.push(r.Token, pushReq(t, 2, ans.Config.Version, "n-1")); again.Config != nil {
		t.Fatalf("same state: sent again %+v", again.Config)
	}
	if d, _ := e.svc.Device(e.ctx, 1); d.SyncState != "synchronized" {
		t.Fatalf("after applying: %+v", d)
	}
	if next := e.push(r.Token, pushReq(t, 3, ans.Config.Version, "n-2")); next.Config == nil || !strings.Contains(string(next.Config.Data), `"note":"n-2"`) {
		t.Fatalf("state changed: %+v", next.Config)
	}
}
