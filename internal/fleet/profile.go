package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"slices"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Errors of the profiles' selection, approvals and deletion.
var (
	ErrNotPending    = errors.New("this firmware is not waiting for approval")
	ErrProfileInUse  = errors.New("devices use this profile")
	ErrProfileExists = errors.New("this firmware has a profile already")
)

// profileKey identifies a profile.
type profileKey struct{ deviceType, firmware string }

// profileEntry holds a profile that devices point at. Updates swap the
// pointer, so readers never lock.
type profileEntry struct {
	p     atomic.Pointer[Profile]
	ready chan struct{} // closed once the profile is durable
	err   error         // set before ready closes if creation failed
	// users counts the devices on this profile plus selections not yet
	// adopted (see selectProfile); a profile in use is never deleted.
	users atomic.Int64
	// layers are the fleet's configuration layers (layers.go); vars
	// caches whether the profile's configuration holds variables.
	layers *layerState
	vars   atomic.Pointer[profileVars]
	// stage is a configuration rollout's (layerstage.go), nil: none.
	stage atomic.Pointer[configStage]
}

func (e *profileEntry) get() *Profile { return e.p.Load() }
func (e *profileEntry) version() int64 {
	return e.p.Load().Version
}
func (e *profileEntry) interval() int { return e.p.Load().PushInterval }

// release gives back one use.
func (e *profileEntry) release() { e.users.Add(-1) }

// adopt points d at pe, which the caller selected (nil: none, for a
// deleted device); d.mu held.
func adopt(d *device, pe *profileEntry) {
	if d.profile == pe {
		if pe != nil {
			pe.release()
		}
		return
	}
	if d.profile != nil {
		d.profile.release()
	}
	d.profile = pe
}

// profiles is the profiles room: the profiles, the firmware links
// (profileselect.go) and the creations the policy counts, under its lock.
// The Service embeds it, so that its exported methods are the Service's;
// the devices point at their profile, under each device's lock.
type profiles struct {
	mu     sync.Mutex
	byKey  map[profileKey]*profileEntry
	byID   map[uint64]*profileEntry
	nextID uint64
	// links maps firmware without a profile of its own to the profile its
	// devices use; created holds, per device type, when profiles were
	// created within the policy's window (unix ns, oldest first).
	links   map[profileKey]*linkEntry
	created map[string][]int64
	layers  *layerState // given to every entry (layers.go)
	// profileWrite serialises profile updates and deletions.
	profileWrite sync.Mutex

	// Set by New: the Options of the room, and what it needs of the others.
	defaultInterval int          // Options.DefaultPushInterval
	cluster         ClusterStore // nil: one server
	persist         Persister
	devs            deviceFinder
	events          *subscribers
	now             func() time.Time
	log             *slog.Logger
	// note writes a change log entry (cluster glue, cluster.go).
	note func(ctx context.Context, kind ChangeKind, id uint64)
	// The policy room (policy.go): the policy in force, its lock with
	// its store (nil: memory only), and a link's storing.
	policy       func() ProfilePolicy
	policyLocked func(fn func(st PolicyStore) error) error
	saveLink     func(ctx context.Context, l ProfileLink)
	// quotaNote lists a device as having hit a quota (quota.go).
	quotaNote func(id uint64, reason string, now int64)
	// recordRevision keeps a profile's revision (profilehistory.go).
	recordRevision func(ctx context.Context, p *Profile, by, note string)
	// checkSchema checks a configuration against the schemas of the
	// layers its devices have (layerschema.go).
	checkSchema func(e *profileEntry, next *Profile) error
	// syncStages reads back the rollouts other nodes started before an
	// operator changes a configuration (rollout_cluster.go).
	syncStages func(ctx context.Context) error
}

// wire gives the room its options and what it needs of the others (New,
// once the profiles are loaded).
func (ps *profiles) wire(s *Service) {
	ps.defaultInterval, ps.cluster, ps.persist = s.opts.DefaultPushInterval, s.opts.Cluster, s.persist
	ps.devs, ps.events, ps.now, ps.log, ps.note = s, &s.events, s.now, s.log, s.noteChange
	ps.policy, ps.policyLocked, ps.saveLink = s.policy.profilePolicy, s.policy.locked, s.policy.saveLink
	ps.quotaNote, ps.recordRevision, ps.checkSchema = s.quota.note, s.firmwareState.recordRevision, s.layerState.checkProfileSchema
	ps.syncStages = func(ctx context.Context) error { return s.firmwareState.SyncRollouts(ctx) }
}

