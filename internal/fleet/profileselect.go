package fleet

// The profiles' selection by the profile policy (policy.go): a firmware's
// own profile, a link to another, or a new one; approvals of linked
// firmware, and the deletion of profiles no device uses.

import (
	"cmp"
	"context"
	"slices"
	"strings"
	"time"
)

type linkEntry struct {
	link  ProfileLink
	entry *profileEntry
}

// Bounds on links, so that devices cannot grow them without limit.
const (
	maxLinksPerType = 100
	maxLinks        = 10000
)

// loadLinks takes the stored links (New, profiles loaded already);
// intern gives the registry's copy of a device type or firmware.
func (ps *profiles) loadLinks(links []ProfileLink, intern func(string) string) {
	for _, l := range links {
		key := profileKey{intern(l.DeviceType), intern(l.Firmware)}
		e, ok := ps.byID[l.ProfileID]
		if _, own := ps.byKey[key]; own || !ok {
			continue // approved meanwhile, or its profile is gone
		}
		l.DeviceType, l.Firmware = key.deviceType, key.firmware
		ps.links[key] = &linkEntry{link: l, entry: e}
	}
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
func (ps *profiles) selectProfile(ctx context.Context, key profileKey, prev *profileEntry, deviceID uint64) (*profileEntry, string, error) {
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
		pol := ps.policy()
		base := prev
		if base == nil || base.get().DeviceType != key.deviceType || !isReady(base) {
			base = ps.typeDefault(key.deviceType)
		}
		if base == nil {
			return ps.withFirmware(ps.createProfile(ctx, key, nil)) // a type's first profile
		}
		now := ps.now().UnixNano()
		if pol.Mode == ModeCreate && ps.allowCreate(key.deviceType, now, pol) {
			var from *Profile
			if pol.Carry == CarryInherit {
				from = base.get()
			}
			return ps.withFirmware(ps.createProfile(ctx, key, from))
		}
		limited := pol.Mode == ModeCreate
		base.users.Add(1)
		l := ps.linkLocked(key, base, limited, now)
		ps.mu.Unlock()
		if limited {
			ps.quotaNote(deviceID, QuotaProfileCreate, now)
		}
		if l == nil {
			return base, strings.Clone(key.firmware), nil
		}
		ps.saveLink(ctx, *l)
		return base, l.Firmware, nil
	}
}

func (ps *profiles) withFirmware(e *profileEntry, err error) (*profileEntry, string, error) {
	if err != nil {
		return nil, "", err
	}
	return e, e.get().Firmware, nil
}

// linkLocked links key to e unless the bounds are reached (ps.mu held).
func (ps *profiles) linkLocked(key profileKey, e *profileEntry, limited bool, now int64) *ProfileLink {
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
	ps.log.Info("firmware linked to a profile", "device_type", key.deviceType, "firmware", key.firmware, "profile_id", l.ProfileID, "limited", limited)
	return &l
}

// loadProfile attaches a loaded device's profile: its own, a link, or the
// type's default; only a type without any profile gets one created.
func (ps *profiles) loadProfile(ctx context.Context, key profileKey) (*profileEntry, error) {
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
	return ps.createProfile(ctx, key, nil)
}

