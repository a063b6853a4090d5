// Package storetest is the conformance suite every store backend passes
// (the whole contract.Store: devices, states, history, profiles, labels,
// alerts, events, settings, sessions, the instance lock, ID non-reuse): the same tests at the Store level and through fleet.Service in
// write-through and write-back mode.
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, func(t testing.TB) storetest.Opener {
//			path := filepath.Join(t.TempDir(), "d.db")
//			return func(t testing.TB) (contract.Store, error) { … open path … }
//		})
//	}
package storetest

import (
	"bytes"
	"context"
	"sync"
	"testing"
	"time"

	"github.com/drover/drover/internal/fleet"
	"github.com/drover/drover/internal/store/contract"
)

// Opener opens one database; every call opens it again (a restart), after
// the suite closed the previous store. An open while another store of the
// same database is open must fail with the instance lock's error.
type Opener func(t testing.TB) (contract.Store, error)

// mustOpen opens or fails the test.
func (open Opener) mustOpen(t testing.TB) contract.Store {
	t.Helper()
	s, err := open(t)
	if err != nil {
		t.Fatalf("open store: %v", err)
	}
	return s
}

// NewDB creates a new, empty database and returns its Opener.
type NewDB func(t testing.TB) Opener

// Run runs the whole suite against a backend.
func Run(t *testing.T, newDB NewDB) {
	for _, tc := range storeTests {
		t.Run("store/"+tc.name, func(t *testing.T) {
			tc.fn(t, newHandle(t, newDB(t)))
		})
	}
	for _, mode := range []string{"write-through", "write-back"} {
		for _, tc := range serviceTests {
			t.Run("service/"+mode+"/"+tc.name, func(t *testing.T) {
				tc.fn(t, newEnv(t, newDB(t), mode))
			})
		}
	}
}

// handle keeps one open store of a database and closes it at the end.
type handle struct {
	t     testing.TB
	open  Opener
	mu    sync.Mutex
	store contract.Store
}

func newHandle(t testing.TB, open Opener) *handle {
	h := &handle{t: t, open: open}
	h.store = open.mustOpen(t)
	t.Cleanup(func() { h.close() })
	return h
}

func (h *handle) close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.store != nil {
		if err := h.store.Close(); err != nil {
			h.t.Errorf("close store: %v", err)
		}
		h.store = nil
	}
}

// reopen closes the store and opens the database again.
func (h *handle) reopen() contract.Store {
	h.t.Helper()
	h.close()
	s := h.open.mustOpen(h.t)
	h.mu.Lock()
	h.store = s
	h.mu.Unlock()
	return s
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func commit(t testing.TB, s fleet.Store, b *fleet.Batch) {
	t.Helper()
	if err := s.Commit(testCtx(t), b); err != nil {
		t.Fatalf("commit (%d profiles, %d devices, %d states, %d samples): %v",
			len(b.Profiles), len(b.Devices), len(b.States), len(b.Samples), err)
	}
}

// loaded is the result of Load in maps.
type loaded struct {
	res      fleet.LoadResult
	devices  map[uint64]fleet.DeviceRecord
	profiles map[uint64]fleet.Profile
}

func load(t testing.TB, s fleet.Store) loaded {
	t.Helper()
	l := loaded{devices: map[uint64]fleet.DeviceRecord{}, profiles: map[uint64]fleet.Profile{}}
	var err error
	l.res, err = s.Load(testCtx(t), fleet.LoadOptions{}, func(d fleet.DeviceRecord) error {
		if _, dup := l.devices[d.ID]; dup {
			t.Errorf("Load gave device %d twice", d.ID)
		}
		l.devices[d.ID] = d
		return nil
	})
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	for _, p := range l.res.Profiles {
		if _, dup := l.profiles[p.ID]; dup {
			t.Errorf("Load gave profile %d twice", p.ID)
		}
		l.profiles[p.ID] = p
	}
	return l
}

func history(t *testing.T, s fleet.Store, id uint64, q fleet.HistoryQuery) []fleet.Sample {
	t.Helper()
	out, err := s.History(testCtx(t), id, q)
	if err != nil {
		t.Fatalf("history of %d: %v", id, err)
	}
	if out == nil {
		t.Fatalf("history of %d: nil slice (want empty, it is encoded as [])", id)
	}
	return out
}

// checkDevice compares a loaded device with what was committed: identity
// from reg, state from st (zero: never pushed).
func checkDevice(t *testing.T, got fleet.DeviceRecord, reg fleet.DeviceRecord, st fleet.StateRecord) {
	t.Helper()
	if got.ID != reg.ID || got.MachineID != reg.MachineID || got.DeviceType != reg.DeviceType || got.Model != reg.Model ||
		got.Serial != reg.Serial || !bytes.Equal(got.TokenHash, reg.TokenHash) || got.RegisteredAt.Unix() != reg.RegisteredAt.Unix() {
		t.Errorf("device %d identity:\n got %+v\nwant %+v", reg.ID, brief(got), brief(reg))
	}
	fw := reg.Firmware
	if st.Firmware != "" {
		fw = st.Firmware
	}
	if got.Firmware != fw {
		t.Errorf("device %d firmware %q, want %q", reg.ID, got.Firmware, fw)
	}
	g := got.State
	if g.LastSeen.UnixNano() != st.LastSeen.UnixNano() && !(g.LastSeen.IsZero() && st.LastSeen.IsZero()) {
		t.Errorf("device %d last seen %v, want %v", reg.ID, g.LastSeen, st.LastSeen)
	}
	if g.Seq != st.Seq || g.AppliedVersion != st.AppliedVersion || g.ConfigError != st.ConfigError || !bytes.Equal(g.State, st.State) {
		t.Errorf("device %d state: got seq %d applied %d error %q state %q; want seq %d applied %d error %q state %q",
			reg.ID, g.Seq, g.AppliedVersion, g.ConfigError, g.State, st.Seq, st.AppliedVersion, st.ConfigError, st.State)
	}
}

func brief(d fleet.DeviceRecord) fleet.DeviceRecord {
	d.State = fleet.StateRecord{}
	return d
}

func checkProfile(t *testing.T, got, want fleet.Profile) {
	t.Helper()
	if got.ID != want.ID || got.DeviceType != want.DeviceType || got.Firmware != want.Firmware || got.Version != want.Version ||
		!bytes.Equal(got.Config, want.Config) || got.PushInterval != want.PushInterval ||
		got.CreatedAt.UnixMilli() != want.CreatedAt.UnixMilli() || got.UpdatedAt.UnixMilli() != want.UpdatedAt.UnixMilli() {
		t.Errorf("profile %d:\n got %+v (config %s)\nwant %+v (config %s)", want.ID, got, got.Config, want, want.Config)
	}
}

func checkSamples(t *testing.T, what string, got, want []fleet.Sample) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("%s: %d samples, want %d", what, len(got), len(want))
		return
	}
	for i := range got {
		if !sameSample(got[i], want[i]) {
			t.Errorf("%s: sample %d:\n got %s\nwant %s", what, i, fmtSample(got[i]), fmtSample(want[i]))
			return
		}
	}
}
