package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
)

// configFleet is a memory fleet of four devices carrying label g, whose
// layer holds {"x":1}, each synchronized on it.
type configFleet struct {
	t       *testing.T
	s       *Service
	tokens  []string
	seq     uint64
	applied []int64
}

func newConfigFleet(t *testing.T) *configFleet {
	t.Helper()
	ctx := context.Background()
	s, err := New(ctx, Stores{}, nil, Options{EnrollmentSecret: "sesame", Now: newClock().now})
	if err != nil {
		t.Fatal(err)
	}
	f := &configFleet{t: t, s: s}
	for _, m := range []string{"m-1", "m-2", "m-3", "m-4"} {
		r, err := s.Register(ctx, reg(m))
		if err != nil {
			t.Fatal(err)
		}
		f.tokens = append(f.tokens, r.Token)
		f.applied = append(f.applied, 0)
	}
	if _, err := s.AssignLabel(ctx, "g", Filter{Text: "m-"}, false); err != nil {
		t.Fatal(err)
	}
	mustPut(t, s, LayerLabel, "g", `{"x":1}`, nil)
	for i := range f.tokens {
		f.push(i, "") // takes {"x":1}
		f.push(i, "") // applied
	}
	return f
}

// push pushes device i with what it applied, or configErr; it applies
// what the answer carries (unless configErr) and returns its x.
func (f *configFleet) push(i int, configErr string) string {
	f.t.Helper()
	f.seq++
	p := push(f.seq, f.applied[i])
	p.ConfigError = configErr
	resp, err := f.s.Push(context.Background(), f.tokens[i], p)
	if err != nil {
		f.t.Fatal(err)
	}
	if resp.Config != nil && configErr == "" {
		f.applied[i] = resp.Config.Version
	}
	e, err := f.s.EffectiveConfig(uint64(i + 1))
	if err != nil {
		f.t.Fatal(err)
	}
	var v struct{ X json.Number }
	json.Unmarshal(e.Config, &v)
	return v.X.String()
}

func (f *configFleet) step() Rollout {
	f.t.Helper()
	if err := f.s.RolloutStep(context.Background()); err != nil {
		f.t.Fatal(err)
	}
	ro := f.s.Rollouts()[0]
	return ro
}

func configSpec(waves ...string) RolloutSpec {
	spec := DefaultRolloutSpec()
	spec.Waves, spec.MaxFailurePct = waves, 20
	spec.Config = &ConfigChange{Label: "g", Values: json.RawMessage(`{"x":2}`)}
	return spec
}

// A configuration rollout in two waves: the canary gets the new values
// first, the others keep the previous ones until the next wave; applies
// verify; done, every device has them and the layer takes changes again.
func TestConfigRolloutWaves(t *testing.T) {
	ctx := context.Background()
	f := newConfigFleet(t)
	s := f.s
	ro, err := s.CreateConfigRollout(ctx, configSpec("1", "100%"), "alice")
	if err != nil || ro.Kind != RolloutConfig || ro.Total != 4 || ro.Config.FromRev != 1 || ro.Config.ToRev != 2 {
		t.Fatalf("create: %+v %v", ro, err)
	}
	if l, _ := s.ConfigLayer(LayerLabel, "g"); l.Rev != 2 || !strings.Contains(l.Note, "staged in rollout") {
		t.Fatalf("layer %+v", l)
	}
	if _, _, err := s.PutConfigLayer(ctx, LayerLabel, "g", LayerUpdate{Values: json.RawMessage(`{"x":3}`)}); !errors.Is(err, ErrRolloutState) {
		t.Fatalf("put while staged: %v", err)
	}
	if _, err := s.CreateConfigRollout(ctx, configSpec("1"), "alice"); !errors.Is(err, ErrRolloutState) {
		t.Fatalf("second rollout of the label: %v", err)
	}
	for i := range 4 {
		if x := f.push(i, ""); x != "1" {
			t.Fatalf("device %d before the first wave: x=%s", i+1, x)
		}
	}
	ro = f.step()
	if ro.Wave != 1 || ro.Counts[DevicePending] != 1 {
		t.Fatalf("wave 1: %+v", ro)
	}
	ds, _ := s.RolloutDevices(ctx, ro.ID, "", 0, 10)
	canary := int(ds[0].DeviceID - 1)
	for i := range 4 {
		want := "1"
		if i == canary {
			want = "2"
		}
		if x := f.push(i, ""); x != want {
			t.Fatalf("device %d in wave 1: x=%s, want %s", i+1, x, want)
		}
	}
	if ro, _ = s.RolloutByID(ro.ID); ro.Counts[DeviceInstalling] != 1 {
		t.Fatalf("canary sent: %+v", ro.Counts)
	}
	if ro = f.step(); ro.Wave != 1 {
		t.Fatalf("next wave before the canary applied: %+v", ro)
	}
	f.push(canary, "")
	ro = f.step()
	if ro.Wave != 2 || ro.Counts[DeviceVerified] != 1 || ro.Counts[DevicePending] != 3 {
		t.Fatalf("wave 2: %+v", ro)
	}
	for i := range 4 {
		if x := f.push(i, ""); x != "2" {
			t.Fatalf("device %d in wave 2: x=%s", i+1, x)
		}
		f.push(i, "")
	}
	if ro = f.step(); ro.State != RolloutDone || ro.Counts[DeviceVerified] != 4 {
		t.Fatalf("all applied, not done: %+v", ro)
	}
	for i := range 4 {
		if d, _ := s.Device(ctx, uint64(i+1)); d.SyncState != "synchronized" {
			t.Fatalf("device %d: %s", i+1, d.SyncState)
		}
	}
	mustPut(t, s, LayerLabel, "g", `{"x":3}`, nil)
}

