package storetest

// Conformance of fleet.FirmwareStore: firmware artifacts, rollouts, rollout
// devices and profile revisions, at the store level and through
// fleet.Service across restarts.

import (
	"encoding/json"
	"fmt"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/drover/drover/internal/fleet"
	"github.com/drover/drover/internal/protocol"
)

func init() {
	storeTests = append(storeTests, storeTest{"FirmwareRoundTrip", testFirmwareRoundTrip},
		storeTest{"ProfileRevisionsConcurrent", testRevisionsConcurrent})
	serviceTests = append(serviceTests, serviceTest{"RolloutSurvivesRestart", svcRolloutRestart})
}

const sha = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"

func testFirmwareRoundTrip(t *testing.T, h *handle) {
	ctx := testCtx(t)
	at := time.UnixMilli(1_700_000_000_123).UTC()
	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	fws := []fleet.Firmware{
		{ID: 1, DeviceType: "ICR-3241", Version: "7.0.0", SHA256: sha, Size: 1 << 33, CreatedAt: at, By: "api"},
		{ID: 2, DeviceType: "Ünï", Version: "β", SHA256: sha, Size: 4, Signature: "sig", URL: "https://cdn.example/fw.bin", CreatedAt: at},
	}
	for _, f := range fws {
		must("save firmware", h.store.SaveFirmware(ctx, f))
	}
	must("save firmware 3", h.store.SaveFirmware(ctx, fleet.Firmware{ID: 3, DeviceType: "x", Version: "y", SHA256: sha, Size: 1}))
	must("delete firmware 3", h.store.DeleteFirmware(ctx, 3))
	spec := fleet.DefaultRolloutSpec()
	spec.FirmwareID, spec.Window = 1, &fleet.Window{Start: "22:00", End: "04:00"}
	running := fleet.Rollout{ID: 1, RolloutSpec: spec, State: fleet.RolloutRunning, Wave: 2, Total: 9, CreatedAt: at, UpdatedAt: at, By: "op"}
	done := fleet.Rollout{ID: 2, RolloutSpec: spec, State: fleet.RolloutRunning, CreatedAt: at, UpdatedAt: at}
	must("save rollout", h.store.SaveRollout(ctx, running))
	must("save rollout 2", h.store.SaveRollout(ctx, done))
	devs := []fleet.RolloutDevice{
		{RolloutID: 1, DeviceID: 5, Wave: 1, State: fleet.DeviceVerified, From: "6.3.5", UpdatedAt: at},
		{RolloutID: 1, DeviceID: 1 << 40, Wave: 2, State: fleet.DeviceDownloading, Progress: 1 << 32, UpdatedAt: at},
		{RolloutID: 2, DeviceID: 5, Wave: 1, State: fleet.DeviceFailed, Reason: "hash ✗", UpdatedAt: at},
	}
	must("save devices", h.store.SaveRolloutDevices(ctx, devs))
	devs[1].State, devs[1].Progress = fleet.DeviceInstalling, 0
	must("upsert device", h.store.SaveRolloutDevices(ctx, devs[1:2]))
	done.State, done.Counts = fleet.RolloutDone, map[string]int{"failed": 1}
	must("finish rollout 2", h.store.SaveRollout(ctx, done))
	for i, cfg := range []string{`{}`, `{"apn":"iot"}`} {
		r, err := h.store.AddProfileRevision(ctx, fleet.ProfileRevision{ProfileID: 7, Version: int64(i), Config: json.RawMessage(cfg), PushInterval: 200, By: "alice", At: at, Note: "n"})
		must("add revision", err)
		if r.Rev != i+1 {
			t.Fatalf("revision number %d, want %d", r.Rev, i+1)
		}
	}
	s := h.reopen()
	d, err := s.LoadFirmware(ctx)
	must("load", err)
	if d.MaxFirmwareID != 3 || !reflect.DeepEqual(d.Firmware, fws) {
		t.Fatalf("firmware %+v (max %d), want %+v", d.Firmware, d.MaxFirmwareID, fws)
	}
	if len(d.Rollouts) != 2 || !reflect.DeepEqual(d.Rollouts[0], running) || d.Rollouts[1].State != fleet.RolloutDone || d.Rollouts[1].Counts["failed"] != 1 {
		t.Fatalf("rollouts %+v", d.Rollouts)
	}
	// Devices of the finished rollout are not loaded, but can be read.
	if want := []fleet.RolloutDevice{devs[0], devs[1]}; !reflect.DeepEqual(d.Devices, want) {
		t.Fatalf("devices %+v, want %+v", d.Devices, want)
	}
	got, err := s.RolloutDevices(ctx, 2)
	must("rollout devices", err)
	if !reflect.DeepEqual(got, devs[2:]) {
		t.Fatalf("rollout 2 devices %+v", got)
	}
	revs, err := s.ProfileRevisions(ctx, 7)
	must("revisions", err)
	if len(revs) != 2 || string(revs[1].Config) != `{"apn":"iot"}` || !revs[1].At.Equal(at) || revs[1].By != "alice" || revs[1].ProfileID != 7 {
		t.Fatalf("revisions %+v", revs)
	}
	must("delete profiles", s.DeleteProfiles(ctx, []uint64{7}))
	if revs, _ := s.ProfileRevisions(ctx, 7); len(revs) != 0 {
		t.Fatalf("revisions of a deleted profile: %+v", revs)
	}
}

