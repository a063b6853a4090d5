package emulator

import (
	"strconv"
	"strings"
	"testing"
)

func TestMachineIDKinds(t *testing.T) {
	const n = 5000
	seen := map[string]bool{}
	prev := ""
	prefix := SequentialMachineID("run-a", 0)[:8]
	for i := 0; i < n; i++ {
		seq := SequentialMachineID("run-a", i)
		if len(seq) != 32 || !strings.HasPrefix(seq, prefix) {
			t.Fatalf("sequential ID %d = %q: want 32 characters after prefix %q", i, seq, prefix)
		}
		if v, err := strconv.Atoi(seq[8:]); err != nil || v != i {
			t.Fatalf("sequential ID %d = %q: its counter reads %d (%v)", i, seq, v, err)
		}
		if seq <= prev {
			t.Fatalf("sequential ID %d = %q does not sort after %q", i, seq, prev)
		}
		prev = seq
		rnd := MachineID("run-a", i)
		if len(rnd) != 32 {
			t.Fatalf("random ID %d = %q: want 32 characters", i, rnd)
		}
		for _, id := range []string{seq, rnd} {
			if seen[id] {
				t.Fatalf("ID %q generated twice", id)
			}
			seen[id] = true
		}
	}
	// Another run's sequential IDs differ from this run's.
	if other := SequentialMachineID("run-b", 7); other[:8] == prefix || other == SequentialMachineID("run-a", 7) {
		t.Fatalf("sequential IDs of seeds run-a and run-b share the prefix: %q", other)
	}
	// Devices take the identity's kind.
	id := newIdentity("run-a")
	if d := newDevice(id, 3); d.machineID != MachineID("run-a", 3) {
		t.Fatalf("default device machine ID %q, want the random kind", d.machineID)
	}
	id.seqPrefix = sequentialPrefix("run-a")
	if d := newDevice(id, 3); d.machineID != SequentialMachineID("run-a", 3) {
		t.Fatalf("sequential device machine ID %q, want %q", d.machineID, SequentialMachineID("run-a", 3))
	}
}

func TestMachineIDsConfig(t *testing.T) {
	for in, want := range map[string]string{"": MachineIDsRandom, "random": MachineIDsRandom, "sequential": MachineIDsSequential, "serial": ""} {
		c := DefaultConfig()
		c.Target, c.MachineIDs = "http://127.0.0.1:1", in
		err := c.Validate()
		if want == "" {
			if err == nil {
				t.Errorf("machine IDs %q: accepted", in)
			}
			continue
		}
		if err != nil || c.MachineIDs != want {
			t.Errorf("machine IDs %q: %v, %q; want %q", in, err, c.MachineIDs, want)
		}
	}
}
