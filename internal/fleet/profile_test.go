package fleet

import (
	"context"
	"encoding/json"
	"testing"
)

// A profile update with the configuration the profile holds (however it is
// written) and its push interval changes nothing: the version stays, so
// the profile's devices stay synchronized; nothing is stored and no
// revision is recorded. Any real difference still counts.
func TestUnchangedProfileKeepsVersion(t *testing.T) {
	ctx := context.Background()
	st := newRecStore()
	s, _, _ := newService(t, st)
	r, err := s.Register(ctx, reg("m"))
	if err != nil {
		t.Fatal(err)
	}
	p, changed, err := s.ApplyProfileUpdate(ctx, 1, ProfileUpdate{Config: json.RawMessage(`{"apn":"iot","mtu":1400,"dns":["a","b"]}`)})
	if err != nil || !changed || p.Version != 1 {
		t.Fatalf("first configuration: %+v changed %v, %v", p, changed, err)
	}
	if resp, _ := s.Push(ctx, r.Token, push(1, 1)); resp.Config != nil {
		t.Fatalf("applied version 1 and still sent a configuration: %+v", resp.Config)
	}
	state := func() string { d, _ := s.Device(ctx, 1); return d.SyncState }
	if got := state(); got != "synchronized" {
		t.Fatalf("after apply: %s", got)
	}
	history := func() int {
		h, err := s.ProfileHistory(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		return len(h)
	}
	revs := history()
	st.mu.Lock()
	commits := st.commits
	st.mu.Unlock()

	interval := p.PushInterval
	for i, same := range []string{
		`{"apn":"iot","mtu":1400,"dns":["a","b"]}`,
		`{"apn":"iot","mtu":1400,"dns":["a","b"]}`,
		"{\n  \"dns\": [ \"a\", \"b\" ],\n  \"mtu\": 1400,\n  \"apn\": \"iot\"\n}",
		`{"mtu":1400,"apn":"\u0069ot","dns":["a","b"]}`,
	} {
		u := ProfileUpdate{Config: json.RawMessage(same)}
		if i%2 == 1 {
			u.PushInterval = &interval
		}
		got, changed, err := s.ApplyProfileUpdate(ctx, 1, u)
		if err != nil || changed || got.Version != 1 || got.UpdatedAt != p.UpdatedAt || string(got.Config) != string(p.Config) {
			t.Fatalf("unchanged update %d (%s): version %d, changed %v, config %s, %v; want version 1 unchanged", i, same, got.Version, changed, got.Config, err)
		}
	}
	if _, changed, err := s.ApplyProfileUpdate(ctx, 1, ProfileUpdate{}); err != nil || changed {
		t.Fatalf("empty update: changed %v, %v", changed, err)
	}
	st.mu.Lock()
	profileWrites := st.commits - commits
	st.mu.Unlock()
	if profileWrites != 0 {
		t.Fatalf("unchanged updates stored the profile %d times", profileWrites)
	}
	if got := state(); got != "synchronized" {
		t.Fatalf("after unchanged updates the device is %s", got)
	}
	if resp, _ := s.Push(ctx, r.Token, push(2, 1)); resp.Config != nil {
		t.Fatalf("an unchanged update sent the configuration again: %+v", resp.Config)
	}
	if n := history(); n != revs {
		t.Fatalf("unchanged updates recorded %d revisions", n-revs)
	}

	// The same configuration with a new interval changes the interval only.
	longer := interval * 2
	got, changed, err := s.ApplyProfileUpdate(ctx, 1, ProfileUpdate{Config: json.RawMessage(`{"dns":["a","b"],"apn":"iot","mtu":1400}`), PushInterval: &longer})
	if err != nil || !changed || got.Version != 1 || got.PushInterval != longer {
		t.Fatalf("interval change: %+v changed %v, %v", got, changed, err)
	}
	if n := history(); n != revs+1 {
		t.Fatalf("interval change: %d new revisions, want 1", n-revs)
	}
	// A number written differently, a reordered array, a new member: changes.
	version := got.Version
	for _, other := range []string{
		`{"apn":"iot","mtu":1400.0,"dns":["a","b"]}`,
		`{"apn":"iot","mtu":1400.0,"dns":["b","a"]}`,
		`{"apn":"iot","mtu":1400.0,"dns":["b","a"],"ntp":null}`,
	} {
		got, changed, err := s.ApplyProfileUpdate(ctx, 1, ProfileUpdate{Config: json.RawMessage(other)})
		if err != nil || !changed || got.Version <= version {
			t.Fatalf("changed configuration %s: version %d (was %d), changed %v, %v", other, got.Version, version, changed, err)
		}
		version = got.Version
	}
	if got := state(); got != "sync_pending" {
		t.Fatalf("after a real change the device is %s", got)
	}

	// A rollback always makes a new version, even to the content the
	// profile holds: the way to send a configuration again.
	h, _ := s.ProfileHistory(ctx, 1)
	rb, err := s.RollbackProfile(ctx, 1, h[len(h)-1].Rev, "alice")
	if err != nil || rb.Version <= version {
		t.Fatalf("rollback to the current revision: %+v, %v", rb, err)
	}
}
