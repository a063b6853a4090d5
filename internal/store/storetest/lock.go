package storetest

import (
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/internal/fleet"
	"github.com/drover/drover/internal/store/contract"
	"github.com/drover/drover/internal/store/internal/instlock"
	"github.com/drover/drover/internal/testwait"
)

// testInstanceLock: while a store is open, opening the same database again
// fails with an error naming the holder; after Close it opens.
func testInstanceLock(t *testing.T, h *handle) {
	s2, err := h.open(t)
	if err == nil {
		s2.Close()
		t.Fatal("a second open of an open store succeeded")
	}
	var held *instlock.HeldError
	if !errors.As(err, &held) {
		t.Fatalf("second open: %v; want an *instlock.HeldError", err)
	}
	host, _ := os.Hostname()
	if held.Holder.PID != os.Getpid() || held.Holder.Host != host || time.Since(held.Holder.Since) > time.Hour || time.Since(held.Holder.Since) < 0 {
		t.Errorf("holder %+v; want host %s, PID %d, since a moment ago", held.Holder, host, os.Getpid())
	}
	if msg := err.Error(); !strings.Contains(msg, "PID "+strconv.Itoa(os.Getpid())) || !strings.Contains(msg, host) || !strings.Contains(msg, "since") {
		t.Errorf("message does not name the holder: %s", msg)
	}
	if err := h.store.LockLost(); err != nil {
		t.Errorf("the holder says its lock is lost: %v", err)
	}
	commit(t, h.store, &fleet.Batch{Devices: []fleet.DeviceRecord{device(1, "m-1")}})
	s := h.reopen()
	if err := s.LockLost(); err != nil {
		t.Errorf("after reopen the lock is lost: %v", err)
	}
	commit(t, s, &fleet.Batch{Devices: []fleet.DeviceRecord{device(2, "m-2")}})
}

// RunTakeover checks what happens when the database ends the session that
// holds a store's instance lock (kill does that, as a database restart
// would) and another server opens the store before the first takes the
// lock back: the second server gets the store, and the first one's commits
// fail with instlock.ErrLost instead of mixing in.
func RunTakeover(t *testing.T, newDB NewDB, kill func(t testing.TB, s contract.Store)) {
	open := newDB(t)
	a := open.mustOpen(t)
	defer a.Close()
	commit(t, a, &fleet.Batch{Devices: []fleet.DeviceRecord{device(1, "m-1")}})
	var b contract.Store
	for try := 0; b == nil; try++ {
		kill(t, a)
		s, err := open(t)
		var held *instlock.HeldError
		switch {
		case err == nil:
			b = s
		case !errors.As(err, &held):
			t.Fatalf("open after the holder's session ended: %v", err)
		case try == 20:
			t.Fatalf("the first store took its lock back 20 times before the second could open: %v", err)
		}
	}
	defer b.Close()
	err := a.Commit(testCtx(t), &fleet.Batch{Devices: []fleet.DeviceRecord{device(2, "m-2")}})
	if !errors.Is(err, instlock.ErrLost) {
		t.Fatalf("commit by the server that lost the lock: %v; want instlock.ErrLost", err)
	}
	if err := a.LockLost(); !errors.Is(err, instlock.ErrLost) {
		t.Errorf("LockLost after a fenced commit: %v", err)
	}
	commit(t, b, &fleet.Batch{Devices: []fleet.DeviceRecord{device(3, "m-3")}})
	l := load(t, b)
	if _, ok := l.devices[2]; ok || len(l.devices) != 2 {
		t.Errorf("the new holder loaded %d devices (device 2 present: %v); want devices 1 and 3", len(l.devices), ok)
	}
	// The first server's keeper finds the lock held by the second.
	testwait.Until(30*time.Second, func() bool { return a.LockLost() != nil })
	if err := a.LockLost(); err == nil {
		t.Error("the first server still says it holds the lock")
	}
}
