package emulator

import (
	"sort"
	"testing"
	"time"
)

func scheduleEngine(n int) *engine {
	e := &engine{cfg: Config{Interval: 200 * time.Second}, id: newIdentity("schedule")}
	e.devs = make([]*device, n)
	for i := range e.devs {
		e.devs[i] = &device{idx: i}
	}
	return e
}

// The fleet schedule holds every device once, in the order of its phase.
func TestFleetScheduleOrder(t *testing.T) {
	e := scheduleEngine(10000)
	s := e.fleetSchedule()
	if len(s) != len(e.devs) {
		t.Fatalf("%d scheduled of %d", len(s), len(e.devs))
	}
	seen := make([]bool, len(e.devs))
	for i, sd := range s {
		if sd.phase != e.id.phase(sd.d.idx, e.cfg.Interval) {
			t.Fatalf("device %d: phase %v, want %v", sd.d.idx, sd.phase, e.id.phase(sd.d.idx, e.cfg.Interval))
		}
		if seen[sd.d.idx] {
			t.Fatalf("device %d twice", sd.d.idx)
		}
		seen[sd.d.idx] = true
		if i > 0 && s[i-1].phase > sd.phase {
			t.Fatalf("out of order at %d: %v > %v", i, s[i-1].phase, sd.phase)
		}
	}
	if s[0].phase == s[len(s)-1].phase {
		t.Fatal("every device has the same phase")
	}
}

// BenchmarkFleetSchedule: the schedule of a million devices, as built now
// and as runFleet built it before (sorting the devices, each comparison
// computing both phases), which ran after the fleet's clock had started.
func BenchmarkFleetSchedule(b *testing.B) {
	e := scheduleEngine(1_000_000)
	b.Run("phases-once", func(b *testing.B) {
		for b.Loop() {
			e.fleetSchedule()
		}
	})
	b.Run("sort-devices", func(b *testing.B) {
		for b.Loop() {
			order := make([]*device, len(e.devs))
			copy(order, e.devs)
			phase := func(d *device) time.Duration { return e.id.phase(d.idx, e.cfg.Interval) }
			sort.Slice(order, func(i, j int) bool { return phase(order[i]) < phase(order[j]) })
		}
	})
}
