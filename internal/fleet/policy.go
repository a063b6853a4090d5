package fleet

// The profile policy (docs/operations.md, "Profile policy"): what a
// (device type, firmware) pair without a profile does when a device reports
// it.
//
//   - mode create (default): a profile is created for the pair. With carry
//     inherit (default) it starts with the configuration, version and push
//     interval of the device's previous profile (at registration: of the
//     type's default profile, its oldest); with carry empty it starts empty.
//   - mode join: the pair is linked to the device's previous profile (at
//     registration: the type's default) and its devices stay there until an
//     operator approves the firmware (ApproveFirmware), which creates its
//     profile.
//
// Devices create at most CreateLimit profiles per device type within
// CreateWindow; beyond it a new pair is linked as in join mode and the
// device is listed as having hit the profile_create quota. The first
// profile of a device type is always created. Profiles no device uses can
// be deleted (DeleteProfile, CleanupProfiles).

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// PolicyStore is implemented by stores that keep the profile policy, the
// firmware links and the lifted quotas; all three backends do. Without one
// these live in memory only.
type PolicyStore interface {
	// LoadPolicy returns what Save… stored; Policy nil when never saved.
	LoadPolicy(ctx context.Context) (PolicyData, error)
	SaveProfilePolicy(ctx context.Context, p ProfilePolicy) error
	// SaveProfileLink upserts by (DeviceType, Firmware).
	SaveProfileLink(ctx context.Context, l ProfileLink) error
	DeleteProfileLink(ctx context.Context, deviceType, firmware string) error
	// SaveQuotaLift upserts by DeviceID.
	SaveQuotaLift(ctx context.Context, l QuotaLift) error
	DeleteQuotaLift(ctx context.Context, deviceID uint64) error
	// DeleteProfiles deletes the profiles and the links to them.
	DeleteProfiles(ctx context.Context, ids []uint64) error
}

// Errors of profile policy operations.
var (
	ErrNotPending    = errors.New("this firmware is not waiting for approval")
	ErrProfileInUse  = errors.New("devices use this profile")
	ErrProfileExists = errors.New("this firmware has a profile already")
)

// PolicyData is what a PolicyStore keeps.
type PolicyData struct {
	Policy *ProfilePolicy
	Links  []ProfileLink
	Lifts  []QuotaLift
}

// Profile policy modes and carries.
const (
	ModeCreate   = "create"
	ModeJoin     = "join"
	CarryInherit = "inherit"
	CarryEmpty   = "empty"
)

// ProfilePolicy is the operator's setting for new firmware.
type ProfilePolicy struct {
	Mode  string `json:"mode"`  // create or join
	Carry string `json:"carry"` // inherit or empty: how a created profile starts
	// CreateLimit is how many profiles devices may create per device type
	// within CreateWindow (seconds).
	CreateLimit  int `json:"create_limit"`
	CreateWindow int `json:"create_window"`
}

// DefaultProfilePolicy is the policy until an operator sets one.
func DefaultProfilePolicy() ProfilePolicy {
	return ProfilePolicy{Mode: ModeCreate, Carry: CarryInherit, CreateLimit: 10, CreateWindow: 86400}
}

// Check reports the first rule p breaks, as a *FieldError.
func (p ProfilePolicy) Check() error {
	switch {
	case p.Mode != ModeCreate && p.Mode != ModeJoin:
		return &FieldError{Field: "mode", Message: "mode must be create or join"}
	case p.Carry != CarryInherit && p.Carry != CarryEmpty:
		return &FieldError{Field: "carry", Message: "carry must be inherit or empty"}
	case p.CreateLimit < 0 || p.CreateLimit > 10000:
		return &FieldError{Field: "create_limit", Message: "create_limit must be 0..10000 profiles"}
	case p.CreateWindow < 60 || p.CreateWindow > 366*86400:
		return &FieldError{Field: "create_window", Message: "create_window must be 60..31622400 seconds"}
	}
	return nil
}

// ProfileLink is a firmware without a profile of its own: its devices use
// ProfileID until an operator approves it.
type ProfileLink struct {
	DeviceType string    `json:"device_type"`
	Firmware   string    `json:"firmware"`
	ProfileID  uint64    `json:"profile_id,string"`
	CreatedAt  time.Time `json:"created_at"`
	// Limited: linked because the device type's creations were used up
	// (false: because of mode join).
	Limited bool `json:"limited"`
}

// PendingFirmware is a link as the operator API shows it.
type PendingFirmware struct {
	ProfileLink
	Devices int `json:"devices"` // devices reporting this firmware now
}

