package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/internal/protocol"
)

// layered is a memory fleet with one profile and two devices, both pushed
// once with the profile's version applied.
func layered(t *testing.T) (*Service, []string) {
	t.Helper()
	ctx := context.Background()
	s, err := New(ctx, Stores{}, nil, Options{EnrollmentSecret: "sesame", Now: newClock().now})
	if err != nil {
		t.Fatal(err)
	}
	var tokens []string
	for _, m := range []string{"m-1", "m-2"} {
		rq := reg(m)
		rq.Serial = "SN-" + m
		r, err := s.Register(ctx, rq)
		if err != nil {
			t.Fatal(err)
		}
		tokens = append(tokens, r.Token)
	}
	if _, err := s.UpdateProfile(ctx, 1, ProfileUpdate{Config: json.RawMessage(`{"a":1,"net":{"apn":"x","mtu":1500},"list":[1,2]}`)}); err != nil {
		t.Fatal(err)
	}
	for i, tok := range tokens {
		if _, err := s.Push(ctx, tok, push(uint64(i+1), 1)); err != nil {
			t.Fatal(err)
		}
	}
	return s, tokens
}

func mustPut(t *testing.T, s *Service, kind LayerKind, name, values string, prio *int) ConfigLayer {
	t.Helper()
	c, _, err := s.PutConfigLayer(context.Background(), kind, name, LayerUpdate{Values: json.RawMessage(values), Priority: prio, By: "alice"})
	if err != nil {
		t.Fatalf("put %s %s: %v", kind, name, err)
	}
	return c
}

