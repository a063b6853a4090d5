package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/drover/drover/internal/protocol"
)

func pushFW(seq uint64, applied int64, fw string) (p protocol.PushRequest) {
	p = push(seq, applied)
	p.State.Firmware = fw
	return p
}

// An upgraded device keeps its configuration: the new firmware's profile
// inherits config, version and interval, and the device stays in sync.
func TestFirmwareUpgradeInheritsConfiguration(t *testing.T) {
	ctx := context.Background()
	st, c := newPolStore(), newClock()
	s := newQuotaService(t, st, QuotaOptions{}, c)
	r, _ := s.Register(ctx, reg("m"))
	iv := 300
	p1, _ := s.UpdateProfile(ctx, 1, ProfileUpdate{Config: json.RawMessage(`{"apn":"iot"}`), PushInterval: &iv})
	s.Push(ctx, r.Token, pushFW(1, p1.Version, "6.3.5"))
	resp, err := s.Push(ctx, r.Token, pushFW(2, p1.Version, "7.0.0"))
	if err != nil {
		t.Fatal(err)
	}
	d, _ := s.Device(ctx, 1)
	p2, _ := s.Profile(d.ProfileID)
	if d.ProfileID == 1 || p2.Firmware != "7.0.0" || string(p2.Config) != `{"apn":"iot"}` || p2.Version != p1.Version || p2.PushInterval != 300 {
		t.Fatalf("new profile %+v", p2)
	}
	if resp.Config != nil || d.SyncState != "synchronized" || d.Firmware != "7.0.0" || resp.PushInterval != 300 {
		t.Fatalf("after upgrade: %+v, device %+v", resp, d)
	}
	// Versions stay unique from here on: a change to either profile gets a
	// new one.
	p2b, _ := s.UpdateProfile(ctx, p2.ID, ProfileUpdate{Config: json.RawMessage(`{"apn":"iot2"}`)})
	if p2b.Version <= p1.Version {
		t.Fatalf("version %d after %d", p2b.Version, p1.Version)
	}

	// carry empty: the next firmware starts empty.
	if _, err := s.SetProfilePolicy(ctx, ProfilePolicy{Mode: ModeCreate, Carry: CarryEmpty, CreateLimit: 10, CreateWindow: 3600}); err != nil {
		t.Fatal(err)
	}
	s.Push(ctx, r.Token, pushFW(3, p2b.Version, "8.0.0"))
	d, _ = s.Device(ctx, 1)
	if p3, _ := s.Profile(d.ProfileID); p3.Version != 0 || string(p3.Config) != `{}` || p3.Firmware != "8.0.0" {
		t.Fatalf("carry empty: %+v", p3)
	}
	if _, err := s.SetProfilePolicy(ctx, ProfilePolicy{Mode: "maybe", Carry: CarryEmpty, CreateLimit: 1, CreateWindow: 3600}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("bad mode: %v", err)
	}
	// The policy survives a restart.
	s2 := newQuotaService(t, st, QuotaOptions{}, c)
	if p := s2.ProfilePolicy(); p.Carry != CarryEmpty || p.CreateWindow != 3600 {
		t.Fatalf("policy after restart: %+v", p)
	}
}

func TestJoinModeAndApproval(t *testing.T) {
	ctx := context.Background()
	st, c := newPolStore(), newClock()
	s := newQuotaService(t, st, QuotaOptions{}, c)
	r, _ := s.Register(ctx, reg("m"))
	s.Register(ctx, reg("other"))
	p1, _ := s.UpdateProfile(ctx, 1, ProfileUpdate{Config: json.RawMessage(`{"apn":"iot"}`)})
	pol := DefaultProfilePolicy()
	pol.Mode = ModeJoin
	s.SetProfilePolicy(ctx, pol)
	if _, err := s.Push(ctx, r.Token, pushFW(1, p1.Version, "7.0.0")); err != nil {
		t.Fatal(err)
	}
	d, _ := s.Device(ctx, 1)
	if d.ProfileID != 1 || d.Firmware != "7.0.0" || d.SyncState != "synchronized" || len(s.Profiles()) != 1 {
		t.Fatalf("join: device %+v, %d profiles", d, len(s.Profiles()))
	}
	pend := s.PendingFirmware()
	if len(pend) != 1 || pend[0].Firmware != "7.0.0" || pend[0].ProfileID != 1 || pend[0].Devices != 1 || pend[0].Limited {
		t.Fatalf("pending %+v", pend)
	}
	// A restart keeps the device on its profile.
	s = newQuotaService(t, st, QuotaOptions{}, c)
	if d, _ := s.Device(ctx, 1); d.ProfileID != 1 || len(s.Profiles()) != 1 || len(s.PendingFirmware()) != 1 {
		t.Fatalf("after restart: %+v, %d profiles", d, len(s.Profiles()))
	}
	if _, err := s.ApproveFirmware(ctx, "ICR-3241", "9.9", ""); !errors.Is(err, ErrNotPending) {
		t.Fatalf("approve unknown: %v", err)
	}
	p2, err := s.ApproveFirmware(ctx, "ICR-3241", "7.0.0", "")
	if err != nil || p2.Firmware != "7.0.0" || p2.Version != p1.Version || string(p2.Config) != `{"apn":"iot"}` {
		t.Fatalf("approve: %+v %v", p2, err)
	}
	if d, _ := s.Device(ctx, 1); d.ProfileID != p2.ID || d.SyncState != "synchronized" {
		t.Fatalf("after approval: %+v", d)
	}
	if d, _ := s.Device(ctx, 2); d.ProfileID != 1 {
		t.Fatalf("a device on the old firmware moved: %+v", d)
	}
	if len(s.PendingFirmware()) != 0 || len(st.links) != 0 {
		t.Fatalf("links left: %+v %+v", s.PendingFirmware(), st.links)
	}
	s = newQuotaService(t, st, QuotaOptions{}, c)
	if d, _ := s.Device(ctx, 1); d.ProfileID != p2.ID {
		t.Fatalf("after approval and restart: %+v", d)
	}
}