// A canary failing to apply pauses the rollout before anyone else gets
// the values; abort gives everyone the previous values.
func TestConfigRolloutPausesAndAborts(t *testing.T) {
	ctx := context.Background()
	f := newConfigFleet(t)
	s := f.s
	ro, err := s.CreateConfigRollout(ctx, configSpec("1", "100%"), "alice")
	if err != nil {
		t.Fatal(err)
	}
	f.step()
	ds, _ := s.RolloutDevices(ctx, ro.ID, "", 0, 10)
	canary := int(ds[0].DeviceID - 1)
	if x := f.push(canary, ""); x != "2" {
		t.Fatalf("canary: x=%s", x)
	}
	f.push(canary, "x must be odd")
	ro = f.step()
	if ro.State != RolloutPaused || ro.Counts[DeviceFailed] != 1 || !strings.Contains(ro.Reason, "wave 1: 1 of 1 devices failed") {
		t.Fatalf("not paused: %+v", ro)
	}
	ds, _ = s.RolloutDevices(ctx, ro.ID, DeviceFailed, 0, 10)
	if len(ds) != 1 || ds[0].Reason != "x must be odd" {
		t.Fatalf("failed devices %+v", ds)
	}
	for range 2 {
		if ro = f.step(); ro.Wave != 1 || ro.State != RolloutPaused {
			t.Fatalf("paused rollout moved: %+v", ro)
		}
	}
	for i := range 4 {
		if i != canary {
			if x := f.push(i, ""); x != "1" {
				t.Fatalf("device %d while paused: x=%s", i+1, x)
			}
		}
	}
	ro, err = s.ControlRollout(ctx, ro.ID, ActionAbort, "bob")
	if err != nil || ro.State != RolloutAborted {
		t.Fatalf("abort: %+v %v", ro, err)
	}
	l, _ := s.ConfigLayer(LayerLabel, "g")
	if l.Rev != 3 || string(l.Values) != `{"x":1}` || l.Note != "rollout 1 aborted: back to revision 1" {
		t.Fatalf("layer after abort: %+v", l)
	}
	for i := range 4 {
		if x := f.push(i, ""); x != "1" {
			t.Fatalf("device %d after abort: x=%s", i+1, x)
		}
	}
	mustPut(t, s, LayerLabel, "g", `{"x":5}`, nil)
}

// Bad specifications are refused and change nothing.
func TestConfigRolloutRefused(t *testing.T) {
	ctx := context.Background()
	f := newConfigFleet(t)
	s := f.s
	for name, mod := range map[string]func(*RolloutSpec){
		"not object":  func(sp *RolloutSpec) { sp.Config.Values = json.RawMessage(`[1]`) },
		"variable":    func(sp *RolloutSpec) { sp.Config.Values = json.RawMessage(`{"a":"${nope}"}`) },
		"firmware_id": func(sp *RolloutSpec) { sp.FirmwareID = 1 },
		"waves":       func(sp *RolloutSpec) { sp.Waves = nil },
	} {
		sp := configSpec("1")
		mod(&sp)
		if _, err := s.CreateConfigRollout(ctx, sp, "alice"); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v", name, err)
		}
	}
	sp := configSpec("1")
	sp.Config.Label = "nope"
	if _, err := s.CreateConfigRollout(ctx, sp, "alice"); !errors.Is(err, ErrNotFound) {
		t.Errorf("no label: %v", err)
	}
	if len(s.Rollouts()) != 0 {
		t.Fatal("a refused rollout was kept")
	}
	if l, _ := s.ConfigLayer(LayerLabel, "g"); l.Rev != 1 {
		t.Fatalf("layer changed: %+v", l)
	}
}

