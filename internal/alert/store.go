package alert

import (
	"context"
	"errors"
	"slices"
	"sort"
	"sync"
	"time"
)

// Store keeps rules, events, sync history and settings. Every store backend
// implements it (internal/store/storetest runs alerttest.Run on each);
// MemStore keeps everything in memory. IDs of deleted rules and pruned
// events are never handed out again: MaxRuleID and MaxEventID count them.
type Store interface {
	LoadRules(ctx context.Context) ([]Rule, error)
	// MaxRuleID is the highest rule ID ever stored, deleted ones included.
	MaxRuleID(ctx context.Context) (uint64, error)
	// SaveRule inserts or replaces the rule with r.ID.
	SaveRule(ctx context.Context, r Rule) error
	DeleteRule(ctx context.Context, id uint64) error
	// SaveEvents inserts or replaces events by ID, atomically.
	SaveEvents(ctx context.Context, evs []Event) error
	// Events returns events newest first (by ID).
	Events(ctx context.Context, q EventQuery) ([]Event, error)
	// MaxEventID is the highest event ID ever stored, pruned ones included
	// (0: none).
	MaxEventID(ctx context.Context) (uint64, error)
	SaveSyncEvents(ctx context.Context, evs []SyncEvent) error
	// SyncEvents returns a device's sync history, newest first.
	SyncEvents(ctx context.Context, deviceID uint64, limit int) ([]SyncEvent, error)
	// PruneEvents deletes cleared events and sync events older than before.
	PruneEvents(ctx context.Context, before time.Time) (int64, error)
	// Setting reads a value ("" when unset); PutSetting writes it.
	Setting(ctx context.Context, key string) (string, error)
	PutSetting(ctx context.Context, key, value string) error
}

// EventQuery selects events. Zero fields match everything.
type EventQuery struct {
	DeviceID uint64
	RuleID   uint64
	Active   bool   // only events not cleared
	Before   uint64 // only IDs below this (paging)
	Limit    int    // default 100, at most 1000
}

// EffectiveLimit is the limit a Store applies: Limit, or 100 when out of
// range.
func (q EventQuery) EffectiveLimit() int {
	if q.Limit <= 0 || q.Limit > 1000 {
		return 100
	}
	return q.Limit
}

// Matches reports whether e satisfies q's filters (not the limit).
func (q EventQuery) Matches(e *Event) bool {
	return (q.DeviceID == 0 || e.DeviceID == q.DeviceID) && (q.RuleID == 0 || e.RuleID == q.RuleID) &&
		(!q.Active || e.ClearedAt == nil) && (q.Before == 0 || e.ID < q.Before)
}

// ErrNotFound is returned for an unknown rule.
var ErrNotFound = errors.New("not found")

// MemStore is a Store in memory, for the memory persistence mode and tests.
type MemStore struct {
	mu       sync.Mutex
	rules    map[uint64]Rule
	events   map[uint64]Event
	sync     []SyncEvent
	settings map[string]string
	maxRule  uint64 // highest rule ID ever saved
	maxEvent uint64 // highest event ID ever saved
	Fail     error  // when set, writes fail with it
}

// NewMemStore returns an empty MemStore.
func NewMemStore() *MemStore {
	return &MemStore{rules: map[uint64]Rule{}, events: map[uint64]Event{}, settings: map[string]string{}}
}

func (m *MemStore) LoadRules(ctx context.Context) ([]Rule, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]Rule, 0, len(m.rules))
	for _, r := range m.rules {
		r.Email = slices.Clone(r.Email)
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

func (m *MemStore) SaveRule(ctx context.Context, r Rule) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.Fail != nil {
		return m.Fail
	}
	r.Email = slices.Clone(r.Email)
	m.rules[r.ID] = r
	m.maxRule = max(m.maxRule, r.ID)
	return nil
}

func (m *MemStore) MaxRuleID(ctx context.Context) (uint64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.maxRule, nil
}

func (m *MemStore) DeleteRule(ctx context.Context, id uint64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.Fail != nil {
		return m.Fail
	}
	if _, ok := m.rules[id]; !ok {
		return ErrNotFound
	}
	delete(m.rules, id)
	return nil
}

func (m *MemStore) SaveEvents(ctx context.Context, evs []Event) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.Fail != nil {
		return m.Fail
	}
	for _, e := range evs {
		m.events[e.ID] = e
		m.maxEvent = max(m.maxEvent, e.ID)
	}
	return nil
}

func (m *MemStore) Events(ctx context.Context, q EventQuery) ([]Event, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := []Event{}
	for _, e := range m.events {
		if q.Matches(&e) {
			out = append(out, e)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID > out[j].ID })
	if len(out) > q.EffectiveLimit() {
		out = out[:q.EffectiveLimit()]
	}
	return out, nil
}

func (m *MemStore) MaxEventID(ctx context.Context) (uint64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.maxEvent, nil
}

func (m *MemStore) SaveSyncEvents(ctx context.Context, evs []SyncEvent) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.Fail != nil {
		return m.Fail
	}
	m.sync = append(m.sync, evs...)
	return nil
}

func (m *MemStore) SyncEvents(ctx context.Context, deviceID uint64, limit int) ([]SyncEvent, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if limit <= 0 {
		limit = 100
	}
	out := []SyncEvent{}
	for i := len(m.sync) - 1; i >= 0 && len(out) < limit; i-- {
		if m.sync[i].DeviceID == deviceID {
			out = append(out, m.sync[i])
		}
	}
	return out, nil
}

func (m *MemStore) PruneEvents(ctx context.Context, before time.Time) (int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var n int64
	for id, e := range m.events {
		if e.ClearedAt != nil && e.ClearedAt.Before(before) {
			delete(m.events, id)
			n++
		}
	}
	kept := m.sync[:0]
	for _, s := range m.sync {
		if s.At.Before(before) {
			n++
			continue
		}
		kept = append(kept, s)
	}
	m.sync = kept
	return n, nil
}

func (m *MemStore) Setting(ctx context.Context, key string) (string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.settings[key], nil
}

func (m *MemStore) PutSetting(ctx context.Context, key, value string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.Fail != nil {
		return m.Fail
	}
	m.settings[key] = value
	return nil
}
