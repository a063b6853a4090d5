package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/internal/protocol"
)

const testSHA = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"

func addTestFirmware(t *testing.T, s *Service, version string) Firmware {
	t.Helper()
	f, err := s.AddFirmware(context.Background(), Firmware{DeviceType: "ICR-3241", Version: version, SHA256: testSHA, Size: 4})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func TestFirmwareCheck(t *testing.T) {
	good := Firmware{DeviceType: "ICR-3241", Version: "7.0.0", SHA256: testSHA, Size: 1}
	for name, mod := range map[string]func(*Firmware){
		"type":      func(f *Firmware) { f.DeviceType = "" },
		"version":   func(f *Firmware) { f.Version = " 7" },
		"sha":       func(f *Firmware) { f.SHA256 = strings.ToUpper(testSHA) },
		"size":      func(f *Firmware) { f.Size = 0 },
		"signature": func(f *Firmware) { f.Signature = "AAAA" },
		"url":       func(f *Firmware) { f.URL = "ftp://x/y" },
	} {
		f := good
		mod(&f)
		if err := f.Check(); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if err := good.Check(); err != nil {
		t.Fatal(err)
	}
}

// A rollout in two waves: one device first, then the rest; at most one
// download at a time; verification by the firmware of the next push.
func TestRolloutWaves(t *testing.T) {
	ctx := context.Background()
	c := newClock()
	s := newQuotaService(t, newPolStore(), QuotaOptions{}, c)
	var tokens []string
	for _, m := range []string{"a", "b", "c"} {
		r, err := s.Register(ctx, reg(m))
		if err != nil {
			t.Fatal(err)
		}
		tokens = append(tokens, r.Token)
		s.Push(ctx, r.Token, pushFW(1, 0, "6.3.5"))
	}
	fw := addTestFirmware(t, s, "7.0.0")
	if _, err := s.AddFirmware(ctx, Firmware{DeviceType: "ICR-3241", Version: "7.0.0", SHA256: testSHA, Size: 4}); !errors.Is(err, ErrFirmwareExists) {
		t.Fatalf("duplicate: %v", err)
	}
	spec := DefaultRolloutSpec()
	spec.FirmwareID, spec.Waves, spec.MaxDownloads, spec.MaxFailurePct = fw.ID, []string{"1", "100%"}, 1, 50
	ro, err := s.CreateRollout(ctx, spec, "test")
	if err != nil || ro.Total != 3 || ro.State != RolloutRunning {
		t.Fatalf("create: %+v %v", ro, err)
	}
	// Before the first step no device is targeted.
	if resp, _ := s.Push(ctx, tokens[0], pushFW(2, 0, "6.3.5")); resp.FirmwareUpdate != nil {
		t.Fatal("offer before the first wave")
	}
	if err := s.RolloutStep(ctx); err != nil {
		t.Fatal(err)
	}
	ro, _ = s.RolloutByID(ro.ID)
	if ro.Wave != 1 || ro.Counts[DevicePending] != 1 {
		t.Fatalf("wave 1: %+v", ro)
	}
	resp, _ := s.Push(ctx, tokens[0], pushFW(3, 0, "6.3.5"))
	o := resp.FirmwareUpdate
	if o == nil || o.Version != "7.0.0" || o.URL != "/api/v1/firmware/1/file" || o.SHA256 != testSHA || o.Size != 4 {
		t.Fatalf("offer %+v", o)
	}
	resp, _ = s.Push(ctx, tokens[0], pushFW(4, 0, "6.3.5"))
	resp.FirmwareUpdate = nil
	p := pushFW(5, 0, "6.3.5")
	p.FirmwareUpdate = &protocol.FirmwareReport{Rollout: ro.ID, State: "downloading", Progress: 2}
	s.Push(ctx, tokens[0], p)
	ds, _ := s.RolloutDevices(ctx, ro.ID, "", 0, 10)
	if len(ds) != 1 || ds[0].State != DeviceDownloading || ds[0].Progress != 2 || ds[0].From != "6.3.5" {
		t.Fatalf("devices %+v", ds)
	}
	// The wave is not over: no second wave yet.
	s.RolloutStep(ctx)
	if ro, _ = s.RolloutByID(ro.ID); ro.Wave != 1 {
		t.Fatalf("second wave too early: %+v", ro)
	}
	s.Push(ctx, tokens[0], pushFW(6, 0, "7.0.0"))
	s.RolloutStep(ctx)
	ro, _ = s.RolloutByID(ro.ID)
	if ro.Wave != 2 || ro.Counts[DeviceVerified] != 1 || ro.Counts[DevicePending] != 2 {
		t.Fatalf("wave 2: %+v", ro)
	}
	// One download at a time.
	if resp, _ := s.Push(ctx, tokens[1], pushFW(2, 0, "6.3.5")); resp.FirmwareUpdate == nil {
		t.Fatal("no offer to b")
	}
	if resp, _ := s.Push(ctx, tokens[2], pushFW(2, 0, "6.3.5")); resp.FirmwareUpdate != nil {
		t.Fatal("second concurrent download offered")
	}
	p = pushFW(3, 0, "6.3.5")
	p.FirmwareUpdate = &protocol.FirmwareReport{Rollout: ro.ID, State: "failed", Reason: "sha256 mismatch"}
	s.Push(ctx, tokens[1], p)
	if resp, _ := s.Push(ctx, tokens[2], pushFW(3, 0, "6.3.5")); resp.FirmwareUpdate == nil {
		t.Fatal("slot not freed by a failure")
	}
	// c installs and comes back with the old firmware: failed; 2 of 2
	// failed in wave 2 > 50%: paused.
	p = pushFW(4, 0, "6.3.5")
	p.FirmwareUpdate = &protocol.FirmwareReport{Rollout: ro.ID, State: "installing"}
	s.Push(ctx, tokens[2], p)
	s.Push(ctx, tokens[2], pushFW(5, 0, "6.3.5"))
	s.RolloutStep(ctx)
	ro, _ = s.RolloutByID(ro.ID)
	if ro.State != RolloutPaused || !strings.Contains(ro.Reason, "wave 2: 2 of 2") || ro.Counts[DeviceFailed] != 2 {
		t.Fatalf("not paused: %+v", ro)
	}
	ds, _ = s.RolloutDevices(ctx, ro.ID, DeviceFailed, 0, 10)
	if len(ds) != 2 || ds[0].Reason != "sha256 mismatch" || !strings.Contains(ds[1].Reason, "runs 6.3.5 after installing 7.0.0") {
		t.Fatalf("failed devices %+v", ds)
	}
	if _, err := s.ControlRollout(ctx, ro.ID, ActionPause, "op"); !errors.Is(err, ErrRolloutState) {
		t.Fatalf("pause a paused rollout: %v", err)
	}
	if _, _, err := s.DeleteFirmware(ctx, fw.ID); !errors.Is(err, ErrFirmwareInUse) {
		t.Fatalf("delete firmware in use: %v", err)
	}
	// Resumed: no device left (failed ones are not retried): done.
	if ro, err = s.ControlRollout(ctx, ro.ID, ActionResume, "op"); err != nil || ro.State != RolloutRunning {
		t.Fatalf("resume: %+v %v", ro, err)
	}
	s.RolloutStep(ctx)
	if ro, _ = s.RolloutByID(ro.ID); ro.State != RolloutDone || ro.Counts[DeviceVerified] != 1 {
		t.Fatalf("done: %+v", ro)
	}
	if _, _, err := s.DeleteFirmware(ctx, fw.ID); err != nil {
		t.Fatal(err)
	}
}

func TestRolloutWindowAbortAndStall(t *testing.T) {
	ctx := context.Background()
	c := newClock() // 03:04 UTC
	s := newQuotaService(t, newPolStore(), QuotaOptions{}, c)
	r, _ := s.Register(ctx, reg("a"))
	s.Push(ctx, r.Token, pushFW(1, 0, "6.3.5"))
	fw := addTestFirmware(t, s, "7.0.0")
	spec := DefaultRolloutSpec()
	spec.FirmwareID, spec.Window = fw.ID, &Window{Start: "22:00", End: "03:00"}
	ro, err := s.CreateRollout(ctx, spec, "op")
	if err != nil {
		t.Fatal(err)
	}
	s.RolloutStep(ctx)
	if ro, _ = s.RolloutByID(ro.ID); ro.Wave != 0 {
		t.Fatal("wave started outside the window")
	}
	c.add(19 * time.Hour)                       // 22:04
	s.Push(ctx, r.Token, pushFW(2, 0, "6.3.5")) // offline devices wait for a later wave
	s.RolloutStep(ctx)
	if resp, _ := s.Push(ctx, r.Token, pushFW(3, 0, "6.3.5")); resp.FirmwareUpdate == nil {
		t.Fatal("no offer inside the window")
	}
	c.add(2 * time.Hour)
	s.RolloutStep(ctx)
	ds, _ := s.RolloutDevices(ctx, ro.ID, "", 0, 10)
	if ds[0].State != DeviceFailed || !strings.Contains(ds[0].Reason, "no progress") {
		t.Fatalf("stall: %+v", ds)
	}
	if ro, err = s.ControlRollout(ctx, ro.ID, ActionAbort, "op"); err != nil || ro.State != RolloutAborted {
		t.Fatalf("abort: %+v %v", ro, err)
	}
	if resp, _ := s.Push(ctx, r.Token, pushFW(4, 0, "6.3.5")); resp.FirmwareUpdate != nil {
		t.Fatal("offer after abort")
	}
	spec.Waves = []string{"0"}
	if _, err := s.CreateRollout(ctx, spec, "op"); !errors.Is(err, ErrInvalid) {
		t.Fatalf("wave 0: %v", err)
	}
	spec.Waves, spec.Filter = []string{"5"}, "nope=1"
	if _, err := s.CreateRollout(ctx, spec, "op"); !errors.Is(err, ErrInvalid) {
		t.Fatalf("bad filter: %v", err)
	}
}

func TestProfileHistoryDiffRollback(t *testing.T) {
	ctx := context.Background()
	s := newQuotaService(t, newPolStore(), QuotaOptions{}, newClock())
	s.Register(ctx, reg("a"))
	s.UpdateProfile(ctx, 1, ProfileUpdate{Config: json.RawMessage(`{"apn":"iot","wifi":{"ssid":"a","on":true}}`), By: "alice"})
	iv := 600
	s.UpdateProfile(ctx, 1, ProfileUpdate{Config: json.RawMessage(`{"apn":"iot","wifi":{"ssid":"b","on":true},"ntp":"x"}`), PushInterval: &iv, By: "bob"})
	h, err := s.ProfileHistory(ctx, 1)
	if err != nil || len(h) != 3 || h[0].Note != "created empty" || h[1].By != "alice" || h[2].Rev != 3 || h[2].PushInterval != 600 {
		t.Fatalf("history %+v %v", h, err)
	}
	d, err := s.ProfileDiff(ctx, 1, 2, 3)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := json.Marshal(d)
	want := `[{"path":"/ntp","op":"added","new":"x"},{"path":"/wifi/ssid","op":"changed","old":"a","new":"b"},{"path":"push_interval","op":"changed","old":100,"new":600}]`
	if string(got) != want {
		t.Fatalf("diff\n got %s\nwant %s", got, want)
	}
	p, err := s.RollbackProfile(ctx, 1, 2, "carol")
	if err != nil || string(p.Config) != `{"apn":"iot","wifi":{"ssid":"a","on":true}}` || p.PushInterval != 100 || p.Version <= h[2].Version {
		t.Fatalf("rollback %+v %v", p, err)
	}
	h, _ = s.ProfileHistory(ctx, 1)
	if len(h) != 4 || h[3].Note != "rollback to revision 2" || h[3].By != "carol" {
		t.Fatalf("after rollback %+v", h[3])
	}
	if _, err := s.RollbackProfile(ctx, 1, 9, "x"); !errors.Is(err, ErrInvalid) {
		t.Fatalf("unknown revision: %v", err)
	}
	if _, err := s.ProfileHistory(ctx, 99); !errors.Is(err, ErrNotFound) {
		t.Fatalf("unknown profile: %v", err)
	}
}
