package storetest

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/drover/drover/internal/alert"
	"github.com/drover/drover/internal/alert/alerttest"
	"github.com/drover/drover/internal/fleet"
	"github.com/drover/drover/internal/sessions"
)

// testAlerts runs the alert store checks (alerttest, which MemStore passes
// too) on the backend.
func testAlerts(t *testing.T, h *handle) {
	alerttest.Run(t, h.store)
	// Settings keep any text, and survive a restart.
	const smtp = `{"host":"mail.example:587","from":"ü 'q' \"x\" \\"}`
	if err := h.store.PutSetting(testCtx(t), "smtp", smtp); err != nil {
		t.Fatal(err)
	}
	if v, err := h.reopen().Setting(testCtx(t), "smtp"); err != nil || v != smtp {
		t.Fatalf("setting after restart: %q %v", v, err)
	}
}

// testLabels: labels and assignments survive a restart; names are unique;
// assigning twice is no error; deleting drops the assignments.
func testLabels(t *testing.T, h *handle) {
	ctx := testCtx(t)
	s := h.store
	for _, l := range []fleet.Label{{ID: 1, Name: "north"}, {ID: 2, Name: "south"}, {ID: 4, Name: "Nörth 😀 'x'"}} {
		if err := s.CreateLabel(ctx, l); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.CreateLabel(ctx, fleet.Label{ID: 3, Name: "north"}); err == nil {
		t.Fatal("duplicate label name accepted")
	}
	if err := s.AssignLabel(ctx, 1, []uint64{10, 11, 12}, true); err != nil {
		t.Fatal(err)
	}
	if err := s.AssignLabel(ctx, 1, []uint64{12, 13}, true); err != nil { // 12 again: no error
		t.Fatal(err)
	}
	if err := s.AssignLabel(ctx, 2, []uint64{10}, true); err != nil {
		t.Fatal(err)
	}
	if err := s.AssignLabel(ctx, 1, []uint64{11}, false); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteLabel(ctx, 2); err != nil {
		t.Fatal(err)
	}
	s = h.reopen()
	got := map[uint64]uint16{}
	labels, err := s.LoadLabels(ctx, func(dev uint64, id uint16) error {
		if _, dup := got[dev]; dup {
			t.Errorf("device %d twice", dev)
		}
		got[dev] = id
		return nil
	})
	if err != nil || len(labels) != 2 || labels[0] != (fleet.Label{ID: 1, Name: "north"}) || labels[1] != (fleet.Label{ID: 4, Name: "Nörth 😀 'x'"}) {
		t.Fatalf("labels %+v %v", labels, err)
	}
	if len(got) != 3 || got[10] != 1 || got[12] != 1 || got[13] != 1 {
		t.Fatalf("assignments %v", got)
	}
}

// testSessions: a session is found by its hash until deleted or pruned,
// across a restart.
func testSessions(t *testing.T, h *handle) {
	ctx := testCtx(t)
	now := time.Now().UTC().Truncate(time.Millisecond)
	live := sessions.Session{Hash: sessions.Hash("cookie-1"), CSRF: "csrf-1", Expires: now.Add(time.Hour), User: "Zoë", Credential: "password"}
	old := sessions.Session{Hash: sessions.Hash("cookie-2"), CSRF: "csrf-2", Expires: now.Add(-time.Minute)}
	for _, s := range []sessions.Session{live, old} {
		if err := h.store.SaveSession(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := h.store.LoadSession(ctx, sessions.Hash("cookie-3")); !errors.Is(err, sessions.ErrNotFound) {
		t.Fatalf("unknown session: %v", err)
	}
	s := h.reopen()
	got, err := s.LoadSession(ctx, live.Hash)
	if err != nil || !bytes.Equal(got.Hash, live.Hash) || got.CSRF != live.CSRF || !got.Expires.Equal(live.Expires) ||
		got.User != live.User || got.Credential != live.Credential {
		t.Fatalf("session after restart: %+v %v; want %+v", got, err, live)
	}
	if n, err := s.PruneSessions(ctx, now); err != nil || n != 1 {
		t.Fatalf("prune: %d %v; want 1 expired", n, err)
	}
	if _, err := s.LoadSession(ctx, old.Hash); !errors.Is(err, sessions.ErrNotFound) {
		t.Fatalf("pruned session: %v", err)
	}
	if err := s.DeleteSession(ctx, live.Hash); err != nil {
		t.Fatal(err)
	}
	if _, err := s.LoadSession(ctx, live.Hash); !errors.Is(err, sessions.ErrNotFound) {
		t.Fatalf("deleted session: %v", err)
	}
}

// testIDsNotReused: create, delete, restart, create — the new ID is larger
// than the deleted one, for rules, events and labels.
func testIDsNotReused(t *testing.T, h *handle) {
	ctx := testCtx(t)
	s := h.store
	t1 := time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)
	for id := uint64(1); id <= 3; id++ {
		if err := s.SaveRule(ctx, alert.Rule{ID: id, Name: "r", Kind: alert.Offline, Seconds: 600, Severity: alert.Warning, CreatedAt: t1, UpdatedAt: t1}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.DeleteRule(ctx, 3); err != nil {
		t.Fatal(err)
	}
	cleared := t1.Add(time.Minute)
	if err := s.SaveEvents(ctx, []alert.Event{
		{ID: 1, RuleID: 1, DeviceID: 7, State: alert.Raised, RaisedAt: t1},
		{ID: 2, RuleID: 1, DeviceID: 7, State: alert.Cleared, RaisedAt: t1, ClearedAt: &cleared},
	}); err != nil {
		t.Fatal(err)
	}
	if n, err := s.PruneEvents(ctx, t1.Add(time.Hour)); err != nil || n != 1 {
		t.Fatalf("prune events: %d %v", n, err)
	}
	for _, l := range []fleet.Label{{ID: 1, Name: "a"}, {ID: 2, Name: "b"}} {
		if err := s.CreateLabel(ctx, l); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.DeleteLabel(ctx, 2); err != nil {
		t.Fatal(err)
	}
	s = h.reopen()
	if id, err := s.MaxRuleID(ctx); err != nil || id != 3 {
		t.Errorf("MaxRuleID after deleting rule 3 and a restart: %d %v; want 3 (a new rule gets 4)", id, err)
	}
	if id, err := s.MaxEventID(ctx); err != nil || id != 2 {
		t.Errorf("MaxEventID after pruning event 2 and a restart: %d %v; want 2", id, err)
	}
	if id, err := s.MaxLabelID(ctx); err != nil || id != 2 {
		t.Errorf("MaxLabelID after deleting label 2 and a restart: %d %v; want 2", id, err)
	}
}

// svcIDsNotReused: through the domain — the fleet's labels and the alert
// engine's rules — a name created after its predecessor was deleted and
// the server restarted gets a new, larger ID.
func svcIDsNotReused(t *testing.T, e *env) {
	ctx := e.ctx
	attach := func() *alert.Engine { // the fleet loaded its labels (fleet.New)
		eng, err := alert.New(ctx, alert.Options{Fleet: e.svc, Store: e.h.store})
		if err != nil {
			t.Fatal(err)
		}
		return eng
	}
	eng := attach()
	l1, err := e.svc.CreateLabel(ctx, "one")
	if err != nil {
		t.Fatal(err)
	}
	l2, err := e.svc.CreateLabel(ctx, "two")
	if err != nil {
		t.Fatal(err)
	}
	rule := alert.Rule{Name: "gone", Kind: alert.Offline, Seconds: 600, Severity: alert.Warning}
	r1, err := eng.CreateRule(ctx, rule)
	if err != nil {
		t.Fatal(err)
	}
	rule.Name = "gone too"
	r2, err := eng.CreateRule(ctx, rule)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.svc.DeleteLabel(ctx, "two"); err != nil {
		t.Fatal(err)
	}
	if err := eng.DeleteRule(ctx, r2.ID); err != nil {
		t.Fatal(err)
	}
	e.restart()
	eng = attach()
	l3, err := e.svc.CreateLabel(ctx, "three")
	if err != nil {
		t.Fatal(err)
	}
	if l3.ID <= l2.ID || l2.ID <= l1.ID {
		t.Errorf("label IDs %d, %d (deleted), then after a restart %d: reused", l1.ID, l2.ID, l3.ID)
	}
	rule.Name = "new"
	r3, err := eng.CreateRule(ctx, rule)
	if err != nil {
		t.Fatal(err)
	}
	if r3.ID <= r2.ID || r2.ID <= r1.ID {
		t.Errorf("rule IDs %d, %d (deleted), then after a restart %d: reused", r1.ID, r2.ID, r3.ID)
	}
}