func newProfiles(loaded []Profile, maxID uint64, layers *layerState) *profiles {
	ps := &profiles{byKey: make(map[profileKey]*profileEntry), byID: make(map[uint64]*profileEntry), nextID: maxID + 1,
		links: map[profileKey]*linkEntry{}, created: map[string][]int64{}, layers: layers}
	for i := range loaded {
		p := loaded[i]
		e := &profileEntry{ready: make(chan struct{}), layers: layers}
		e.p.Store(&p)
		close(e.ready)
		ps.byKey[profileKey{p.DeviceType, p.Firmware}] = e
		ps.byID[p.ID] = e
		if p.ID >= ps.nextID {
			ps.nextID = p.ID + 1
		}
		ps.created[p.DeviceType] = append(ps.created[p.DeviceType], p.CreatedAt.UnixNano())
	}
	for _, c := range ps.created {
		slices.Sort(c)
	}
	return ps
}

// createProfile makes the profile for key, which has none (ps.mu held; it
// returns with ps.mu released), from base's configuration when inherit
// is set, and waits until it is durable. Concurrent selectors for key wait
// for it. The caller holds one use of the result.
func (ps *profiles) createProfile(ctx context.Context, key profileKey, base *Profile) (*profileEntry, error) {
	now := ps.now().UTC().Truncate(time.Millisecond)
	p := &Profile{
		ID: ps.nextID, DeviceType: key.deviceType, Firmware: key.firmware,
		Version: 0, Config: json.RawMessage(`{}`), PushInterval: ps.defaultInterval,
		CreatedAt: now, UpdatedAt: now,
	}
	if base != nil {
		// The same configuration keeps its version: devices that applied
		// it stay in sync across the firmware upgrade.
		p.Version, p.Config, p.PushInterval = base.Version, base.Config, base.PushInterval
	}
	ps.nextID++
	e := &profileEntry{ready: make(chan struct{}), layers: ps.layers}
	e.p.Store(p)
	e.users.Store(1)
	ps.byKey[key] = e
	cs := ps.cluster
	if cs == nil {
		ps.byID[p.ID] = e
	}
	ps.created[key.deviceType] = append(ps.created[key.deviceType], now.UnixNano())
	ps.mu.Unlock()

	var err error
	created := true // here: its first revision is this node's to record
	if cs != nil {
		// The database hands out the ID; a profile another node made for
		// the same key first is taken as it is, with its history.
		var stored Profile
		if stored, created, err = cs.ClaimProfile(ctx, *p); err == nil {
			p = &stored
			e.p.Store(p)
			ps.mu.Lock()
			ps.byID[p.ID] = e
			ps.mu.Unlock()
		}
	} else {
		err = persist(ctx, ps.persist, func(b *Batch) { b.Profiles = append(b.Profiles, *p) })
	}
	if err != nil {
		// Let a later registration try again.
		ps.mu.Lock()
		delete(ps.byKey, key)
		if ps.byID[p.ID] == e {
			delete(ps.byID, p.ID)
		}
		ps.mu.Unlock()
		e.err = err
		close(e.ready)
		return nil, err
	}
	if !created {
		close(e.ready)
		return e, nil
	}
	from, note := uint64(0), "created empty"
	if base != nil {
		from, note = base.ID, "inherited from profile "+strconv.FormatUint(base.ID, 10)+" ("+base.Firmware+")"
	}
	ps.recordRevision(ctx, p, "drover", note)
	ps.log.Info("profile created", "profile_id", p.ID, "device_type", key.deviceType, "firmware", key.firmware, "inherited_from", from)
	close(e.ready)
	return e, nil
}

