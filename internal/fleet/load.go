package fleet

import (
	"context"
	"sync/atomic"
)

// LoadProgress is how far New has got loading the devices, read while it
// runs (a server's /readyz and metrics while it starts).
type LoadProgress struct {
	loaded, expected atomic.Uint64
}

// Devices returns the devices loaded so far and the most the store said
// it holds (0: not known yet).
func (p *LoadProgress) Devices() (loaded, expected uint64) {
	if p == nil {
		return 0, 0
	}
	return p.loaded.Load(), p.expected.Load()
}

// loadDevices streams the store's devices into new records, indexed by
// machine ID but not yet in the registry (New gives them their profiles
// first). Write-through mode leaves the states in the store, unless cols
// (the reported fields live labels use) must be filled from them. The
// index is filled here, while the store's queries read on: it is the
// costliest part of a device's load on this side.
func (s *Service) loadDevices(ctx context.Context, store Store, prog *LoadProgress, cols []*column) (LoadResult, []*device, error) {
	var loaded []*device
	opts := LoadOptions{NoStates: s.states != nil && len(cols) == 0, Expect: func(n uint64) {
		if prog != nil {
			prog.expected.Store(n)
		}
		loaded = make([]*device, 0, n)
		s.machineIDs = make(machineIndex, n)
	}}
	n := uint64(0)
	res, err := store.Load(ctx, opts, func(r DeviceRecord) error {
		d := s.newDevice()
		d.id, d.deviceType, d.model = r.ID, s.intern(r.DeviceType), s.intern(r.Model)
		d.firmware, d.registeredAt = s.intern(r.Firmware), r.RegisteredAt.Unix()
		d.seq, d.appliedVersion, d.configError = r.State.Seq, r.State.AppliedVersion, r.State.ConfigError
		d.setIDs(r.MachineID, r.Serial)
		copy(d.tokenHash[:], r.TokenHash)
		if !r.State.LastSeen.IsZero() {
			d.lastSeen = r.State.LastSeen.UnixNano()
		}
		if len(r.State.State) > 0 && s.states == nil {
			d.state = string(r.State.State)
		}
		if r.State.Firmware != "" {
			d.firmware = s.intern(r.State.Firmware)
		}
		for _, c := range cols {
			record(c, d.id, string(r.State.State))
		}
		loaded = append(loaded, d)
		s.machineIDs.set(d.machineID(), d.id)
		if n++; prog != nil {
			prog.loaded.Store(n)
		}
		return nil
	})
	return res, loaded, err
}
