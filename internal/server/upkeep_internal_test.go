package server

import (
	"errors"
	"testing"
	"time"
)

// A store's report of a step that moved nothing, or a negative count, must
// not panic the server (a Prometheus counter panics on a negative Add).
func TestObserveUpkeepOddCounts(t *testing.T) {
	m := newMetrics()
	m.observeUpkeep("checkpoint", -1, time.Millisecond, nil)
	m.observeUpkeep("checkpoint", 0, time.Millisecond, errors.New("busy"))
	m.observeUpkeep("checkpoint", 5, time.Millisecond, nil)
}
