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
	"context"
	"fmt"
	"log/slog"
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
	// SaveRolloutPolicy upserts by Name; DeleteRolloutPolicy deletes
	// the one called name, if any (rolloutpolicy.go).
	SaveRolloutPolicy(ctx context.Context, p RolloutPolicy) error
	DeleteRolloutPolicy(ctx context.Context, name string) error
}

// PolicyData is what a PolicyStore keeps.
type PolicyData struct {
	Policy *ProfilePolicy
	Links  []ProfileLink
	Lifts  []QuotaLift
	// RolloutPolicies are by name.
	RolloutPolicies []RolloutPolicy
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
	// rollouts are the rollout policies by name (rolloutpolicy.go),
	// replaced whole under mu.
	rollouts atomic.Pointer[map[string]RolloutPolicy]

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
