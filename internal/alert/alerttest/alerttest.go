// Package alerttest checks that an alert.Store keeps what the alert engine
// needs. Every implementation runs Run in its tests.
package alerttest

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/drover/drover/internal/alert"
)

// Run checks s, which must be empty.
func Run(t *testing.T, s alert.Store) {
	ctx := context.Background()
	t0 := time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)

	r1 := alert.Rule{ID: 1, Name: "hot", Kind: alert.TemperatureAbove, Threshold: 80, Pushes: 2, Severity: alert.Critical,
		Label: "north", Webhook: "http://hook.example/x", Email: []string{"ops@example.com"}, CreatedAt: t0, UpdatedAt: t0}
	r2 := alert.Rule{ID: 2, Name: "gone", Kind: alert.Offline, Seconds: 600, Severity: alert.Warning, CreatedAt: t0, UpdatedAt: t0}
	for _, r := range []alert.Rule{r1, r2} {
		if err := s.SaveRule(ctx, r); err != nil {
			t.Fatalf("SaveRule: %v", err)
		}
	}
	r1.Threshold = 85
	if err := s.SaveRule(ctx, r1); err != nil {
		t.Fatalf("SaveRule update: %v", err)
	}
	rules, err := s.LoadRules(ctx)
	if err != nil || len(rules) != 2 {
		t.Fatalf("LoadRules: %v %v", rules, err)
	}
	if got := rules[0]; got.ID != 1 || got.Threshold != 85 || got.Label != "north" || !slices.Equal(got.Email, r1.Email) ||
		!got.CreatedAt.Equal(t0) || got.Webhook != r1.Webhook || got.Pushes != 2 {
		t.Fatalf("rule 1 read back as %+v", got)
	}
	if err := s.DeleteRule(ctx, 2); err != nil {
		t.Fatalf("DeleteRule: %v", err)
	}
	if rules, _ := s.LoadRules(ctx); len(rules) != 1 {
		t.Fatalf("after delete: %v", rules)
	}

	if id, err := s.MaxEventID(ctx); err != nil || id != 0 {
		t.Fatalf("MaxEventID of nothing: %d %v", id, err)
	}
	var evs []alert.Event
	for i := uint64(1); i <= 30; i++ {
		evs = append(evs, alert.Event{ID: i, RuleID: 1 + i%2, Rule: "hot", Kind: alert.TemperatureAbove, Severity: alert.Critical,
			DeviceID: 100 + i%3, DeviceType: "ICR", State: alert.Raised, Value: 90.5, Message: "hot", RaisedAt: t0.Add(time.Duration(i) * time.Minute)})
	}
	if err := s.SaveEvents(ctx, evs); err != nil {
		t.Fatalf("SaveEvents: %v", err)
	}
	cleared := t0.Add(time.Hour)
	for i := range 10 { // IDs 1..10 cleared
		evs[i].State, evs[i].ClearedAt, evs[i].ClearReason = alert.Cleared, &cleared, "ok"
	}
	if err := s.SaveEvents(ctx, evs[:10]); err != nil {
		t.Fatalf("SaveEvents update: %v", err)
	}
	if id, _ := s.MaxEventID(ctx); id != 30 {
		t.Fatalf("MaxEventID %d", id)
	}
	all, err := s.Events(ctx, alert.EventQuery{Limit: 1000})
	if err != nil || len(all) != 30 || all[0].ID != 30 || all[29].ID != 1 {
		t.Fatalf("Events: %d %v", len(all), err)
	}
	if e := all[29]; e.State != alert.Cleared || e.ClearedAt == nil || !e.ClearedAt.Equal(cleared) || e.ClearReason != "ok" ||
		e.Value != 90.5 || e.DeviceType != "ICR" || !e.RaisedAt.Equal(t0.Add(time.Minute)) {
		t.Fatalf("event 1 read back as %+v", e)
	}
	active, _ := s.Events(ctx, alert.EventQuery{Active: true, Limit: 1000})
	if len(active) != 20 || active[19].ID != 11 {
		t.Fatalf("active: %d", len(active))
	}
	page, _ := s.Events(ctx, alert.EventQuery{Before: 25, Limit: 5})
	if len(page) != 5 || page[0].ID != 24 || page[4].ID != 20 {
		t.Fatalf("page before 25: %v", ids(page))
	}
	dev, _ := s.Events(ctx, alert.EventQuery{DeviceID: 101, RuleID: 2})
	for _, e := range dev {
		if e.DeviceID != 101 || e.RuleID != 2 {
			t.Fatalf("device/rule filter gave %+v", e)
		}
	}
	if len(dev) != 5 { // i odd and i%3 == 1: 1, 7, 13, 19, 25
		t.Fatalf("device 101 rule 2: %v", ids(dev))
	}
	if d, _ := s.Events(ctx, alert.EventQuery{}); len(d) != 30 {
		t.Fatalf("default limit: %d", len(d))
	}

	var syncs []alert.SyncEvent
	for i := range 5 {
		syncs = append(syncs, alert.SyncEvent{DeviceID: 7, At: t0.Add(time.Duration(i) * time.Second), State: "sync_pending", Applied: int64(i), Desired: 9})
	}
	syncs = append(syncs, alert.SyncEvent{DeviceID: 8, At: t0, State: "sync_error", Error: "bad apn"})
	if err := s.SaveSyncEvents(ctx, syncs); err != nil {
		t.Fatalf("SaveSyncEvents: %v", err)
	}
	h, err := s.SyncEvents(ctx, 7, 3)
	if err != nil || len(h) != 3 || h[0].Applied != 4 || !h[0].At.Equal(t0.Add(4*time.Second)) || h[0].Desired != 9 {
		t.Fatalf("SyncEvents: %+v %v", h, err)
	}
	if h, _ := s.SyncEvents(ctx, 8, 10); len(h) != 1 || h[0].Error != "bad apn" || h[0].State != "sync_error" {
		t.Fatalf("SyncEvents 8: %+v", h)
	}

	// Before t0+2s: three sync events; the cleared events ended at t0+1h.
	n, err := s.PruneEvents(ctx, t0.Add(2*time.Second))
	if err != nil || n != 3 {
		t.Fatalf("PruneEvents: %d %v", n, err)
	}
	n, err = s.PruneEvents(ctx, t0.Add(2*time.Hour))
	if err != nil || n != 10+3 {
		t.Fatalf("PruneEvents later: %d %v", n, err)
	}
	if a, _ := s.Events(ctx, alert.EventQuery{Limit: 1000}); len(a) != 20 {
		t.Fatalf("after prune %d events", len(a))
	}

	if v, err := s.Setting(ctx, "smtp"); err != nil || v != "" {
		t.Fatalf("unset setting: %q %v", v, err)
	}
	for _, v := range []string{`{"a":1}`, `{"a":2}`} {
		if err := s.PutSetting(ctx, "smtp", v); err != nil {
			t.Fatalf("PutSetting: %v", err)
		}
	}
	if v, _ := s.Setting(ctx, "smtp"); v != `{"a":2}` {
		t.Fatalf("setting %q", v)
	}
}

func ids(evs []alert.Event) []uint64 {
	var out []uint64
	for _, e := range evs {
		out = append(out, e.ID)
	}
	return out
}
