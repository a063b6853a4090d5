package sqlite

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// Under commits without a pause, the WAL stays short: the checkpointer takes
// the writer for a last pass once it is restartFrames long, and the writer
// starts it again. Without that last pass (restartFrames out of reach) the
// passes never catch up and the WAL only grows.
func TestCheckpointerBoundsWAL(t *testing.T) {
	if testing.Short() {
		t.Skip("writes for 3 s")
	}
	oldEvery, oldFrames, oldRest := checkpointEvery, restartFrames, restartRest
	checkpointEvery, restartFrames, restartRest = 10*time.Millisecond, 256, 64
	t.Cleanup(func() { checkpointEvery, restartFrames, restartRest = oldEvery, oldFrames, oldRest })

	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "d.db")
	s, err := Open(ctx, path, true)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var mu sync.Mutex
	restarts, frames := 0, int64(0)
	s.ObserveUpkeep(func(work string, n int64, took time.Duration, err error) {
		if err != nil {
			t.Errorf("%s: %v", work, err)
		}
		mu.Lock()
		defer mu.Unlock()
		if work == "wal_restart" {
			restarts++
		}
		frames += n
	})
	if _, err := s.w.Exec(`CREATE TABLE filler (b BLOB)`); err != nil {
		t.Fatal(err)
	}
	// 16 KiB a commit, one after the other, for 3 s: tens of megabytes.
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); {
		if _, err := s.w.Exec(`INSERT INTO filler VALUES (randomblob(16384))`); err != nil {
			t.Fatal(err)
		}
	}
	fi, err := os.Stat(path + "-wal")
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	// The WAL file keeps its longest length: at most restartFrames, plus what
	// was committed while the passes ran, plus the last pass's wait.
	t.Logf("WAL file %d bytes, %d restarting passes", fi.Size(), restarts)
	if limit := 4 * restartFrames * 4120; fi.Size() > limit || restarts == 0 {
		t.Errorf("WAL file %d bytes (limit %d) after %d frames checkpointed; %d restarting passes", fi.Size(), limit, frames, restarts)
	}
}

// A pass's count of copied frames is never negative: a pass that could not
// run reports -1 (the server's counter of them panicked on it).
func TestWALLenAdvance(t *testing.T) {
	for _, c := range []struct {
		last         walLen
		frames, done int64
		copied       int64
		next         walLen
	}{
		{walLen{100, 40}, 120, 90, 50, walLen{120, 90}}, // same WAL, further along
		{walLen{100, 40}, 30, 30, 30, walLen{30, 30}},   // started again meanwhile
		{walLen{100, 40}, -1, -1, 0, walLen{100, 40}},   // busy: nothing ran
		{walLen{0, 0}, 0, 0, 0, walLen{0, 0}},
	} {
		copied, next := c.last.advance(c.frames, c.done)
		if copied != c.copied || next != c.next {
			t.Errorf("%+v.advance(%d, %d) = %d, %+v; want %d, %+v", c.last, c.frames, c.done, copied, next, c.copied, c.next)
		}
	}
}