// effectiveOf is device i's effective configuration.
func (f *configFleet) effectiveOf(i int) EffectiveConfig {
	f.t.Helper()
	e, err := f.s.EffectiveConfig(uint64(i + 1))
	if err != nil {
		f.t.Fatal(err)
	}
	return e
}

// A profile's new configuration in two waves: the devices not released
// keep the profile's previous version (nothing is sent to them); other
// changes of the profile's configuration wait; abort gives the previous
// configuration back.
func TestConfigRolloutProfile(t *testing.T) {
	ctx := context.Background()
	f := newConfigFleet(t)
	s := f.s
	before := slices.Clone(f.applied)
	spec := configSpec("1", "100%")
	spec.Config = &ConfigChange{ProfileID: 1, Values: json.RawMessage(`{"y":2}`)}
	ro, err := s.CreateConfigRollout(ctx, spec, "alice")
	if err != nil || ro.Config.ProfileID != 1 || ro.Config.ToVersion == 0 || ro.Config.ToVersion == ro.Config.PreviousVersion {
		t.Fatalf("create: %+v %v", ro, err)
	}
	if _, err := s.UpdateProfile(ctx, 1, ProfileUpdate{Config: json.RawMessage(`{"z":1}`)}); !errors.Is(err, ErrRolloutState) {
		t.Fatalf("profile changed while staged: %v", err)
	}
	iv := 120
	if _, err := s.UpdateProfile(ctx, 1, ProfileUpdate{PushInterval: &iv}); err != nil {
		t.Fatalf("push interval while staged: %v", err)
	}
	for i := range 4 {
		f.push(i, "")
		if f.applied[i] != before[i] {
			t.Fatalf("device %d sent a configuration before the first wave", i+1)
		}
	}
	f.step()
	ds, _ := s.RolloutDevices(ctx, ro.ID, "", 0, 10)
	canary := int(ds[0].DeviceID - 1)
	for i := range 4 {
		f.push(i, "")
		got := string(f.effectiveOf(i).Config)
		if i == canary {
			if got != `{"x":1,"y":2}` || f.applied[i] == before[i] {
				t.Fatalf("canary: %s", got)
			}
		} else if got != `{"x":1}` || f.applied[i] != before[i] {
			t.Fatalf("device %d in wave 1: %s", i+1, got)
		}
	}
	f.push(canary, "")
	if ro = f.step(); ro.Wave != 2 {
		t.Fatalf("wave 2: %+v", ro)
	}
	for i := range 4 {
		f.push(i, "")
		f.push(i, "")
		if got := string(f.effectiveOf(i).Config); got != `{"x":1,"y":2}` {
			t.Fatalf("device %d in wave 2: %s", i+1, got)
		}
	}
	if ro = f.step(); ro.State != RolloutDone || ro.Counts[DeviceVerified] != 4 {
		t.Fatalf("not done: %+v", ro)
	}
	// A second one, aborted after the canary took it.
	spec.Config = &ConfigChange{ProfileID: 1, Values: json.RawMessage(`{"y":3}`)}
	if ro, err = s.CreateConfigRollout(ctx, spec, "alice"); err != nil {
		t.Fatal(err)
	}
	f.step()
	ds, _ = s.RolloutDevices(ctx, ro.ID, "", 0, 10)
	canary = int(ds[0].DeviceID - 1)
	if f.push(canary, ""); string(f.effectiveOf(canary).Config) != `{"x":1,"y":3}` {
		t.Fatalf("canary of the second: %s", f.effectiveOf(canary).Config)
	}
	if _, err := s.ControlRollout(ctx, ro.ID, ActionAbort, "bob"); err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		if f.push(i, ""); string(f.effectiveOf(i).Config) != `{"x":1,"y":2}` {
			t.Fatalf("device %d after abort: %s", i+1, f.effectiveOf(i).Config)
		}
	}
	if _, err := s.UpdateProfile(ctx, 1, ProfileUpdate{Config: json.RawMessage(`{"z":1}`)}); err != nil {
		t.Fatalf("profile change after the rollout: %v", err)
	}
}