// setProfile makes p the content of e. When what its devices get changes
// (the configuration's version or the push interval), the devices holding
// a persistent connection are told to push (Events.ProfileChanged). This is the
// one path of a profile's change, made here (UpdateProfile) or read back
// from the change log after another node made it (adoptProfile), so that
// a change reaches connected devices the same way whichever node took it.
func (ps *profiles) setProfile(e *profileEntry, p *Profile) {
	prev := e.p.Swap(p)
	if prev == nil || prev.Version != p.Version || prev.PushInterval != p.PushInterval {
		ps.events.profileChanged(p.ID)
	}
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
func (ps *profiles) Profiles() []Profile {
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
func (ps *profiles) Profile(id uint64) (Profile, bool) {
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
	// By names who makes the change, for the profile's history.
	By string `json:"-"`
	// DryRun checks the update and changes nothing.
	DryRun bool `json:"-"`
}

// UpdateProfile checks u (a *FieldError when it breaks a rule) and applies
// it durably; it is ApplyProfileUpdate without saying whether anything
// changed.
func (ps *profiles) UpdateProfile(ctx context.Context, id uint64, u ProfileUpdate) (Profile, error) {
	p, _, err := ps.ApplyProfileUpdate(ctx, id, u)
	return p, err
}

// ApplyProfileUpdate checks u (a *FieldError when it breaks a rule) and
// applies what it changes durably. A new configuration gives the profile a
// version above every profile's, which puts its devices into Sync pending;
// the same configuration (SameConfig: the same JSON value, however
// written) keeps the version. An update that changes nothing (the same
// configuration, the same push interval, or neither given) returns the
// profile as it is with changed false: nothing is stored, no revision is
// recorded and no device is told.
func (ps *profiles) ApplyProfileUpdate(ctx context.Context, id uint64, u ProfileUpdate) (p Profile, changed bool, err error) {
	if err := ps.syncStaged(ctx, u.Config != nil); err != nil {
		return Profile{}, false, err
	}
	return ps.updateProfile(ctx, id, u, u.By, "updated", false)
}

// syncStaged reads the rollouts back before an operator changes a
// profile's configuration (config true): a rollout another node started a
// moment ago stages it here too, and refuses the change. An unreadable
// store refuses it as well.
func (ps *profiles) syncStaged(ctx context.Context, config bool) error {
	if !config || ps.syncStages == nil {
		return nil
	}
	if err := ps.syncStages(ctx); err != nil {
		return errors.Join(ErrUnavailable, err)
	}
	return nil
}

// updateProfile applies u; always makes even an unchanged configuration a
// new version (a rollback).
func (ps *profiles) updateProfile(ctx context.Context, id uint64, u ProfileUpdate, by, note string, always bool) (Profile, bool, error) {
	if err := u.Normalize(); err != nil {
		return Profile{}, false, err
	}
	ps.mu.Lock()
	e, ok := ps.byID[id]
	ps.mu.Unlock()
	if !ok {
		return Profile{}, false, ErrNotFound
	}
	<-e.ready
	if e.err != nil {
		return Profile{}, false, ErrNotFound
	}
	if u.Config != nil {
		if err := e.refuseStaged(id); err != nil { // layerstage.go
			return Profile{}, false, err
		}
	}
	ps.profileWrite.Lock()
	defer ps.profileWrite.Unlock()
	next := *e.get()
	if !always {
		if u.Config != nil && SameConfig(u.Config, next.Config) {
			u.Config = nil
		}
		if u.PushInterval != nil && *u.PushInterval == next.PushInterval {
			u.PushInterval = nil
		}
		if u.Config == nil && u.PushInterval == nil {
			return next, false, nil
		}
	}
	if u.Config != nil {
		next.Config = u.Config
		if err := ps.checkSchema(e, &next); err != nil {
			return Profile{}, false, err // layerschema.go
		}
		if u.DryRun {
			if u.PushInterval != nil {
				next.PushInterval = *u.PushInterval
			}
			return next, true, nil
		}
		next.Version = ps.maxVersion() + 1
		if cs := ps.cluster; cs != nil {
			// Other nodes hand out versions too: the database's sequence
			// (past every stored version) decides.
			v, err := cs.NextProfileVersion(ctx)
			if err != nil {
				return Profile{}, false, errors.Join(ErrUnavailable, err)
			}
			next.Version = v
		}
	}
	if u.PushInterval != nil {
		next.PushInterval = *u.PushInterval
	}
	if u.DryRun {
		return next, true, nil
	}
	next.UpdatedAt = ps.now().UTC().Truncate(time.Millisecond)
	if err := persist(ctx, ps.persist, func(b *Batch) { b.Profiles = append(b.Profiles, next) }); err != nil {
		return Profile{}, false, err
	}
	ps.setProfile(e, &next)
	ps.recordRevision(ctx, &next, by, note)
	ps.log.Info("profile updated", "profile_id", next.ID, "version", next.Version, "by", by, "note", note)
	return next, true, nil
}

func sortProfiles(ps []Profile) {
	sort.Slice(ps, func(i, j int) bool { return ps[i].ID < ps[j].ID })
}

// takeLinks takes the firmware links other nodes made (reloadPolicy,
// under the policy lock).
func (ps *profiles) takeLinks(links []ProfileLink) {
	var taken []*linkEntry
	ps.mu.Lock()
	for _, l := range links {
		key := profileKey{l.DeviceType, l.Firmware}
		e, ok := ps.byID[l.ProfileID]
		if _, own := ps.byKey[key]; own || !ok {
			continue // approved meanwhile, or its profile is gone
		}
		if cur, ok := ps.links[key]; ok && cur.entry == e {
			continue
		}
		le := &linkEntry{link: l, entry: e}
		ps.links[key] = le
		taken = append(taken, le)
	}
	ps.mu.Unlock()
	for _, le := range taken {
		ps.moveToOwn(profileKey{le.link.DeviceType, le.link.Firmware}, le.entry)
	}
}

// clusterProfile is loadProfile for a device another node stored: its
// profile may be one this node has not seen yet.
func (ps *profiles) clusterProfile(ctx context.Context, key profileKey) (*profileEntry, error) {
	ps.mu.Lock()
	_, own := ps.byKey[key]
	_, linked := ps.links[key]
	ps.mu.Unlock()
	if !own && !linked {
		p, ok, err := ps.cluster.ProfileOf(ctx, key.deviceType, key.firmware)
		if err != nil {
			return nil, err
		}
		if ok {
			ps.adoptProfile(p)
		}
	}
	return ps.loadProfile(ctx, key)
}

// refreshProfile replaces profile id in memory with the stored one, or
// drops it when it is no longer stored (another node deleted it).
func (ps *profiles) refreshProfile(ctx context.Context, id uint64) error {
	p, ok, err := ps.cluster.ReadProfile(ctx, id)
	if err != nil {
		return err
	}
	if !ok {
		// As a local deletion: updates and selections wait meanwhile.
		ps.profileWrite.Lock()
		ps.mu.Lock()
		ps.dropLocked(id)
		ps.mu.Unlock()
		ps.profileWrite.Unlock()
		return nil
	}
	ps.adoptProfile(p)
	return nil
}

// adoptProfile puts a stored profile into memory, replacing this node's
// copy; it returns the entry. A profile new to this node for a firmware
// its devices report takes them, as an approval here would (moveToOwn).
func (ps *profiles) adoptProfile(p Profile) *profileEntry {
	ps.mu.Lock()
	if e, ok := ps.byID[p.ID]; ok {
		if cur := e.get(); cur == nil || cur.Version != p.Version || cur.PushInterval != p.PushInterval || !p.UpdatedAt.Before(cur.UpdatedAt) {
			ps.setProfile(e, &p)
		}
		ps.mu.Unlock()
		return e
	}
	key := profileKey{p.DeviceType, p.Firmware}
	if e, ok := ps.byKey[key]; ok {
		ps.mu.Unlock()
		return e // being created here; the claim gives it this ID
	}
	e := &profileEntry{ready: make(chan struct{}), layers: ps.layers}
	e.p.Store(&p)
	close(e.ready)
	ps.byKey[key] = e
	ps.byID[p.ID] = e
	delete(ps.links, key) // approved on another node
	ps.created[p.DeviceType] = append(ps.created[p.DeviceType], p.CreatedAt.UnixNano())
	ps.mu.Unlock()
	ps.moveToOwn(key, e)
	return e
}