type linkEntry struct {
	link  ProfileLink
	entry *profileEntry
}

// Bounds on links, so that devices cannot grow them without limit.
const (
	maxLinksPerType = 100
	maxLinks        = 10000
)

// policy is the policy room: the profile policy in force and the
// PolicyStore, where firmware links and quota lifts are stored too, under
// its lock. The Service embeds it, so that its exported methods are the
// Service's. The profiles' selection by the policy, links and approvals
// below are the Service's (its profiles).
type policy struct {
	// mu serialises policy, link and lift writes to the store; taken
	// before profiles.mu.
	mu     sync.Mutex
	store  PolicyStore
	policy atomic.Pointer[ProfilePolicy]

	// Set by New: what the room needs of the others.
	log  *slog.Logger
	note func(ctx context.Context, kind ChangeKind, id uint64) // cluster glue, cluster.go
}

// wire gives the room what it needs of the others and the default policy
// (New).
func (pol *policy) wire(s *Service) {
	pol.log, pol.note = s.log, s.noteChange
	def := DefaultProfilePolicy()
	pol.policy.Store(&def)
}

// locked runs fn under the policy lock with the policy store (nil: memory
// only): the quotas room stores its lifts there.
func (pol *policy) locked(fn func(st PolicyStore) error) error {
	pol.mu.Lock()
	defer pol.mu.Unlock()
	return fn(pol.store)
}

// loaded takes the store and the stored policy, if any (New).
func (pol *policy) loaded(st PolicyStore, p *ProfilePolicy) error {
	pol.store = st
	if p != nil {
		if err := p.Check(); err != nil {
			return fmt.Errorf("stored profile policy: %w", err)
		}
		c := *p
		pol.policy.Store(&c)
	}
	return nil
}

// reload, in cluster mode, replaces the policy with the stored one and
// hands what else is stored (lifts, links) to then, under the lock.
func (pol *policy) reload(ctx context.Context, then func(PolicyData)) error {
	st := pol.store
	if st == nil {
		return nil
	}
	data, err := st.LoadPolicy(ctx)
	if err != nil {
		return err
	}
	pol.mu.Lock()
	defer pol.mu.Unlock()
	if data.Policy != nil && data.Policy.Check() == nil {
		p := *data.Policy
		pol.policy.Store(&p)
	}
	then(data)
	return nil
}

func (pol *policy) profilePolicy() ProfilePolicy { return *pol.policy.Load() }

// ProfilePolicy returns the policy in force.
func (pol *policy) ProfilePolicy() ProfilePolicy { return pol.profilePolicy() }

// SetProfilePolicy checks p and makes it the policy, durably.
func (pol *policy) SetProfilePolicy(ctx context.Context, p ProfilePolicy) (ProfilePolicy, error) {
	if err := p.Check(); err != nil {
		return ProfilePolicy{}, err
	}
	pol.mu.Lock()
	defer pol.mu.Unlock()
	if st := pol.store; st != nil {
		if err := st.SaveProfilePolicy(ctx, p); err != nil {
			return ProfilePolicy{}, err
		}
		pol.note(ctx, ChangePolicy, 0)
	}
	pol.policy.Store(&p)
	pol.log.Info("profile policy set", "mode", p.Mode, "carry", p.Carry, "create_limit", p.CreateLimit, "create_window", p.CreateWindow)
	return p, nil
}

// loadPolicy reads the policy, links and lifts (profiles loaded already).
func (s *Service) loadPolicy(ctx context.Context, st PolicyStore) error {
	data, err := st.LoadPolicy(ctx)
	if err != nil {
		return fmt.Errorf("load profile policy: %w", err)
	}
	if err := s.policy.loaded(st, data.Policy); err != nil {
		return err
	}
	ps := s.profiles
	for _, l := range data.Links {
		key := profileKey{s.intern(l.DeviceType), s.intern(l.Firmware)}
		e, ok := ps.byID[l.ProfileID]
		if _, own := ps.byKey[key]; own || !ok {
			continue // approved meanwhile, or its profile is gone
		}
		l.DeviceType, l.Firmware = key.deviceType, key.firmware
		ps.links[key] = &linkEntry{link: l, entry: e}
	}
	s.quota.loadLifts(data.Lifts)
	return nil
}