// A rollout's state, its devices' states and profile history survive a
// restart.
func svcRolloutRestart(t *testing.T, e *env) {
	var tokens []string
	for _, m := range []string{"a", "b"} {
		r := e.register(m, "ICR-3241", "6.3.5")
		p := pushReq(t, 1, 0, "")
		p.State.Firmware = "6.3.5"
		e.push(r.Token, p)
		tokens = append(tokens, r.Token)
	}
	if _, err := e.svc.UpdateProfile(e.ctx, 1, fleet.ProfileUpdate{Config: json.RawMessage(`{"apn":"iot"}`), By: "alice"}); err != nil {
		t.Fatal(err)
	}
	fw, err := e.svc.AddFirmware(e.ctx, fleet.Firmware{DeviceType: "ICR-3241", Version: "7.0.0", SHA256: sha, Size: 4})
	if err != nil {
		t.Fatal(err)
	}
	spec := fleet.DefaultRolloutSpec()
	spec.FirmwareID, spec.Waves = fw.ID, []string{"1"}
	ro, err := e.svc.CreateRollout(e.ctx, spec, "op")
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
	tok := tokens[ds[0].DeviceID-1]
	p := pushReq(t, 2, 0, "")
	p.State.Firmware = "6.3.5"
	if o := e.push(tok, p).FirmwareUpdate; o == nil || o.SHA256 != sha {
		t.Fatalf("offer %+v", o)
	}
	p = pushReq(t, 3, 0, "")
	p.State.Firmware = "6.3.5"
	p.FirmwareUpdate = &protocol.FirmwareReport{Rollout: ro.ID, State: protocol.FirmwareDownloading, Progress: 3}
	e.push(tok, p)
	if err := e.svc.RolloutStep(e.ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := e.svc.ControlRollout(e.ctx, ro.ID, fleet.ActionPause, "op"); err != nil {
		t.Fatal(err)
	}
	e.sync()
	e.restart()
	got, ok := e.svc.RolloutByID(ro.ID)
	if !ok || got.State != fleet.RolloutPaused || got.Wave != 1 || got.Counts[fleet.DeviceDownloading] != 1 || got.Total != 2 {
		t.Fatalf("rollout after restart: %+v", got)
	}
	ds, _ = e.svc.RolloutDevices(e.ctx, ro.ID, "", 0, 10)
	if len(ds) != 1 || ds[0].Progress != 3 || ds[0].State != fleet.DeviceDownloading || ds[0].From != "6.3.5" {
		t.Fatalf("devices after restart: %+v", ds)
	}
	// The device verifies by pushing the new firmware after the restart.
	p = pushReq(t, 4, 0, "")
	p.State.Firmware = "7.0.0"
	e.push(tok, p)
	if got, _ := e.svc.RolloutByID(ro.ID); got.Counts[fleet.DeviceVerified] != 1 {
		t.Fatalf("not verified: %+v", got)
	}
	if f, ok := e.svc.FirmwareByID(fw.ID); !ok || f.Version != "7.0.0" {
		t.Fatalf("firmware after restart: %+v", f)
	}
	h, err := e.svc.ProfileHistory(e.ctx, 1)
	if err != nil || len(h) != 2 || h[1].By != "alice" {
		t.Fatalf("history after restart: %+v %v", h, err)
	}
}

// testRevisionsConcurrent adds revisions of one profile from many writers
// at once (servers sharing the database do): each gets its own number,
// none fails, and the numbers are 1…n without a hole.
func testRevisionsConcurrent(t *testing.T, h *handle) {
	ctx := testCtx(t)
	const writers, each = 8, 5
	at := time.UnixMilli(1_700_000_000_000).UTC()
	var mu sync.Mutex
	got := map[int]string{}
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				by := fmt.Sprintf("w%d-%d", w, i)
				r, err := h.store.AddProfileRevision(ctx, fleet.ProfileRevision{ProfileID: 9, Version: int64(w*each + i),
					Config: json.RawMessage(`{}`), PushInterval: 200, By: by, At: at})
				mu.Lock()
				if err != nil {
					t.Errorf("writer %d: add revision: %v", w, err)
				} else if other, dup := got[r.Rev]; dup {
					t.Errorf("revision %d given to %s and %s", r.Rev, other, by)
				} else {
					got[r.Rev] = by
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	all, err := h.store.ProfileRevisions(ctx, 9)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != writers*each {
		t.Fatalf("%d revisions stored, want %d", len(all), writers*each)
	}
	for i, r := range all {
		if r.Rev != i+1 || got[r.Rev] != r.By {
			t.Fatalf("revision %d: %+v, the writer was told %q", i+1, r, got[r.Rev])
		}
	}
}
