package storetest

import (
	"math"
	"testing"
	"time"

	"github.com/drover/drover/internal/fleet"
)

func init() {
	storeTests = append(storeTests, storeTest{"LoadWithoutStates", testLoadWithoutStates})
}

// loadNoStates loads with LoadOptions.NoStates and checks that Expect is
// told, once and before the first device, the highest device ID.
func loadNoStates(t *testing.T, s fleet.Store) map[uint64]fleet.DeviceRecord {
	t.Helper()
	got := map[uint64]fleet.DeviceRecord{}
	expected, calls := uint64(0), 0
	res, err := s.Load(testCtx(t), fleet.LoadOptions{NoStates: true, Expect: func(n uint64) {
		if len(got) > 0 {
			t.Errorf("Expect called after %d devices", len(got))
		}
		expected, calls = n, calls+1
	}}, func(d fleet.DeviceRecord) error {
		if _, dup := got[d.ID]; dup {
			t.Errorf("Load gave device %d twice", d.ID)
		}
		got[d.ID] = d
		return nil
	})
	if err != nil {
		t.Fatalf("load without states: %v", err)
	}
	if calls != 1 || expected != res.MaxDeviceID {
		t.Errorf("Expect called %d times with %d; want once with the highest device ID %d", calls, expected, res.MaxDeviceID)
	}
	return got
}

// Load without the state documents gives every other field of the newest
// states, after a restart (what the store read at open) and after more
// commits.
func testLoadWithoutStates(t *testing.T, h *handle) {
	s := h.store
	var devs []fleet.DeviceRecord
	newest := map[uint64]fleet.StateRecord{}
	var b fleet.Batch
	for i := uint64(1); i <= 40; i++ {
		if i%10 == 0 {
			continue // IDs need not be dense
		}
		d := device(i, "load-"+string(rune('a'+i%26))+string(rune('a'+i/26)))
		devs = append(devs, d)
		b.Devices = append(b.Devices, d)
		if i%4 != 0 { // some never pushed
			st := state(i, i, t0.Add(time.Duration(i)*time.Minute))
			if i%5 == 0 {
				st.ConfigError, st.Firmware, st.AppliedVersion = "apply failed: 'x' ü", "7.05", math.MaxInt64
			}
			b.States = append(b.States, st)
			newest[i] = st
		}
	}
	commit(t, s, &b)
	// A second push of some: the later wins.
	b = fleet.Batch{}
	for i := uint64(1); i <= 40; i += 3 {
		if _, ok := newest[i]; ok {
			st := state(i, 100+i, t0.Add(time.Hour+time.Duration(i)*time.Second))
			b.States = append(b.States, st)
			newest[i] = st
		}
	}
	commit(t, s, &b)
	check := func(got map[uint64]fleet.DeviceRecord) {
		t.Helper()
		if len(got) != len(devs) {
			t.Errorf("loaded %d devices, want %d", len(got), len(devs))
		}
		for _, d := range devs {
			g, ok := got[d.ID]
			if !ok {
				t.Errorf("device %d not loaded", d.ID)
				continue
			}
			if len(g.State.State) != 0 {
				t.Errorf("device %d: state document %q loaded with NoStates", d.ID, g.State.State)
			}
			want := newest[d.ID]
			want.State = nil
			checkDevice(t, g, d, want)
		}
	}
	check(loadNoStates(t, s))
	s = h.reopen()
	check(loadNoStates(t, s))
	// With the documents, after the restart, as before.
	l := load(t, s)
	for _, d := range devs {
		checkDevice(t, l.devices[d.ID], d, newest[d.ID])
	}
	s = h.reopen()
	st := state(1, 1000, t0.Add(2*time.Hour))
	st.Firmware = "7.06"
	commit(t, s, &fleet.Batch{States: []fleet.StateRecord{st}})
	newest[1] = st
	check(loadNoStates(t, s))
}
