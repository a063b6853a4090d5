package fleet

import (
	"context"
	"encoding/json"
	"slices"
	"sync"
	"testing"
	"time"
)

// profileReader is the part of a ClusterStore that reading a profile back
// needs; the rest is not called.
type profileReader struct {
	ClusterStore
	mu sync.Mutex
	p  Profile
}

func (r *profileReader) ReadProfile(context.Context, uint64) (Profile, bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.p, true, nil
}

// TestAdoptedProfileChangeNotifies: a profile change read back from the
// change log (another node made it) tells connected devices to push
// exactly as a change made here does: when the configuration's version or
// the push interval changed, and only then.
func TestAdoptedProfileChangeNotifies(t *testing.T) {
	ctx := context.Background()
	cs := &profileReader{}
	s, err := New(ctx, Stores{}, nil, Options{Cluster: cs})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var told []uint64
	s.Subscribe(Events{ProfileChanged: func(id uint64) {
		mu.Lock()
		told = append(told, id)
		mu.Unlock()
	}})
	at := time.UnixMilli(1_700_000_000_000).UTC()
	p := Profile{ID: 7, DeviceType: "ICR-3241", Firmware: "6.3.5", Version: 3, Config: json.RawMessage(`{"a":1}`), PushInterval: 200, CreatedAt: at, UpdatedAt: at}
	steps := []struct {
		what   string
		change func(p *Profile)
		told   []uint64
	}{
		{"first read (no device on it yet)", func(*Profile) {}, nil},
		{"configuration changed", func(p *Profile) { p.Version, p.Config = 4, json.RawMessage(`{"a":2}`) }, []uint64{7}},
		{"read again unchanged", func(p *Profile) { p.UpdatedAt = p.UpdatedAt.Add(time.Second) }, []uint64{7}},
		{"push interval changed", func(p *Profile) { p.PushInterval = 90 }, []uint64{7, 7}},
	}
	for _, st := range steps {
		st.change(&p)
		cs.mu.Lock()
		cs.p = p
		cs.mu.Unlock()
		if err := s.ApplyChange(ctx, Change{Kind: ChangeProfile, ID: p.ID}); err != nil {
			t.Fatalf("%s: %v", st.what, err)
		}
		mu.Lock()
		got := slices.Clone(told)
		mu.Unlock()
		if !slices.Equal(got, st.told) {
			t.Fatalf("%s: told %v, want %v", st.what, got, st.told)
		}
		if q, ok := s.Profile(p.ID); !ok || q.Version != p.Version || q.PushInterval != p.PushInterval {
			t.Fatalf("%s: profile in memory %+v, want %+v", st.what, q, p)
		}
	}
}