// One device token reporting firmware after firmware creates at most the
// limit's profiles; the rest join its previous profile and it is listed.
func TestProfileCreateLimit(t *testing.T) {
	ctx := context.Background()
	st, c := newPolStore(), newClock()
	s := newQuotaService(t, st, QuotaOptions{}, c)
	r, _ := s.Register(ctx, reg("m"))
	pol := DefaultProfilePolicy()
	pol.CreateLimit, pol.CreateWindow = 3, 3600
	s.SetProfilePolicy(ctx, pol)
	for i := range 30 {
		if _, err := s.Push(ctx, r.Token, pushFW(uint64(i+1), 0, fmt.Sprintf("junk-%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	// The first profile (registration) counts in the window: 2 more.
	if n := len(s.Profiles()); n != 3 {
		t.Fatalf("%d profiles", n)
	}
	if n := len(s.PendingFirmware()); n != 28 {
		t.Fatalf("%d links", n)
	}
	h, ok := s.QuotaOf(1)
	if !ok || h.Counts[QuotaProfileCreate] != 28 {
		t.Fatalf("quota record %+v", h)
	}
	f, _ := s.ParseFilter(url.Values{"quota": {QuotaProfileCreate}})
	if res, _ := s.Query(Query{Filter: f}); res.Total != 1 {
		t.Fatalf("quota filter: %+v", res)
	}
	// Links are bounded per type.
	for i := 30; i < 200; i++ {
		s.Push(ctx, r.Token, pushFW(uint64(i+1), 0, fmt.Sprintf("junk-%d", i)))
	}
	if n := len(s.PendingFirmware()); n != maxLinksPerType {
		t.Fatalf("%d links", n)
	}
	// A window later, creations are allowed again.
	c.add(time.Hour + time.Second)
	s.Push(ctx, r.Token, pushFW(500, 0, "real-1"))
	if n := len(s.Profiles()); n != 4 {
		t.Fatalf("%d profiles after the window", n)
	}
}

func TestProfileCleanup(t *testing.T) {
	ctx := context.Background()
	st, c := newPolStore(), newClock()
	s := newQuotaService(t, st, QuotaOptions{}, c)
	r, _ := s.Register(ctx, reg("m"))
	for i, fw := range []string{"a", "b", "c"} {
		s.Push(ctx, r.Token, pushFW(uint64(i+1), 0, fw))
	}
	// Profiles 1 (6.3.5), 2 (a), 3 (b) are unused; 4 (c) is the device's.
	if err := s.DeleteProfile(ctx, 4); !errors.Is(err, ErrProfileInUse) {
		t.Fatalf("delete in use: %v", err)
	}
	if err := s.DeleteProfile(ctx, 99); !errors.Is(err, ErrNotFound) {
		t.Fatalf("delete unknown: %v", err)
	}
	res, err := s.CleanupProfiles(ctx, time.Hour, false)
	if err != nil || len(res.Deleted) != 0 {
		t.Fatalf("young profiles deleted: %+v %v", res, err)
	}
	c.add(2 * time.Hour)
	res, err = s.CleanupProfiles(ctx, time.Hour, true)
	if err != nil || len(res.Deleted) != 3 || !res.DryRun || len(s.Profiles()) != 4 {
		t.Fatalf("dry run: %+v %v", res, err)
	}
	if err := s.DeleteProfile(ctx, 2); err != nil {
		t.Fatal(err)
	}
	res, err = s.CleanupProfiles(ctx, time.Hour, false)
	if err != nil || len(res.Deleted) != 2 || res.Deleted[0].ID != 1 || res.Deleted[1].ID != 3 {
		t.Fatalf("cleanup: %+v %v", res, err)
	}
	if ps := s.Profiles(); len(ps) != 1 || ps[0].ID != 4 {
		t.Fatalf("left: %+v", ps)
	}
	if len(st.profiles) != 1 {
		t.Fatalf("stored: %+v", st.profiles)
	}
	// A device coming back with a deleted firmware gets a profile again.
	s.Push(ctx, r.Token, pushFW(9, 0, "a"))
	if d, _ := s.Device(ctx, 1); d.Firmware != "a" || d.ProfileID != 5 {
		t.Fatalf("back on a: %+v", d)
	}
	s = newQuotaService(t, st, QuotaOptions{}, c)
	if n := len(s.Profiles()); n != 2 {
		t.Fatalf("%d profiles after restart", n)
	}
}