// typeDefault is the device type's default profile, its oldest (ps.mu held).
func (ps *profiles) typeDefault(deviceType string) *profileEntry {
	var best *profileEntry
	for _, e := range ps.byKey {
		p := e.get()
		if p.DeviceType != deviceType || !isReady(e) {
			continue
		}
		if best == nil || p.ID < best.get().ID {
			best = e
		}
	}
	return best
}

func isReady(e *profileEntry) bool {
	select {
	case <-e.ready:
		return e.err == nil
	default:
		return false
	}
}

// allowCreate counts one creation for deviceType if the policy's limit
// allows it (ps.mu held).
func (ps *profiles) allowCreate(deviceType string, now int64, p ProfilePolicy) bool {
	c := ps.created[deviceType]
	from := now - int64(p.CreateWindow)*int64(time.Second)
	i := 0
	for i < len(c) && c[i] < from {
		i++
	}
	c = c[i:]
	ps.created[deviceType] = c
	return len(c) < p.CreateLimit
}

// selectProfile returns the profile a device of key's type and firmware
// uses, by the policy: its own, a link, or a new one; and the firmware
// string to keep. prev is the device's current profile (nil at
// registration). The caller holds one use of the result and passes it to
// adopt or release.
func (s *Service) selectProfile(ctx context.Context, key profileKey, prev *profileEntry, deviceID uint64) (*profileEntry, string, error) {
	ps := s.profiles
	for {
		ps.mu.Lock()
		if e, ok := ps.byKey[key]; ok {
			select {
			case <-e.ready:
				if e.err == nil {
					e.users.Add(1)
					ps.mu.Unlock()
					return e, e.get().Firmware, nil
				}
				ps.mu.Unlock()
				return nil, "", e.err
			default:
			}
			ps.mu.Unlock()
			select {
			case <-e.ready:
			case <-ctx.Done():
				return nil, "", ctx.Err()
			}
			if e.err != nil {
				return nil, "", e.err
			}
			continue // take the use under the lock
		}
		if l, ok := ps.links[key]; ok {
			l.entry.users.Add(1)
			ps.mu.Unlock()
			return l.entry, l.link.Firmware, nil
		}
		pol := s.profilePolicy()
		base := prev
		if base == nil || base.get().DeviceType != key.deviceType || !isReady(base) {
			base = ps.typeDefault(key.deviceType)
		}
		if base == nil {
			return s.created(s.createProfile(ctx, key, nil)) // a type's first profile
		}
		now := s.now().UnixNano()
		if pol.Mode == ModeCreate && ps.allowCreate(key.deviceType, now, pol) {
			var from *Profile
			if pol.Carry == CarryInherit {
				from = base.get()
			}
			return s.created(s.createProfile(ctx, key, from))
		}
		limited := pol.Mode == ModeCreate
		base.users.Add(1)
		l := s.linkLocked(key, base, limited, now)
		ps.mu.Unlock()
		if limited {
			s.quota.note(deviceID, QuotaProfileCreate, now)
		}
		if l == nil {
			return base, strings.Clone(key.firmware), nil
		}
		s.saveLink(ctx, *l)
		return base, l.Firmware, nil
	}
}

func (s *Service) created(e *profileEntry, err error) (*profileEntry, string, error) {
	if err != nil {
		return nil, "", err
	}
	return e, e.get().Firmware, nil
}

// linkLocked links key to e unless the bounds are reached (ps.mu held).
func (s *Service) linkLocked(key profileKey, e *profileEntry, limited bool, now int64) *ProfileLink {
	ps := s.profiles
	if len(ps.links) >= maxLinks {
		return nil
	}
	n := 0
	for k := range ps.links {
		if k.deviceType == key.deviceType {
			n++
		}
	}
	if n >= maxLinksPerType {
		return nil
	}
	key = profileKey{strings.Clone(key.deviceType), strings.Clone(key.firmware)}
	l := ProfileLink{DeviceType: key.deviceType, Firmware: key.firmware, ProfileID: e.get().ID,
		CreatedAt: time.Unix(0, now).UTC().Truncate(time.Millisecond), Limited: limited}
	ps.links[key] = &linkEntry{link: l, entry: e}
	s.log.Info("firmware linked to a profile", "device_type", key.deviceType, "firmware", key.firmware, "profile_id", l.ProfileID, "limited", limited)
	return &l
}

