package fleet

// Cluster mode, the registry's and the profiles' side: devices, profiles,
// labels and the profile policy's links read back from the database when
// another node changed them (the cluster glue, cluster.go, calls these
// for change log entries).

import "context"

// reloadPolicy replaces the profile policy and the quota lifts with the
// stored ones, and takes the firmware links other nodes made: their
// devices here go to the linked profile (moveToOwn), as on the node that
// linked them. A link ends with its approval or its profile's deletion,
// each read back as a profile change.
func (s *Service) reloadPolicy(ctx context.Context) error {
	return s.policy.reload(ctx, func(data PolicyData) {
		s.quota.replaceLifts(data.Lifts)
		s.takeLinks(data.Links)
	})
}

// takeLinks takes the firmware links other nodes made (reloadPolicy,
// under the policy lock).
func (s *Service) takeLinks(links []ProfileLink) {
	ps := s.profiles
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
		s.moveToOwn(profileKey{le.link.DeviceType, le.link.Firmware}, le.entry)
	}
}

// refreshDevice replaces device id in memory with the stored one (adds it,
// or drops it when it is no longer stored).
func (s *Service) refreshDevice(ctx context.Context, id uint64) error {
	cs := s.opts.Cluster
	if cs == nil {
		return nil
	}
	s.cluster.deviceReads.Add(1) // the cluster glue counts them
	rec, tr, ok, err := cs.ReadDevice(ctx, id)
	if err != nil {
		return err
	}
	if !ok {
		if d := s.get(id); d != nil {
			s.forget(d)
		}
		return nil
	}
	key := profileKey{rec.DeviceType, rec.Firmware}
	if rec.State.Firmware != "" {
		key.firmware = rec.State.Firmware
	}
	pe, err := s.clusterProfile(ctx, key)
	if err != nil {
		return err
	}
	s.regMu.Lock()
	deviceType, model, firmware := s.intern(rec.DeviceType), s.intern(rec.Model), s.intern(key.firmware)
	d := s.get(id)
	if d == nil {
		d = s.newDevice()
		d.id, d.registeredAt = id, rec.RegisteredAt.Unix()
		d.setIDs(rec.MachineID, rec.Serial)
		s.place(d)
	}
	s.regMu.Unlock()
	d.mu.Lock()
	d.deviceType, d.model, d.firmware = deviceType, model, firmware
	if d.serial() != rec.Serial {
		d.setIDs(d.machineID(), rec.Serial)
	}
	clear(d.tokenHash[:])
	copy(d.tokenHash[:], rec.TokenHash)
	if ls := rec.State.LastSeen.UnixNano(); !rec.State.LastSeen.IsZero() && ls > d.lastSeen {
		d.lastSeen, d.seq, d.appliedVersion, d.configError = ls, rec.State.Seq, rec.State.AppliedVersion, rec.State.ConfigError
	}
	d.admission = tr.Admission
	clear(d.keyHash[:])
	copy(d.keyHash[:], tr.KeyHash)
	d.request = nil
	if rq := tr.Request; rq != nil {
		d.request = &enrollRequest{at: rq.At.UnixNano(), from: rq.From, approved: rq.Approved}
		copy(d.request.keyHash[:], rq.KeyHash)
	}
	d.unacked = false
	adopt(d, pe)
	s.relabel(d)
	d.mu.Unlock()
	return nil
}

// clusterProfile is loadProfile for a device another node stored: its
// profile may be one this node has not seen yet.
func (s *Service) clusterProfile(ctx context.Context, key profileKey) (*profileEntry, error) {
	ps := s.profiles
	ps.mu.Lock()
	_, own := ps.byKey[key]
	_, linked := ps.links[key]
	ps.mu.Unlock()
	if !own && !linked {
		p, ok, err := s.opts.Cluster.ProfileOf(ctx, key.deviceType, key.firmware)
		if err != nil {
			return nil, err
		}
		if ok {
			s.adoptProfile(p)
		}
	}
	return s.loadProfile(ctx, key)
}

// refreshProfile replaces profile id in memory with the stored one, or
// drops it when it is no longer stored (another node deleted it).
func (s *Service) refreshProfile(ctx context.Context, id uint64) error {
	p, ok, err := s.opts.Cluster.ReadProfile(ctx, id)
	if err != nil {
		return err
	}
	if !ok {
		ps := s.profiles
		// As a local deletion: updates and selections wait meanwhile.
		s.profileWrite.Lock()
		ps.mu.Lock()
		ps.dropLocked(id)
		ps.mu.Unlock()
		s.profileWrite.Unlock()
		return nil
	}
	s.adoptProfile(p)
	return nil
}

// adoptProfile puts a stored profile into memory, replacing this node's
// copy; it returns the entry. A profile new to this node for a firmware
// its devices report takes them, as an approval here would (moveToOwn).
func (s *Service) adoptProfile(p Profile) *profileEntry {
	ps := s.profiles
	ps.mu.Lock()
	if e, ok := ps.byID[p.ID]; ok {
		if cur := e.get(); cur == nil || cur.Version != p.Version || cur.PushInterval != p.PushInterval || !p.UpdatedAt.Before(cur.UpdatedAt) {
			s.setProfile(e, &p)
		}
		ps.mu.Unlock()
		return e
	}
	key := profileKey{p.DeviceType, p.Firmware}
	if e, ok := ps.byKey[key]; ok {
		ps.mu.Unlock()
		return e // being created here; the claim gives it this ID
	}
	e := &profileEntry{ready: make(chan struct{}), layers: &s.layers}
	e.p.Store(&p)
	close(e.ready)
	ps.byKey[key] = e
	ps.byID[p.ID] = e
	delete(ps.links, key) // approved on another node
	ps.created[p.DeviceType] = append(ps.created[p.DeviceType], p.CreatedAt.UnixNano())
	ps.mu.Unlock()
	s.moveToOwn(key, e)
	return e
}

// forget drops a device another node deleted from memory.
func (s *Service) forget(d *device) {
	s.regMu.Lock()
	if id, _ := s.machineIDs.get(d.machineID()); id == d.id {
		s.machineIDs.delete(d.machineID())
	}
	s.regMu.Unlock()
	s.devMu.Lock()
	if d.id < uint64(len(s.devices)) && s.devices[d.id] == d {
		s.devices[d.id] = nil
	}
	s.devMu.Unlock()
	d.mu.Lock()
	adopt(d, nil)
	d.tokenHash = [32]byte{}
	d.mu.Unlock()
}
