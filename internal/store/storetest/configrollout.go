package storetest

// Conformance of configuration rollouts (docs/configuration.md, staged
// changes): the rollout's staged change round-trips with the rollout, and
// through fleet.Service a restart keeps who has the new values and who
// the previous ones.

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/drover/drover/internal/fleet"
)

func init() {
	storeTests = append(storeTests, storeTest{"ConfigRolloutRoundTrip", testConfigRolloutRoundTrip})
	serviceTests = append(serviceTests, serviceTest{"ConfigRolloutSurvivesRestart", svcConfigRolloutRestart})
}

func testConfigRolloutRoundTrip(t *testing.T, h *handle) {
	ctx := testCtx(t)
	at := time.UnixMilli(1_700_000_000_123).UTC()
	spec := fleet.DefaultRolloutSpec()
	spec.Filter = "liveness=online"
	spec.Config = &fleet.ConfigChange{Label: "site=nörth", Values: json.RawMessage(`{"apn":"b"}`), FromRev: 3, ToRev: 4,
		Previous: json.RawMessage(`{"apn":"a"}`), PreviousPriority: -2}
	r := fleet.Rollout{ID: 7, Kind: fleet.RolloutConfig, RolloutSpec: spec, State: fleet.RolloutRunning, Wave: 1, Total: 3, CreatedAt: at, UpdatedAt: at, By: "op"}
	if err := h.store.SaveRollout(ctx, r); err != nil {
		t.Fatal(err)
	}
	pspec := spec
	pspec.Config = &fleet.ConfigChange{ProfileID: 1 << 40, Values: json.RawMessage(`{"apn":"c"}`), Previous: json.RawMessage(`{}`),
		PreviousVersion: 1 << 50, ToVersion: 1<<50 + 1}
	pr := fleet.Rollout{ID: 8, Kind: fleet.RolloutConfig, RolloutSpec: pspec, State: fleet.RolloutPaused, Wave: 2, Total: 1, CreatedAt: at, UpdatedAt: at}
	if err := h.store.SaveRollout(ctx, pr); err != nil {
		t.Fatal(err)
	}
	d := fleet.RolloutDevice{RolloutID: 7, DeviceID: 2, Wave: 1, State: fleet.DeviceInstalling, From: "12", UpdatedAt: at}
	if err := h.store.SaveRolloutDevices(ctx, []fleet.RolloutDevice{d}); err != nil {
		t.Fatal(err)
	}
	got, err := h.reopen().LoadFirmware(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Rollouts) != 2 || !reflect.DeepEqual(got.Rollouts[0], r) || !reflect.DeepEqual(got.Rollouts[1], pr) {
		t.Fatalf("rollouts %+v, want %+v and %+v", got.Rollouts, r, pr)
	}
	if !reflect.DeepEqual(got.Devices, []fleet.RolloutDevice{d}) {
		t.Fatalf("devices %+v", got.Devices)
	}
}

// A canary released before a restart keeps the new values after it, the
// other device the previous ones until the next wave.
func svcConfigRolloutRestart(t *testing.T, e *env) {
	var tokens []string
	applied := []int64{0, 0}
	for _, m := range []string{"cr-a", "cr-b"} {
		r := e.register(m, "ICR-3241", "6.3.5")
		e.push(r.Token, pushReq(t, 1, 0, ""))
		tokens = append(tokens, r.Token)
	}
	if _, err := e.svc.AssignLabel(e.ctx, "g", fleet.Filter{Text: "cr-"}, false); err != nil {
		t.Fatal(err)
	}
	if _, _, err := e.svc.PutConfigLayer(e.ctx, fleet.LayerLabel, "g", fleet.LayerUpdate{Values: json.RawMessage(`{"x":1}`)}); err != nil {
		t.Fatal(err)
	}
	seq := uint64(1)
	x := func(i int) string {
		t.Helper()
		seq++
		resp := e.push(tokens[i], pushReq(t, seq, applied[i], ""))
		if resp.Config != nil {
			applied[i] = resp.Config.Version
		}
		eff, err := e.svc.EffectiveConfig(uint64(i + 1))
		if err != nil {
			t.Fatal(err)
		}
		return string(eff.Config)
	}
	x(0)
	x(1)
	spec := fleet.DefaultRolloutSpec()
	spec.Waves = []string{"1"}
	spec.Config = &fleet.ConfigChange{Label: "g", Values: json.RawMessage(`{"x":2}`)}
	ro, err := e.svc.CreateConfigRollout(e.ctx, spec, "op")
	if err != nil {
		t.Fatal(err)
	}
	if err := e.svc.RolloutStep(e.ctx); err != nil {
		t.Fatal(err)
	}
	ds, _ := e.svc.RolloutDevices(e.ctx, ro.ID, "", 0, 10)
	if len(ds) != 1 {
		t.Fatalf("wave 1: %+v", ds)
	}
	canary := int(ds[0].DeviceID - 1)
	if got := x(canary); got != `{"x":2}` {
		t.Fatalf("canary: %s", got)
	}
	if got := x(1 - canary); got != `{"x":1}` {
		t.Fatalf("other device in wave 1: %s", got)
	}
	if err := e.svc.RolloutStep(e.ctx); err != nil {
		t.Fatal(err)
	}
	e.sync()
	e.restart()
	if got := x(1 - canary); got != `{"x":1}` {
		t.Fatalf("other device after the restart: %s", got)
	}
	if got := x(canary); got != `{"x":2}` {
		t.Fatalf("canary after the restart: %s", got)
	}
	if err := e.svc.RolloutStep(e.ctx); err != nil {
		t.Fatal(err)
	}
	if got := x(1 - canary); got != `{"x":2}` {
		t.Fatalf("other device in wave 2: %s", got)
	}
	if got, _ := e.svc.RolloutByID(ro.ID); got.Wave != 2 || got.Kind != fleet.RolloutConfig || got.Config.ToRev != 2 {
		t.Fatalf("rollout after restart: %+v", got)
	}
}