// saveLink stores l; a failure is logged (the link then lasts until the
// server restarts, when the policy decides again).
func (pol *policy) saveLink(ctx context.Context, l ProfileLink) {
	st := pol.store
	if st == nil {
		return
	}
	pol.mu.Lock()
	defer pol.mu.Unlock()
	if err := st.SaveProfileLink(context.WithoutCancel(ctx), l); err != nil {
		pol.log.Warn("storing a firmware link failed", "device_type", l.DeviceType, "firmware", l.Firmware, "err", err)
		return
	}
	pol.note(ctx, ChangePolicy, 0) // other nodes list it as pending too
}

// loadProfile attaches a loaded device's profile: its own, a link, or the
// type's default; only a type without any profile gets one created.
func (s *Service) loadProfile(ctx context.Context, key profileKey) (*profileEntry, error) {
	ps := s.profiles
	ps.mu.Lock()
	if e, ok := ps.byKey[key]; ok {
		e.users.Add(1)
		ps.mu.Unlock()
		return e, nil
	}
	if l, ok := ps.links[key]; ok {
		l.entry.users.Add(1)
		ps.mu.Unlock()
		return l.entry, nil
	}
	if e := ps.typeDefault(key.deviceType); e != nil {
		e.users.Add(1)
		ps.mu.Unlock()
		return e, nil
	}
	return s.createProfile(ctx, key, nil)
}

// PendingFirmware lists the links: firmware waiting for an operator's
// approval, with the devices reporting each.
func (s *Service) PendingFirmware() []PendingFirmware {
	ps := s.profiles
	ps.mu.Lock()
	out := make([]PendingFirmware, 0, len(ps.links))
	idx := map[profileKey]int{}
	for k, l := range ps.links {
		idx[k] = len(out)
		out = append(out, PendingFirmware{ProfileLink: l.link})
	}
	ps.mu.Unlock()
	if len(out) > 0 {
		s.each(func(d *device) {
			if i, ok := idx[profileKey{d.deviceType, d.firmware}]; ok {
				out[i].Devices++
			}
		})
	}
	slices.SortFunc(out, func(a, b PendingFirmware) int {
		if a.DeviceType != b.DeviceType {
			return cmp.Compare(a.DeviceType, b.DeviceType)
		}
		return cmp.Compare(a.Firmware, b.Firmware)
	})
	return out
}

// ApproveFirmware gives a linked firmware its own profile: inheriting from
// the profile its devices use when carry is inherit (empty: the policy's
// carry), and moves its devices there.
func (s *Service) ApproveFirmware(ctx context.Context, deviceType, firmware, carry string) (Profile, error) {
	if carry == "" {
		carry = s.profilePolicy().Carry
	}
	if carry != CarryInherit && carry != CarryEmpty {
		return Profile{}, &FieldError{Field: "carry", Message: "carry must be inherit or empty"}
	}
	s.policy.mu.Lock()
	defer s.policy.mu.Unlock()
	ps := s.profiles
	ps.mu.Lock()
	key := profileKey{deviceType, firmware}
	if _, ok := ps.byKey[key]; ok {
		ps.mu.Unlock()
		return Profile{}, ErrProfileExists
	}
	l, ok := ps.links[key]
	if !ok {
		ps.mu.Unlock()
		return Profile{}, ErrNotPending
	}
	key = profileKey{l.link.DeviceType, l.link.Firmware} // interned
	var from *Profile
	if carry == CarryInherit {
		from = l.entry.get()
	}
	delete(ps.links, key)
	e, err := s.createProfile(ctx, key, from) // unlocks ps.mu
	if err != nil {
		ps.mu.Lock()
		ps.links[key] = l
		ps.mu.Unlock()
		return Profile{}, err
	}
	if st := s.policy.store; st != nil {
		if err := s.flushPersist(ctx); err != nil {
			s.log.Warn("approve firmware: flushing writes failed", "err", err)
		} else if err := st.DeleteProfileLink(ctx, key.deviceType, key.firmware); err != nil {
			s.log.Warn("approve firmware: deleting the link failed", "err", err)
		}
	}
	moved := s.moveToOwn(key, e)
	e.release() // createProfile's use
	p := *e.get()
	s.log.Info("firmware approved", "device_type", deviceType, "firmware", firmware, "profile_id", p.ID, "carry", carry, "devices", moved)
	return p, nil
}