func TestLayersMergeAndSources(t *testing.T) {
	s, _ := layered(t)
	ctx := context.Background()
	if _, err := s.AssignLabel(ctx, "site=berlin", Filter{Text: "m-1"}, false); err != nil {
		t.Fatal(err)
	}
	mustPut(t, s, LayerLabel, "site=berlin", `{"net":{"apn":"berlin.iot"},"list":[3]}`, nil)
	mustPut(t, s, LayerDevice, "1", `{"net":{"mtu":null},"host":"${device.serial}-${label.site}","lit":"$${device.id}","d":"${label.rack:-none}"}`, nil)
	e, err := s.EffectiveConfig(1)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"a":1,"d":"none","host":"SN-m-1-berlin","list":[3],"lit":"${device.id}","net":{"apn":"berlin.iot"}}`
	if string(e.Config) != want {
		t.Fatalf("effective config\n got %s\nwant %s", e.Config, want)
	}
	wantSrc := map[string]string{"/a": "profile", "/net/apn": "label site=berlin", "/list": "label site=berlin",
		"/host": "device", "/lit": "device", "/d": "device"}
	if len(e.Sources) != len(wantSrc) {
		t.Errorf("sources %v, want %v", e.Sources, wantSrc)
	}
	for k, v := range wantSrc {
		if e.Sources[k] != v {
			t.Errorf("source of %s: %q, want %q", k, e.Sources[k], v)
		}
	}
	if len(e.Layers) != 2 || e.Layers[0].Kind != LayerLabel || e.Layers[1].Kind != LayerDevice {
		t.Errorf("layers %+v", e.Layers)
	}
	if len(e.Unresolved) != 1 || e.Unresolved[0] != "label.rack" {
		t.Errorf("unresolved %v", e.Unresolved)
	}
	// Device 2 carries no layer: the profile's own configuration.
	e2, _ := s.EffectiveConfig(2)
	p, _ := s.Profile(1)
	if e2.Version != p.Version || string(e2.Config) != string(p.Config) || e2.Sources["/net/mtu"] != "profile" {
		t.Fatalf("device without layers: %+v", e2)
	}
}

// Label layers merge by priority, then name: the higher one wins.
func TestLayersLabelOrder(t *testing.T) {
	s, _ := layered(t)
	ctx := context.Background()
	for _, l := range []string{"a", "b"} {
		if _, err := s.AssignLabel(ctx, l, Filter{Text: "m-1"}, false); err != nil {
			t.Fatal(err)
		}
	}
	mustPut(t, s, LayerLabel, "a", `{"k":"a"}`, nil)
	mustPut(t, s, LayerLabel, "b", `{"k":"b"}`, nil)
	e, _ := s.EffectiveConfig(1)
	if e.Sources["/k"] != "label b" {
		t.Fatalf("equal priorities: %v", e.Sources)
	}
	ten := 10
	mustPut(t, s, LayerLabel, "a", `{"k":"a"}`, &ten)
	e, _ = s.EffectiveConfig(1)
	if e.Sources["/k"] != "label a" || !strings.Contains(string(e.Config), `"k":"a"`) {
		t.Fatalf("a at priority 10: %s %v", e.Config, e.Sources)
	}
}

func TestLayersRefuseBadValues(t *testing.T) {
	s, _ := layered(t)
	ctx := context.Background()
	if _, err := s.UpdateProfile(ctx, 1, ProfileUpdate{Config: json.RawMessage(`{"x":"${device.nope}"}`)}); !errors.Is(err, ErrInvalid) {
		t.Errorf("profile with an unknown variable: %v", err)
	}
	for _, v := range []string{`{"x":"${device.nope}"}`, `{"x":"${device.serial"}`, `{"x":["${foo}"]}`, `{"x":"${label.}"}`, `[1]`, `{`} {
		_, _, err := s.PutConfigLayer(ctx, LayerDevice, "1", LayerUpdate{Values: json.RawMessage(v)})
		var fe *FieldError
		if !errors.As(err, &fe) || !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v, want a field error", v, err)
		}
	}
	if _, _, err := s.PutConfigLayer(ctx, LayerDevice, "99", LayerUpdate{Values: json.RawMessage(`{}`)}); !errors.Is(err, ErrNotFound) {
		t.Errorf("unknown device: %v", err)
	}
	if _, _, err := s.PutConfigLayer(ctx, LayerLabel, "nobody", LayerUpdate{Values: json.RawMessage(`{}`)}); !errors.Is(err, ErrNotFound) {
		t.Errorf("unknown label: %v", err)
	}
	if h, _ := s.LayerHistory(ctx, LayerDevice, "1"); len(h) != 0 {
		t.Errorf("refused values were stored: %+v", h)
	}
}

// The effective version changes with every layer that applies, the push
// answer carries the effective configuration, and the device is in sync
// once it reports that version; without layers it is the profile's again.
func TestLayersVersionAndSync(t *testing.T) {
	s, tokens := layered(t)
	ctx := context.Background()
	state := func(id uint64) Device { d, _ := s.Device(ctx, id); return d }
	if d := state(1); d.SyncState != "synchronized" || d.DesiredVersion != 1 {
		t.Fatalf("before layers: %+v", d)
	}
	var nudged []uint64
	s.Subscribe(Events{ConfigChanged: func(affects func(uint64) bool) {
		for _, id := range []uint64{1, 2} {
			if affects(id) {
				nudged = append(nudged, id)
			}
		}
	}})
	mustPut(t, s, LayerDevice, "1", `{"own":"${device.machine_id}"}`, nil)
	if len(nudged) != 1 || nudged[0] != 1 {
		t.Fatalf("nudged %v, want device 1", nudged)
	}
	d := state(1)
	v1 := d.DesiredVersion
	if d.SyncState != "sync_pending" || v1 == 1 || v1 < layeredVersionBit {
		t.Fatalf("after device layer: %+v", d)
	}
	if d2 := state(2); d2.SyncState != "synchronized" || d2.DesiredVersion != 1 {
		t.Fatalf("device 2 changed: %+v", d2)
	}
	resp, err := s.Push(ctx, tokens[0], push(10, 1))
	if err != nil || resp.Config == nil || resp.Config.Version != v1 || !strings.Contains(string(resp.Config.Data), `"own":"m-1"`) {
		t.Fatalf("push answer %+v %v", resp.Config, err)
	}
	if resp, _ := s.Push(ctx, tokens[0], push(11, v1)); resp.Config != nil || state(1).SyncState != "synchronized" {
		t.Fatalf("after applying: %+v %s", resp.Config, state(1).SyncState)
	}
	// A group layer: a new version for the devices carrying the label.
	if _, err := s.AssignLabel(ctx, "g", Filter{Text: "m-"}, false); err != nil {
		t.Fatal(err)
	}
	mustPut(t, s, LayerLabel, "g", `{"group":true}`, nil)
	v2 := state(1).DesiredVersion
	if v2 == v1 || state(1).SyncState != "sync_pending" || state(2).SyncState != "sync_pending" {
		t.Fatalf("after group layer: %d %+v %+v", v2, state(1), state(2))
	}
	// The same values again change nothing.
	if _, changed, _ := s.PutConfigLayer(ctx, LayerLabel, "g", LayerUpdate{Values: json.RawMessage(`{ "group": true }`)}); changed {
		t.Fatal("same values changed the layer")
	}
	// A profile change changes the effective version too.
	s.UpdateProfile(ctx, 1, ProfileUpdate{Config: json.RawMessage(`{"a":2}`)})
	v3 := state(1).DesiredVersion
	if v3 == v2 {
		t.Fatal("profile change kept the effective version")
	}
	// Without layers, the profile's version again.
	if err := s.DeleteConfigLayer(ctx, LayerDevice, "1", "alice"); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteConfigLayer(ctx, LayerLabel, "g", "alice"); err != nil {
		t.Fatal(err)
	}
	p, _ := s.Profile(1)
	if d := state(1); d.DesiredVersion != p.Version {
		t.Fatalf("after deleting the layers: %+v, profile %d", d, p.Version)
	}
	// Removing the label from a device removes its layer too.
	mustPut(t, s, LayerLabel, "g", `{"group":1}`, nil)
	if state(2).DesiredVersion == p.Version {
		t.Fatal("group layer not applied")
	}
	nudged = nil
	s.AssignLabel(ctx, "g", Filter{Text: "m-2"}, true)
	if state(2).DesiredVersion != p.Version || len(nudged) != 1 || nudged[0] != 2 {
		t.Fatalf("label removed: %+v nudged %v", state(2), nudged)
	}
}

// Variables in the profile resolve per device, with their own versions.
func TestLayersProfileVariables(t *testing.T) {
	s, tokens := layered(t)
	ctx := context.Background()
	s.UpdateProfile(ctx, 1, ProfileUpdate{Config: json.RawMessage(`{"name":"${device.serial}"}`)})
	a, _ := s.Push(ctx, tokens[0], push(10, 1))
	b, _ := s.Push(ctx, tokens[1], push(10, 1))
	if a.Config == nil || b.Config == nil || a.Config.Version == b.Config.Version ||
		string(a.Config.Data) != `{"name":"SN-m-1"}` || string(b.Config.Data) != `{"name":"SN-m-2"}` {
		t.Fatalf("answers %+v %+v", a.Config, b.Config)
	}
}

// ${state.…} takes its value from the state the device reports: a push
// reporting another value is answered with a new version.
func TestLayersStateVariables(t *testing.T) {
	s, tokens := layered(t)
	ctx := context.Background()
	mustPut(t, s, LayerDevice, "1", `{"host":"${state.hostname}","build":"${state.extra.build:-none}","t":"${state.temperature}","none":"${state.nope}"}`, nil)
	pushState := func(seq uint64, applied int64, state string) protocol.PushResponse {
		t.Helper()
		p, err := protocol.DecodePush([]byte(`{"seq":` + strconv.FormatUint(seq, 10) + `,"config_version":` + strconv.FormatInt(applied, 10) + `,"state":` + state + `}`))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := s.Push(ctx, tokens[0], p)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	a := pushState(10, 1, `{"uptime":5,"temperature":41.5,"hostname":"r1"}`)
	if a.Config == nil || string(a.Config.Data) != `{"a":1,"build":"none","host":"r1","list":[1,2],"net":{"apn":"x","mtu":1500},"none":"","t":"41.5"}` {
		t.Fatalf("answer %+v", a.Config)
	}
	if d, _ := s.Device(ctx, 1); d.DesiredVersion != a.Config.Version {
		t.Fatalf("desired %d, answered %d", d.DesiredVersion, a.Config.Version)
	}
	if r := pushState(11, a.Config.Version, `{"uptime":6,"temperature":41.5,"hostname":"r1"}`); r.Config != nil {
		t.Fatalf("same state: sent again %+v", r.Config)
	}
	b := pushState(12, a.Config.Version, `{"uptime":7,"temperature":41.5,"hostname":"r2","extra":{"build":"42"}}`)
	if b.Config == nil || b.Config.Version == a.Config.Version || !strings.Contains(string(b.Config.Data), `"host":"r2"`) ||
		!strings.Contains(string(b.Config.Data), `"build":"42"`) {
		t.Fatalf("state changed: %+v", b.Config)
	}
	e, _ := s.EffectiveConfig(1)
	if e.Version != b.Config.Version {
		t.Fatalf("effective %d, answered %d", e.Version, b.Config.Version)
	}
	if _, _, err := s.PutConfigLayer(ctx, LayerDevice, "1", LayerUpdate{Values: json.RawMessage(`{"x":"${state.}"}`)}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("empty state path: %v", err)
	}
}

func TestLayersHistoryDiffRollback(t *testing.T) {
	s, _ := layered(t)
	ctx := context.Background()
	mustPut(t, s, LayerDevice, "2", `{"a":1}`, nil)
	mustPut(t, s, LayerDevice, "2", `{"a":2,"b":true}`, nil)
	if err := s.DeleteConfigLayer(ctx, LayerDevice, "2", "bob"); err != nil {
		t.Fatal(err)
	}
	h, err := s.LayerHistory(ctx, LayerDevice, "2")
	if err != nil || len(h) != 3 || h[2].Note != "deleted" || !h[2].Deleted || h[1].By != "alice" {
		t.Fatalf("history %+v %v", h, err)
	}
	diff, _ := s.LayerDiff(ctx, LayerDevice, "2", 1, 2)
	if len(diff) != 2 || diff[0].Path != "/a" || diff[1].Path != "/b" || diff[1].Op != "added" {
		t.Fatalf("diff %+v", diff)
	}
	if _, err := s.ConfigLayer(LayerDevice, "2"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("deleted layer: %v", err)
	}
	c, err := s.RollbackLayer(ctx, LayerDevice, "2", 1, "carol")
	if err != nil || c.Rev != 4 || string(c.Values) != `{"a":1}` || c.Note != "rollback to revision 1" {
		t.Fatalf("rollback %+v %v", c, err)
	}
	if e, _ := s.EffectiveConfig(2); e.Sources["/a"] != "device" {
		t.Fatalf("after rollback: %+v", e)
	}
	if _, err := s.RollbackLayer(ctx, LayerDevice, "2", 9, "carol"); !errors.Is(err, ErrInvalid) {
		t.Fatalf("rollback to a missing revision: %v", err)
	}
}

func TestLayersSchema(t *testing.T) {
	s, _ := layered(t)
	ctx := context.Background()
	schema := `{"type":"object","properties":{"net":{"type":"object","properties":{"mtu":{"type":"integer","maximum":9000}}}}}`
	mustPut(t, s, LayerSchema, "ICR-3241", schema, nil)
	_, _, err := s.PutConfigLayer(ctx, LayerDevice, "1", LayerUpdate{Values: json.RawMessage(`{"net":{"mtu":10000}}`)})
	if !errors.Is(err, ErrSchema) || !strings.Contains(err.Error(), "maximum") {
		t.Fatalf("over the schema: %v", err)
	}
	if _, err := s.ConfigLayer(LayerDevice, "1"); !errors.Is(err, ErrNotFound) {
		t.Fatal("refused layer was stored")
	}
	// Variables are checked as written: a string, not the schema's integer.
	if _, _, err := s.PutConfigLayer(ctx, LayerDevice, "1", LayerUpdate{Values: json.RawMessage(`{"net":{"mtu":"${device.id}"}}`)}); !errors.Is(err, ErrSchema) {
		t.Fatalf("variable for an integer: %v", err)
	}
	mustPut(t, s, LayerDevice, "1", `{"net":{"mtu":1400}}`, nil)
	if _, _, err := s.PutConfigLayer(ctx, LayerSchema, "ICR-3241", LayerUpdate{Values: json.RawMessage(schema)}); err != nil {
		t.Fatalf("same schema: %v", err)
	}
	if _, _, err := s.PutConfigLayer(ctx, LayerSchema, "ICR-3241", LayerUpdate{Values: json.RawMessage(`{"type":"object","required":["zzz"]}`)}); !errors.Is(err, ErrSchema) {
		t.Fatalf("schema the profile breaks: %v", err)
	}
	if _, _, err := s.PutConfigLayer(ctx, LayerSchema, "ICR-3241", LayerUpdate{Values: json.RawMessage(`{"type":12}`)}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("schema that does not compile: %v", err)
	}
	// A profile change is checked too: alone, and with each device's layers.
	p, _ := s.Profile(1)
	if _, err := s.UpdateProfile(ctx, 1, ProfileUpdate{Config: json.RawMessage(`{"net":{"mtu":9999}}`)}); !errors.Is(err, ErrSchema) {
		t.Fatalf("profile over the schema: %v", err)
	}
	if _, err := s.UpdateProfile(ctx, 1, ProfileUpdate{Config: json.RawMessage(`{"net":{"mtu":1500},"extra":1}`)}); err != nil {
		t.Fatalf("profile within the schema: %v", err)
	}
	if now, _ := s.Profile(1); now.Version == p.Version {
		t.Fatal("profile not changed")
	}
}

// A device without layers costs a push no allocation more than before,
// also when other devices have layers.
func TestPushLayersAllocations(t *testing.T) {
	ctx := context.Background()
	c := newClock()
	allocs := func(withLayers bool) float64 {
		s, _ := New(ctx, Stores{}, nil, Options{EnrollmentSecret: "sesame", Now: c.now})
		r, _ := s.Register(ctx, reg("m"))
		other, _ := s.Register(ctx, reg("other"))
		_ = other
		if withLayers {
			s.AssignLabel(ctx, "g", Filter{Text: "other"}, false)
			mustPut(t, s, LayerLabel, "g", `{"x":1}`, nil)
			mustPut(t, s, LayerDevice, "2", `{"y":1}`, nil)
		}
		p := push(1, 0)
		p.State.Firmware = "6.3.5"
		return testing.AllocsPerRun(200, func() {
			c.add(time.Hour)
			if _, err := s.Push(ctx, r.Token, p); err != nil {
				t.Fatal(err)
			}
		})
	}
	off, on := allocs(false), allocs(true)
	if on > off {
		t.Fatalf("push allocates %v times with layers on other devices, %v without", on, off)
	}
}

var _ = protocol.PushRequest{}

// FuzzExpandVariables: any string either fails the syntax check or
// expands, the same way with and without values, never panicking; a text
// without "${" is left as it is.
func FuzzExpandVariables(f *testing.F) {
	for _, s := range []string{"", "plain", "${device.id}", "a${label.site:-x}b", "$${device.id}", "${", "${}", "${label.}", "${device.nope}", "$$${device.id}", "}${x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		_, err := expandVariables(s, nil)
		out, err2 := expandVariables(s, func(n string) (string, bool) { return "v", true })
		if (err == nil) != (err2 == nil) {
			t.Fatalf("%q: checked %v, expanded %v", s, err, err2)
		}
		if err == nil && !strings.Contains(s, "${") && out != s {
			t.Fatalf("%q expanded to %q", s, out)
		}
		if err == nil && CheckVariables("config", []byte(`{"k":`+strconvQuote(s)+`}`)) != nil {
			t.Fatalf("%q: CheckVariables disagrees", s)
		}
	})
}

func strconvQuote(s string) string { b, _ := json.Marshal(s); return string(b) }

// FuzzMergePatch: merging any two objects gives an object with no null
// member, and every source names a member that exists.
func FuzzMergePatch(f *testing.F) {
	f.Add(`{"a":1,"b":{"c":2}}`, `{"b":{"c":null,"d":[1]},"e":null}`)
	f.Add(`{}`, `{"a":{}}`)
	f.Add(`{"a":{"b":1}}`, `{"a":2}`)
	f.Fuzz(func(t *testing.T, a, b string) {
		base, ok1 := decodeObject([]byte(a))
		over, ok2 := decodeObject([]byte(b))
		if !ok1 || !ok2 {
			return
		}
		srcs := map[string]string{}
		markSources(base, "", "profile", srcs)
		mergePatch(base, over, "", "device", srcs)
		var walk func(v any)
		walk = func(v any) {
			if m, ok := v.(map[string]any); ok {
				for _, x := range m {
					if x == nil {
						t.Fatalf("null member left: %s over %s", b, a)
					}
					walk(x)
				}
			}
		}
		walk(base)
		e := EffectiveConfig{Config: encodeJSON(base), Sources: srcs}
		for _, m := range e.Members() {
			if string(m.Value) == "null" && !strings.Contains(a, "null") {
				t.Fatalf("source %s names no member: %s over %s -> %s", m.Path, b, a, e.Config)
			}
		}
	})
}

// BenchmarkPushLayers: a push of a device without layers while none
// exist, while 1,000 other devices and a label have layers, and of a
// device with its own and a label's values (its effective configuration
// cached).
func BenchmarkPushLayers(b *testing.B) {
	ctx := context.Background()
	for _, mode := range []string{"none", "others", "own"} {
		b.Run(mode, func(b *testing.B) {
			c := newClock()
			s, _ := New(ctx, Stores{}, nil, Options{EnrollmentSecret: "sesame", Now: c.now})
			r, _ := s.Register(ctx, reg("m"))
			for i := range 1000 {
				s.Register(ctx, reg("other-"+strconv.Itoa(i)))
			}
			if mode != "none" {
				target := "other-"
				if mode == "own" {
					target = "m"
				}
				s.AssignLabel(ctx, "g", Filter{Text: target}, false)
				s.PutConfigLayer(ctx, LayerLabel, "g", LayerUpdate{Values: json.RawMessage(`{"x":"${device.machine_id}"}`)})
				for i := 2; i <= 1001; i += 1 {
					s.PutConfigLayer(ctx, LayerDevice, strconv.Itoa(i), LayerUpdate{Values: json.RawMessage(`{"y":1}`)})
				}
				if mode == "own" {
					s.PutConfigLayer(ctx, LayerDevice, "1", LayerUpdate{Values: json.RawMessage(`{"y":2}`)})
				}
			}
			p := push(1, 0)
			p.State.Firmware = "6.3.5"
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				c.add(time.Hour)
				if _, err := s.Push(ctx, r.Token, p); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
