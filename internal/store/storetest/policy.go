package storetest

// Conformance of fleet.PolicyStore: the profile policy, firmware links and
// lifted quotas, at the store level and through fleet.Service across
// restarts.

import (
	"cmp"
	"encoding/json"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/drover/drover/internal/fleet"
)

func init() {
	storeTests = append(storeTests,
		storeTest{"PolicyRoundTrip", testPolicyRoundTrip},
		storeTest{"DeleteProfiles", testDeleteProfiles},
	)
	serviceTests = append(serviceTests,
		serviceTest{"FirmwareUpgradeInherits", svcFirmwareInherits},
		serviceTest{"JoinApproveCleanupLift", svcJoinApproveCleanupLift},
	)
}

func policyStore(t *testing.T, s fleet.Store) fleet.PolicyStore {
	t.Helper()
	ps, ok := s.(fleet.PolicyStore)
	if !ok {
		t.Fatalf("%T does not implement fleet.PolicyStore", s)
	}
	return ps
}

func loadPolicy(t *testing.T, s fleet.Store) fleet.PolicyData {
	t.Helper()
	d, err := policyStore(t, s).LoadPolicy(testCtx(t))
	if err != nil {
		t.Fatalf("LoadPolicy: %v", err)
	}
	return d
}

func testPolicyRoundTrip(t *testing.T, h *handle) {
	ctx := testCtx(t)
	ps := policyStore(t, h.store)
	if d := loadPolicy(t, h.store); d.Policy != nil || len(d.Links) != 0 || len(d.Lifts) != 0 {
		t.Fatalf("empty store: %+v", d)
	}
	at := time.UnixMilli(1_700_000_000_123).UTC()
	pol := fleet.ProfilePolicy{Mode: fleet.ModeJoin, Carry: fleet.CarryEmpty, CreateLimit: 7, CreateWindow: 3600}
	links := []fleet.ProfileLink{
		{DeviceType: "ICR-3241", Firmware: "7.0.0", ProfileID: 1, CreatedAt: at, Limited: true},
		{DeviceType: "ICR-3241", Firmware: "7.0.0 ", ProfileID: 2, CreatedAt: at}, // differs by a space only
		{DeviceType: "Ünï", Firmware: "β-1", ProfileID: 3, CreatedAt: at},
	}
	lifts := []fleet.QuotaLift{
		{DeviceID: 5, Note: "firmware bug #12", At: at},
		{DeviceID: 1 << 40, Until: at.Add(time.Hour), At: at},
	}
	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	must("save policy", ps.SaveProfilePolicy(ctx, fleet.ProfilePolicy{Mode: fleet.ModeCreate, Carry: fleet.CarryInherit, CreateLimit: 1, CreateWindow: 60}))
	must("overwrite policy", ps.SaveProfilePolicy(ctx, pol))
	for _, l := range links {
		must("save link", ps.SaveProfileLink(ctx, l))
	}
	// An upsert replaces the link of the same key.
	moved := links[0]
	moved.ProfileID, moved.Limited = 9, false
	must("upsert link", ps.SaveProfileLink(ctx, moved))
	links[0] = moved
	for _, l := range lifts {
		must("save lift", ps.SaveQuotaLift(ctx, l))
	}
	changed := lifts[0]
	changed.Note = "changed"
	must("upsert lift", ps.SaveQuotaLift(ctx, changed))
	lifts[0] = changed

	check := func(s fleet.Store, links []fleet.ProfileLink, lifts []fleet.QuotaLift) {
		t.Helper()
		d := loadPolicy(t, s)
		if d.Policy == nil || *d.Policy != pol {
			t.Fatalf("policy %+v, want %+v", d.Policy, pol)
		}
		sortLinks := func(ls []fleet.ProfileLink) {
			slices.SortFunc(ls, func(a, b fleet.ProfileLink) int {
				if a.DeviceType != b.DeviceType {
					return cmp.Compare(a.DeviceType, b.DeviceType)
				}
				return cmp.Compare(a.Firmware, b.Firmware)
			})
		}
		sortLinks(d.Links)
		sortLinks(links)
		if len(d.Links) != len(links) {
			t.Fatalf("links %+v, want %+v", d.Links, links)
		}
		for i := range links {
			g, w := d.Links[i], links[i]
			if g.DeviceType != w.DeviceType || g.Firmware != w.Firmware || g.ProfileID != w.ProfileID || !g.CreatedAt.Equal(w.CreatedAt) || g.Limited != w.Limited {
				t.Fatalf("link %d: %+v, want %+v", i, g, w)
			}
		}
		slices.SortFunc(d.Lifts, func(a, b fleet.QuotaLift) int { return cmp.Compare(a.DeviceID, b.DeviceID) })
		if len(d.Lifts) != len(lifts) {
			t.Fatalf("lifts %+v, want %+v", d.Lifts, lifts)
		}
		for i := range lifts {
			g, w := d.Lifts[i], lifts[i]
			if g.DeviceID != w.DeviceID || !g.Until.Equal(w.Until) || g.Note != w.Note || !g.At.Equal(w.At) {
				t.Fatalf("lift %d: %+v, want %+v", i, g, w)
			}
		}
	}
	check(h.store, links, lifts)
	s := h.reopen()
	check(s, links, lifts)
	must("delete link", policyStore(t, s).DeleteProfileLink(ctx, "ICR-3241", "7.0.0 "))
	must("delete lift", policyStore(t, s).DeleteQuotaLift(ctx, 5))
	must("delete missing lift", policyStore(t, s).DeleteQuotaLift(ctx, 12345))
	check(h.reopen(), []fleet.ProfileLink{links[0], links[2]}, lifts[1:])
}

