package fleet

import (
	"context"
	"encoding/json"
	"sync"
	"sync/atomic"
	"time"
)

// profileKey identifies a profile.
type profileKey struct{ deviceType, firmware string }

// profileEntry holds a profile that devices point at. Updates swap the
// pointer, so readers never lock.
type profileEntry struct {
	p     atomic.Pointer[Profile]
	ready chan struct{} // closed once the profile is durable
	err   error         // set before ready closes if creation failed
}

func (e *profileEntry) get() *Profile { return e.p.Load() }
func (e *profileEntry) version() int64 {
	return e.p.Load().Version
}
func (e *profileEntry) interval() int { return e.p.Load().PushInterval }

// profiles is the in-memory set of profiles.
type profiles struct {
	mu     sync.Mutex
	byKey  map[profileKey]*profileEntry
	byID   map[uint64]*profileEntry
	nextID uint64
}

func newProfiles(loaded []Profile, maxID uint64) *profiles {
	ps := &profiles{byKey: make(map[profileKey]*profileEntry), byID: make(map[uint64]*profileEntry), nextID: maxID + 1}
	for i := range loaded {
		p := loaded[i]
		e := &profileEntry{ready: make(chan struct{})}
		e.p.Store(&p)
		close(e.ready)
		ps.byKey[profileKey{p.DeviceType, p.Firmware}] = e
		ps.byID[p.ID] = e
		if p.ID >= ps.nextID {
			ps.nextID = p.ID + 1
		}
	}
	return ps
}

// ensure returns the profile for key, creating the default profile exactly
// once when the key is new. Concurrent callers for a new key wait for the
// one that creates it.
func (s *Service) ensureProfile(ctx context.Context, key profileKey) (*profileEntry, error) {
	ps := s.profiles
	ps.mu.Lock()
	e, ok := ps.byKey[key]
	if ok {
		ps.mu.Unlock()
		select {
		case <-e.ready:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if e.err != nil {
			return nil, e.err
		}
		return e, nil
	}
	now := s.now().UTC().Truncate(time.Millisecond)
	p := &Profile{
		ID: ps.nextID, DeviceType: key.deviceType, Firmware: key.firmware,
		Version: 0, Config: json.RawMessage(`{}`), PushInterval: s.opts.DefaultPushInterval,
		CreatedAt: now, UpdatedAt: now,
	}
	ps.nextID++
	e = &profileEntry{ready: make(chan struct{})}
	e.p.Store(p)
	ps.byKey[key] = e
	ps.byID[p.ID] = e
	ps.mu.Unlock()

	err := persist(ctx, s.persist, func(b *Batch) { b.Profiles = append(b.Profiles, *p) })
	if err != nil {
		// Let a later registration try again.
		ps.mu.Lock()
		delete(ps.byKey, key)
		delete(ps.byID, p.ID)
		ps.mu.Unlock()
		e.err = err
		close(e.ready)
		return nil, err
	}
	s.log.Info("profile created", "profile_id", p.ID, "device_type", key.deviceType, "firmware", key.firmware)
	close(e.ready)
	return e, nil
}

// maxVersion is the highest configuration version of any profile: versions
// are unique across profiles so that a device moving between profiles never
// mistakes another profile's configuration for its own.
func (ps *profiles) maxVersion() int64 {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	var v int64
	for _, e := range ps.byID {
		if p := e.get(); p != nil {
			v = max(v, p.Version)
		}
	}
	return v
}

// Profiles returns every profile ordered by ID.
func (s *Service) Profiles() []Profile {
	ps := s.profiles
	ps.mu.Lock()
	out := make([]Profile, 0, len(ps.byID))
	for _, e := range ps.byID {
		select {
		case <-e.ready:
			if e.err == nil {
				out = append(out, *e.get())
			}
		default:
		}
	}
	ps.mu.Unlock()
	sortProfiles(out)
	return out
}

// Profile returns one profile.
func (s *Service) Profile(id uint64) (Profile, bool) {
	ps := s.profiles
	ps.mu.Lock()
	e, ok := ps.byID[id]
	ps.mu.Unlock()
	if !ok {
		return Profile{}, false
	}
	<-e.ready
	if e.err != nil {
		return Profile{}, false
	}
	return *e.get(), true
}

// ProfileUpdate changes a profile; nil fields stay as they are.
type ProfileUpdate struct {
	Config       json.RawMessage `json:"config,omitempty"`
	PushInterval *int            `json:"push_interval,omitempty"`
}

// UpdateProfile checks u (a *FieldError when it breaks a rule) and applies
// it durably. A configuration change gives the profile a version above every
// profile's, which puts its devices into Sync pending.
func (s *Service) UpdateProfile(ctx context.Context, id uint64, u ProfileUpdate) (Profile, error) {
	if err := u.Normalize(); err != nil {
		return Profile{}, err
	}
	ps := s.profiles
	ps.mu.Lock()
	e, ok := ps.byID[id]
	ps.mu.Unlock()
	if !ok {
		return Profile{}, ErrNotFound
	}
	<-e.ready
	if e.err != nil {
		return Profile{}, ErrNotFound
	}
	s.profileWrite.Lock()
	defer s.profileWrite.Unlock()
	next := *e.get()
	if u.Config != nil {
		next.Config = u.Config
		next.Version = s.profiles.maxVersion() + 1
	}
	if u.PushInterval != nil {
		next.PushInterval = *u.PushInterval
	}
	next.UpdatedAt = s.now().UTC().Truncate(time.Millisecond)
	if err := persist(ctx, s.persist, func(b *Batch) { b.Profiles = append(b.Profiles, next) }); err != nil {
		return Profile{}, err
	}
	e.p.Store(&next)
	s.log.Info("profile updated", "profile_id", next.ID, "version", next.Version)
	return next, nil
}