// PendingFirmware lists the links: firmware waiting for an operator's
// approval, with the devices reporting each.
func (ps *profiles) PendingFirmware() []PendingFirmware {
	ps.mu.Lock()
	out := make([]PendingFirmware, 0, len(ps.links))
	idx := map[profileKey]int{}
	for k, l := range ps.links {
		idx[k] = len(out)
		out = append(out, PendingFirmware{ProfileLink: l.link})
	}
	ps.mu.Unlock()
	if len(out) > 0 {
		ps.devs.each(func(d *device) {
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
func (ps *profiles) ApproveFirmware(ctx context.Context, deviceType, firmware, carry string) (Profile, error) {
	if carry == "" {
		carry = ps.policy().Carry
	}
	if carry != CarryInherit && carry != CarryEmpty {
		return Profile{}, &FieldError{Field: "carry", Message: "carry must be inherit or empty"}
	}
	var p Profile
	err := ps.policyLocked(func(st PolicyStore) error {
		var err error
		p, err = ps.approveLocked(ctx, st, deviceType, firmware, carry)
		return err
	})
	return p, err
}

// approveLocked is ApproveFirmware under the policy lock, with the
// policy store (nil: memory only).
func (ps *profiles) approveLocked(ctx context.Context, st PolicyStore, deviceType, firmware, carry string) (Profile, error) {
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
	e, err := ps.createProfile(ctx, key, from) // unlocks ps.mu
	if err != nil {
		ps.mu.Lock()
		ps.links[key] = l
		ps.mu.Unlock()
		return Profile{}, err
	}
	if st != nil {
		if err := ps.flushPersist(ctx); err != nil {
			ps.log.Warn("approve firmware: flushing writes failed", "err", err)
		} else if err := st.DeleteProfileLink(ctx, key.deviceType, key.firmware); err != nil {
			ps.log.Warn("approve firmware: deleting the link failed", "err", err)
		}
	}
	moved := ps.moveToOwn(key, e)
	e.release() // createProfile's use
	p := *e.get()
	ps.log.Info("firmware approved", "device_type", deviceType, "firmware", firmware, "profile_id", p.ID, "carry", carry, "devices", moved)
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
func (ps *profiles) moveToOwn(key profileKey, e *profileEntry) int {
	var nudge []uint64
	moved := 0
	p := e.get()
	ps.devs.each(func(d *device) {
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
		ps.events.deviceMoved(id)
	}
	return moved
}

// flushPersist returns once every write acknowledged before it is in the
// store: a write-back flush. Write-through acknowledges only what is
// committed, memory writes nothing.
func (ps *profiles) flushPersist(ctx context.Context) error {
	if f, ok := ps.persist.(interface{ Flush(context.Context) error }); ok {
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
func (ps *profiles) DeleteProfile(ctx context.Context, id uint64) error {
	res, err := ps.deleteProfiles(ctx, false, func(e *profileEntry) (bool, error) {
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
func (ps *profiles) CleanupProfiles(ctx context.Context, minAge time.Duration, dryRun bool) (CleanupResult, error) {
	before := ps.now().Add(-minAge)
	return ps.deleteProfiles(ctx, dryRun, func(e *profileEntry) (bool, error) {
		p := e.get()
		return e.users.Load() == 0 && !p.UpdatedAt.After(before) && !p.CreatedAt.After(before), nil
	})
}

// deleteProfiles deletes the ready profiles pick chooses, with the links
// to them. Profile updates and selections wait meanwhile, so that no device
// takes a profile being deleted.
func (ps *profiles) deleteProfiles(ctx context.Context, dryRun bool, pick func(*profileEntry) (bool, error)) (CleanupResult, error) {
	ps.profileWrite.Lock()
	defer ps.profileWrite.Unlock()
	var res CleanupResult
	err := ps.policyLocked(func(st PolicyStore) error {
		var err error
		res, err = ps.deleteLocked(ctx, st, dryRun, pick)
		return err
	})
	return res, err
}

// deleteLocked is deleteProfiles under the profile write lock and the
// policy lock, with the policy store (nil: memory only).
func (ps *profiles) deleteLocked(ctx context.Context, st PolicyStore, dryRun bool, pick func(*profileEntry) (bool, error)) (CleanupResult, error) {
	res := CleanupResult{Deleted: []Profile{}, DryRun: dryRun}
	// Creations and updates enqueued so far reach the store before the
	// delete, so that none of them brings a deleted profile back.
	if !dryRun {
		if err := ps.flushPersist(ctx); err != nil {
			return res, err
		}
	}
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
	if st != nil {
		if err := st.DeleteProfiles(ctx, ids); err != nil {
			return CleanupResult{Deleted: []Profile{}}, err
		}
	}
	for _, id := range ids {
		ps.dropLocked(id)
		ps.note(ctx, ChangeProfile, id)
	}
	ps.log.Info("profiles deleted", "count", len(ids), "ids", ids)
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