func testDeleteProfiles(t *testing.T, h *handle) {
	ctx := testCtx(t)
	commit(t, h.store, &fleet.Batch{Profiles: []fleet.Profile{profile(1, "t", "1"), profile(2, "t", "2"), profile(3, "t", "3")}})
	ps := policyStore(t, h.store)
	at := time.UnixMilli(1_700_000_000_000).UTC()
	for _, l := range []fleet.ProfileLink{{DeviceType: "t", Firmware: "x", ProfileID: 2, CreatedAt: at}, {DeviceType: "t", Firmware: "y", ProfileID: 3, CreatedAt: at}} {
		if err := ps.SaveProfileLink(ctx, l); err != nil {
			t.Fatal(err)
		}
	}
	if err := ps.DeleteProfiles(ctx, []uint64{2, 1, 77}); err != nil {
		t.Fatal(err)
	}
	s := h.reopen()
	got := load(t, s)
	if len(got.res.Profiles) != 1 || got.res.Profiles[0].ID != 3 {
		t.Fatalf("profiles after delete: %+v", got.res.Profiles)
	}
	if d := loadPolicy(t, s); len(d.Links) != 1 || d.Links[0].Firmware != "y" {
		t.Fatalf("links after delete: %+v", d.Links)
	}
	// The (type, firmware) of a deleted profile can be used again.
	commit(t, s, &fleet.Batch{Profiles: []fleet.Profile{profile(4, "t", "1")}})
	if got := load(t, h.reopen()); len(got.res.Profiles) != 2 {
		t.Fatalf("re-created profile: %+v", got.res.Profiles)
	}
}

// A firmware upgrade carries the configuration over, durably.
func svcFirmwareInherits(t *testing.T, e *env) {
	r := e.register("m", "ICR-3241", "6.3.5")
	p1, err := e.svc.UpdateProfile(e.ctx, 1, fleet.ProfileUpdate{Config: json.RawMessage(`{"apn":"iot"}`)})
	if err != nil {
		t.Fatal(err)
	}
	up := pushReq(t, 1, p1.Version, "")
	up.State.Firmware = "7.0.0"
	if resp := e.push(r.Token, up); resp.Config != nil {
		t.Fatalf("config sent again after an upgrade: %+v", resp.Config)
	}
	e.sync()
	e.restart()
	d := e.device(r.DeviceID)
	p2, ok := e.svc.Profile(d.ProfileID)
	if !ok || d.ProfileID == 1 || p2.Firmware != "7.0.0" || string(p2.Config) != `{"apn":"iot"}` || p2.Version != p1.Version || d.SyncState != "synchronized" {
		t.Fatalf("after restart: device %+v, profile %+v", d, p2)
	}
}

// Join mode, approval, cleanup and a lifted quota, each across a restart.
func svcJoinApproveCleanupLift(t *testing.T, e *env) {
	r := e.register("m", "ICR-3241", "6.3.5")
	rn := e.register("n", "ICR-3241", "5.0.0") // profile 2, unused once n upgrades
	pol := fleet.DefaultProfilePolicy()
	pol.Mode = fleet.ModeJoin
	if _, err := e.svc.SetProfilePolicy(e.ctx, pol); err != nil {
		t.Fatal(err)
	}
	up := pushReq(t, 1, 0, "")
	up.State.Firmware = "7.0.0"
	e.push(r.Token, up)
	if _, err := e.svc.LiftQuota(e.ctx, 1, time.Time{}, "test"); err != nil {
		t.Fatal(err)
	}
	e.sync()
	e.restart()
	if p := e.svc.ProfilePolicy(); p.Mode != fleet.ModeJoin {
		t.Fatalf("policy after restart: %+v", p)
	}
	pend := e.svc.PendingFirmware()
	if len(pend) != 1 || pend[0].Firmware != "7.0.0" || pend[0].ProfileID != 1 || pend[0].Devices != 1 {
		t.Fatalf("pending after restart: %+v", pend)
	}
	if h, ok := e.svc.QuotaOf(1); !ok || !h.Lifted {
		t.Fatalf("lift after restart: %+v", h)
	}
	p, err := e.svc.ApproveFirmware(e.ctx, "ICR-3241", "7.0.0", fleet.CarryEmpty)
	if err != nil {
		t.Fatal(err)
	}
	e.advance(2 * time.Hour)
	// Device n upgrades to 6.3.5, which has a profile: nothing uses
	// 5.0.0's profile.
	upN := pushReq(t, 1, 0, "")
	upN.State.Firmware = "6.3.5"
	e.push(rn.Token, upN)
	res, err := e.svc.CleanupProfiles(e.ctx, time.Hour, false)
	if err != nil || len(res.Deleted) != 1 || res.Deleted[0].Firmware != "5.0.0" {
		t.Fatalf("cleanup: %+v %v", res, err)
	}
	if err := e.svc.RestoreQuota(e.ctx, 1); err != nil {
		t.Fatal(err)
	}
	e.sync()
	e.restart()
	if d := e.device(r.DeviceID); d.ProfileID != p.ID || d.Firmware != "7.0.0" {
		t.Fatalf("approved device after restart: %+v", d)
	}
	if len(e.svc.PendingFirmware()) != 0 {
		t.Fatalf("pending after approval: %+v", e.svc.PendingFirmware())
	}
	if _, ok := e.svc.Profile(2); ok {
		t.Fatal("deleted profile back after restart")
	}
	if _, ok := e.svc.QuotaOf(1); ok {
		t.Fatal("restored quota lifted after restart")
	}
	if err := e.svc.DeleteProfile(e.ctx, p.ID); !errors.Is(err, fleet.ErrProfileInUse) {
		t.Fatalf("delete in use: %v", err)
	}
}
