package fleet

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/drover/drover/internal/protocol"
)

// TestSubscribeHearsEveryEvent: one subscription hears the fleet's three
// kinds of events, every subscriber hears each once, and a subscriber
// hears only the kinds it set.
func TestSubscribeHearsEveryEvent(t *testing.T) {
	ctx := context.Background()
	s, _, _ := newService(t, newRecStore())
	var mu sync.Mutex
	var heard []string
	note := func(who, what string, id uint64) {
		mu.Lock()
		heard = append(heard, fmt.Sprintf("%s %s %d", who, what, id))
		mu.Unlock()
	}
	s.Subscribe(Events{
		Pushed:         func(ev PushEvent) { note("a", "pushed", ev.DeviceID) },
		CommandsQueued: func(id uint64) { note("a", "commands", id) },
		ProfileChanged: func(id uint64) { note("a", "profile", id) },
	})
	s.Subscribe(Events{Pushed: func(ev PushEvent) { note("b", "pushed", ev.DeviceID) }})
	take := func() []string {
		mu.Lock()
		defer mu.Unlock()
		out := heard
		heard = nil
		return out
	}
	devs := registerN(t, s, 1)
	if got := take(); len(got) != 0 {
		t.Fatalf("registration: heard %q", got)
	}
	if _, err := s.Push(ctx, devs[0].Token, push(1, 0)); err != nil {
		t.Fatal(err)
	}
	if got, want := take(), []string{"a pushed 1", "b pushed 1"}; !slices.Equal(got, want) {
		t.Fatalf("push: heard %q, want %q", got, want)
	}
	if _, err := s.Push(ctx, "1.wrong", push(2, 0)); err == nil {
		t.Fatal("a wrong token pushed")
	}
	if got := take(); len(got) != 0 {
		t.Fatalf("refused push: heard %q", got)
	}
	if _, err := s.SendCommand(ctx, CommandSpec{Kind: protocol.KindReboot}, Target{DeviceID: 1}); err != nil {
		t.Fatal(err)
	}
	if got, want := take(), []string{"a commands 1"}; !slices.Equal(got, want) {
		t.Fatalf("command: heard %q, want %q", got, want)
	}
	if _, err := s.UpdateProfile(ctx, 1, ProfileUpdate{Config: json.RawMessage(`{"a":1}`)}); err != nil {
		t.Fatal(err)
	}
	if got, want := take(), []string{"a profile 1"}; !slices.Equal(got, want) {
		t.Fatalf("profile update: heard %q, want %q", got, want)
	}
}

// TestPushEventAllocatesNothing: emitting a push to its subscribers costs
// no allocation (it runs on every push).
func TestPushEventAllocatesNothing(t *testing.T) {
	var ss subscribers
	var n uint64
	ss.add(Events{Pushed: func(ev PushEvent) { n += ev.DeviceID }})
	ss.add(Events{CommandsQueued: func(uint64) {}})
	var st protocol.State
	allocs := testing.AllocsPerRun(1000, func() {
		ss.pushed(PushEvent{DeviceID: 1, DeviceType: "ICR", Firmware: "1.0", State: &st})
	})
	if allocs != 0 || n == 0 {
		t.Fatalf("%v allocations per push event (heard %d)", allocs, n)
	}
}