// moveToOwn points every device of key's type and firmware that is on
// another profile at e, the profile key's devices use now (its own, or
// the one it is linked to), and tells those holding a persistent
// connection to push when what they get changes (the configuration's
// version or the push interval). This is the one path of an approval or
// a link, made here (ApproveFirmware) or read back from the change log
// after another node made it (adoptProfile, reloadPolicy). It returns how
// many devices moved.
func (s *Service) moveToOwn(key profileKey, e *profileEntry) int {
	var nudge []uint64
	moved := 0
	p := e.get()
	s.each(func(d *device) {
		if d.deviceType != key.deviceType || d.firmware != key.firmware || d.profile == e {
			return
		}
		if prev := d.profile.get(); prev.Version != p.Version || prev.PushInterval != p.PushInterval {
			nudge = append(nudge, d.id)
		}
		e.users.Add(1)
		adopt(d, e)
		moved++
	})
	for _, id := range nudge {
		s.events.deviceMoved(id)
	}
	return moved
}

// flushPersist returns once every write acknowledged before it is in the
// store: a write-back flush. Write-through acknowledges only what is
// committed, memory writes nothing.
func (s *Service) flushPersist(ctx context.Context) error {
	if f, ok := s.persist.(interface{ Flush(context.Context) error }); ok {
		return f.Flush(ctx)
	}
	return nil
}

// CleanupResult lists the profiles a cleanup deleted (or would delete).
type CleanupResult struct {
	Deleted []Profile `json:"deleted"`
	DryRun  bool      `json:"dry_run"`
}

// DeleteProfile deletes one profile that no device uses.
func (s *Service) DeleteProfile(ctx context.Context, id uint64) error {
	res, err := s.deleteProfiles(ctx, false, func(e *profileEntry) (bool, error) {
		if e.get().ID != id {
			return false, nil
		}
		if e.users.Load() > 0 {
			return false, ErrProfileInUse
		}
		return true, nil
	})
	if err == nil && len(res.Deleted) == 0 {
		return ErrNotFound
	}
	return err
}

// CleanupProfiles deletes every profile that no device uses and that was
// not changed for minAge; dryRun only lists them.
func (s *Service) CleanupProfiles(ctx context.Context, minAge time.Duration, dryRun bool) (CleanupResult, error) {
	before := s.now().Add(-minAge)
	return s.deleteProfiles(ctx, dryRun, func(e *profileEntry) (bool, error) {
		p := e.get()
		return e.users.Load() == 0 && !p.UpdatedAt.After(before) && !p.CreatedAt.After(before), nil
	})
}

// deleteProfiles deletes the ready profiles pick chooses, with the links
// to them. Profile updates and selections wait meanwhile, so that no device
// takes a profile being deleted.
func (s *Service) deleteProfiles(ctx context.Context, dryRun bool, pick func(*profileEntry) (bool, error)) (CleanupResult, error) {
	res := CleanupResult{Deleted: []Profile{}, DryRun: dryRun}
	s.profileWrite.Lock()
	defer s.profileWrite.Unlock()
	s.policy.mu.Lock()
	defer s.policy.mu.Unlock()
	// Creations and updates enqueued so far reach the store before the
	// delete, so that none of them brings a deleted profile back.
	if !dryRun {
		if err := s.flushPersist(ctx); err != nil {
			return res, err
		}
	}
	ps := s.profiles
	ps.mu.Lock()
	defer ps.mu.Unlock()
	var ids []uint64
	for _, e := range ps.byID {
		if !isReady(e) {
			continue
		}
		ok, err := pick(e)
		if err != nil {
			return res, err
		}
		if ok {
			ids = append(ids, e.get().ID)
			res.Deleted = append(res.Deleted, *e.get())
		}
	}
	sortProfiles(res.Deleted)
	if dryRun || len(ids) == 0 {
		return res, nil
	}
	if st := s.policy.store; st != nil {
		if err := st.DeleteProfiles(ctx, ids); err != nil {
			return CleanupResult{Deleted: []Profile{}}, err
		}
	}
	for _, id := range ids {
		ps.dropLocked(id)
		s.noteChange(ctx, ChangeProfile, id)
	}
	s.log.Info("profiles deleted", "count", len(ids), "ids", ids)
	return res, nil
}

// dropLocked removes deleted profile id from memory, with the links to it
// (ps.mu held): the one path of a deletion, made here (deleteProfiles) or
// read back from the change log after another node made it
// (refreshProfile).
func (ps *profiles) dropLocked(id uint64) {
	e, ok := ps.byID[id]
	if !ok {
		return
	}
	p := e.get()
	delete(ps.byID, id)
	if k := (profileKey{p.DeviceType, p.Firmware}); ps.byKey[k] == e {
		delete(ps.byKey, k)
	}
	for k, l := range ps.links {
		if l.entry == e {
			delete(ps.links, k)
		}
	}
}
