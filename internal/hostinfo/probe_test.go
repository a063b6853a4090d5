package hostinfo

import (
	"testing"
	"time"
)

// The probe measures something: more than nothing, less than a second a
// round trip even on a loaded machine.
func TestProbeCPU(t *testing.T) {
	d := ProbeCPU()
	t.Logf("%v per round trip", d)
	if d <= 0 || d > time.Second {
		t.Fatalf("ProbeCPU() = %v, want a few microseconds", d)
	}
}
