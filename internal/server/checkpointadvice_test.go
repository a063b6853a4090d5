package server

import "testing"

func TestNeedsCheckpointRoom(t *testing.T) {
	for _, tc := range []struct {
		devices int
		maxWAL  int64
		want    bool
	}{
		{1_000_000, 1 << 30, true},   // the defaults under the fleet test
		{100_000, 1 << 30, true},     // from largeFleet on
		{99_999, 1 << 30, false},     // a smaller fleet: the defaults will do
		{1_000_000, 16 << 30, false}, // the advice followed
		{1_000_000, 4 << 30, false},  // roomyWAL itself is enough
		{1_000_000, 4<<30 - 1, true},
	} {
		if got := needsCheckpointRoom(tc.devices, tc.maxWAL); got != tc.want {
			t.Errorf("needsCheckpointRoom(%d, %d) = %v, want %v", tc.devices, tc.maxWAL, got, tc.want)
		}
	}
}
