package server

import (
	"context"
	"runtime/debug"
	"testing"
)

// GOGC is raised for the load and restored after it, unless it was higher
// already or off.
func TestGCForLoad(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	for _, c := range []struct{ before, during int }{{75, loadGCPercent}, {loadGCPercent + 100, loadGCPercent + 100}, {-1, -1}, {0, loadGCPercent}} {
		debug.SetGCPercent(c.before)
		s := &Server{}
		s.gcForLoad(context.Background())
		if got := debug.SetGCPercent(c.during); got != c.during {
			t.Errorf("GOGC %d: %d during the load, want %d", c.before, got, c.during)
		}
		s.gcAfterLoad(context.Background())
		if got := debug.SetGCPercent(c.before); got != c.before {
			t.Errorf("GOGC %d: %d after the load", c.before, got)
		}
		s.gcAfterLoad(context.Background()) // a second call changes nothing
		if got := debug.SetGCPercent(c.before); got != c.before {
			t.Errorf("GOGC %d: %d after a second call", c.before, got)
		}
	}
}
