package fleet

// Cluster mode, the registry's and the profiles' side: devices, profiles,
// labels and the profile policy's links read back from the database when
// another node changed them (the cluster glue, cluster.go, calls these
// for change log entries).

import "context"

// reloadPolicy replaces the profile policy, the quota lifts and the
// rollout policies with the stored ones, and takes the firmware links
// other nodes made: their devices here go to the linked profile
// (moveToOwn), as on the node that linked them. A link ends with its approval or its profile's deletion,
// each read back as a profile change.
func (s *Service) reloadPolicy(ctx context.Context) error {
	return s.policy.reload(ctx, func(data PolicyData) {
		s.quota.replaceLifts(data.Lifts)
		s.profiles.takeLinks(data.Links)
		s.policy.replaceRolloutPolicies(data.RolloutPolicies)
	})
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
