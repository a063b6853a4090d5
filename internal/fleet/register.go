package fleet

// Registration: the registry's side of enrolling and deleting devices
// (device IDs, the machine ID index, a new device's profile). The trust
// room (admission.go, enrollment.go) says who may register, with which
// credentials, and in which admission state.

import (
	"context"
	"strconv"
	"time"

	"github.com/drover/drover/internal/protocol"
)

// Register enrolls a device or re-enrolls it (RegisterWith without a
// transport proof).
func (s *Service) Register(ctx context.Context, r protocol.RegisterRequest) (protocol.RegisterResponse, error) {
	return s.RegisterWith(ctx, r, Proof{})
}

// RegisterWith enrolls a new machine ID as the admission policy says, or
// re-enrolls a known one: with a proof of identity it keeps its device ID
// and history and gets a new token (the old one stops working); with the
// enrollment secret alone it files a re-enrollment request and gets a
// pending answer, and its working token is left alone.
func (s *Service) RegisterWith(ctx context.Context, r protocol.RegisterRequest, pr Proof) (protocol.RegisterResponse, error) {
	c, err := s.trust.credentials(ctx, r, pr)
	if err != nil {
		return protocol.RegisterResponse{}, err
	}
	for {
		if id, exists := s.deviceOf(r.MachineID); exists {
			if d := s.get(id); d != nil {
				resp, issue, newKey, fromRequest, err := s.trust.reregister(ctx, d, r, pr, c)
				if !issue {
					return resp, err
				}
				return s.reissue(ctx, d, r, c, newKey, fromRequest)
			}
		}
		if known, err := s.storedElsewhere(ctx, r.MachineID); err != nil {
			return protocol.RegisterResponse{}, err
		} else if known {
			continue // read back: a re-registration
		}
		resp, retry, err := s.enroll(ctx, r, pr, c)
		if !retry {
			return resp, err
		}
	}
}

// enroll admits or files a new machine ID. retry: the machine ID appeared
// meanwhile; start over.
func (s *Service) enroll(ctx context.Context, r protocol.RegisterRequest, pr Proof, c credentials) (protocol.RegisterResponse, bool, error) {
	pending, err := s.trust.admitNew(ctx, r.MachineID, c)
	if err != nil {
		return protocol.RegisterResponse{}, false, err
	}
	// The profile policy picks the profile (profileselect.go); the new device
	// takes the selection's use of it.
	pe, _, err := s.selectProfile(ctx, profileKey{r.DeviceType, r.Firmware}, nil, 0)
	if err != nil {
		return protocol.RegisterResponse{}, false, err
	}
	now := s.now()
	if s.opts.Cluster != nil {
		return s.enrollShared(ctx, r, pr, c, pe, pending, now)
	}
	s.regMu.Lock()
	if _, exists := s.machineIDs.get(r.MachineID); exists {
		s.regMu.Unlock()
		pe.release()
		return protocol.RegisterResponse{}, true, nil
	}
	if c.token != nil {
		if err := s.trust.useEnrollmentToken(ctx, c.token.ID, s.nextID); err != nil {
			s.regMu.Unlock()
			pe.release()
			return protocol.RegisterResponse{}, false, err
		}
	}
	id := s.nextID
	s.nextID++
	key, keyHash := newDeviceKey()
	d := s.newDevice()
	d.id, d.registeredAt, d.profile, d.keyHash = id, now.Unix(), pe, keyHash
	d.deviceType, d.model, d.firmware = s.intern(r.DeviceType), s.intern(r.Model), s.intern(r.Firmware)
	d.setIDs(r.MachineID, r.Serial)
	var token string
	if pending {
		d.admission = Pending
	} else {
		token, d.tokenHash = newToken(id)
	}
	d.mu.Lock()
	rec := DeviceRecord{
		ID: id, MachineID: d.machineID(), DeviceType: d.deviceType, Model: d.model, Firmware: d.firmware,
		Serial: d.serial(), TokenHash: append([]byte(nil), d.tokenHash[:]...), RegisteredAt: time.Unix(d.registeredAt, 0),
	}
	tr := d.trustRecord()
	ticket, err := s.persist.Enqueue(func(b *Batch) {
		b.Devices = append(b.Devices, rec)
		b.Trust = append(b.Trust, tr)
	})
	s.relabel(d)
	d.mu.Unlock()
	if err == nil {
		s.place(d)
	}
	s.regMu.Unlock()
	if err != nil {
		pe.release()
		return protocol.RegisterResponse{}, false, err
	}
	if err := ticket.Wait(ctx); err != nil {
		d.mu.Lock()
		d.unacked = true
		d.mu.Unlock()
		return protocol.RegisterResponse{}, false, err
	}
	return s.enrolled(r, pr, id, pe, key, token, pending), false, nil
}

// enrolled is the answer to a new device's registration.
func (s *Service) enrolled(r protocol.RegisterRequest, pr Proof, id uint64, pe *profileEntry, key, token string, pending bool) protocol.RegisterResponse {
	resp := protocol.RegisterResponse{DeviceID: strconv.FormatUint(id, 10), PushInterval: pe.interval(), New: true, DeviceKey: key}
	if pending {
		s.log.Info("device admission", "action", "request", "device_id", id, "machine_id", r.MachineID, "from", pr.Source, "admission", Pending.String())
		resp.Pending, resp.RetryAfter = true, PendingRetry
		resp.Message = "registration waits for an operator's approval; ask again with device_key"
		return resp
	}
	resp.Token = token
	return resp
}

// enrollShared is enroll's end in cluster mode: the database hands out the
// ID and settles which node's registration of a machine ID wins; the loser
// reads the winner's device back and starts over (retry).
func (s *Service) enrollShared(ctx context.Context, r protocol.RegisterRequest, pr Proof, c credentials, pe *profileEntry, pending bool, now time.Time) (protocol.RegisterResponse, bool, error) {
	cs := s.opts.Cluster
	id, err := cs.NextDeviceID(ctx)
	if err == nil && c.token != nil {
		err = s.trust.useEnrollmentToken(ctx, c.token.ID, id)
	}
	if err != nil {
		pe.release()
		return protocol.RegisterResponse{}, false, err
	}
	key, keyHash := newDeviceKey()
	s.regMu.Lock()
	d := s.newDevice()
	d.id, d.registeredAt, d.profile, d.keyHash = id, now.Unix(), pe, keyHash
	d.deviceType, d.model, d.firmware = s.intern(r.DeviceType), s.intern(r.Model), s.intern(r.Firmware)
	s.regMu.Unlock()
	d.setIDs(r.MachineID, r.Serial)
	var token string
	if pending {
		d.admission = Pending
	} else {
		token, d.tokenHash = newToken(id)
	}
	rec := DeviceRecord{
		ID: id, MachineID: d.machineID(), DeviceType: d.deviceType, Model: d.model, Firmware: d.firmware,
		Serial: d.serial(), TokenHash: append([]byte(nil), d.tokenHash[:]...), RegisteredAt: time.Unix(d.registeredAt, 0),
	}
	won, err := cs.ClaimDevice(ctx, rec, d.trustRecord())
	if err != nil || !won {
		pe.release()
		if err == nil {
			err = s.claimLost(ctx, r.MachineID)
		}
		return protocol.RegisterResponse{}, err == nil, err
	}
	d.mu.Lock()
	s.relabel(d)
	d.mu.Unlock()
	s.regMu.Lock()
	old := s.place(d)
	s.regMu.Unlock()
	if old != nil { // read back from the change log meanwhile
		old.mu.Lock()
		adopt(old, nil)
		old.mu.Unlock()
	}
	return s.enrolled(r, pr, id, pe, key, token, pending), false, nil
}

// reissue gives a known device a new token (and key), updating its identity
// fields from the registration.
func (s *Service) reissue(ctx context.Context, d *device, r protocol.RegisterRequest, c credentials, newKey, fromRequest bool) (protocol.RegisterResponse, error) {
	d.mu.Lock()
	prev := d.profile
	d.mu.Unlock()
	pe, _, err := s.selectProfile(ctx, profileKey{r.DeviceType, r.Firmware}, prev, d.id)
	if err != nil {
		return protocol.RegisterResponse{}, err
	}
	if c.token != nil {
		if err := s.trust.useEnrollmentToken(ctx, c.token.ID, d.id); err != nil {
			pe.release()
			return protocol.RegisterResponse{}, err
		}
	}
	s.regMu.Lock()
	deviceType, model, firmware := s.intern(r.DeviceType), s.intern(r.Model), s.intern(r.Firmware)
	s.regMu.Unlock()
	token, hash := newToken(d.id)
	var key string
	d.mu.Lock()
	if err := admissionError(d.admission); err != nil { // blocked meanwhile
		d.mu.Unlock()
		pe.release()
		return protocol.RegisterResponse{}, err
	}
	keyHash := d.keyHash
	switch {
	case newKey:
		key, keyHash = newDeviceKey()
	case fromRequest && d.request != nil:
		keyHash = d.request.keyHash
	}
	// Only the unacknowledged first registration of a pending device gets
	// here without an operator's credential: it stays pending, new key.
	stayPending := d.admission == Pending && c.token == nil && !c.cert
	if stayPending {
		hash = [32]byte{}
	}
	oldAdmission, oldKey, oldReq := d.admission, d.keyHash, d.request
	if !stayPending {
		d.admission = Active
	}
	d.keyHash, d.request = keyHash, nil
	tr := d.trustRecord()
	rec := DeviceRecord{
		ID: d.id, MachineID: d.machineID(), DeviceType: deviceType, Model: model, Firmware: firmware,
		Serial: r.Serial, TokenHash: hash[:], RegisteredAt: time.Unix(d.registeredAt, 0),
	}
	ticket, err := s.persist.Enqueue(func(b *Batch) {
		b.Devices = append(b.Devices, rec)
		b.Trust = append(b.Trust, tr)
	})
	if err == nil {
		d.deviceType, d.model, d.firmware = deviceType, model, firmware
		if d.serial() != r.Serial {
			d.setIDs(d.machineID(), r.Serial)
		}
		d.tokenHash = hash
		adopt(d, pe)
		s.relabel(d)
	} else {
		d.admission, d.keyHash, d.request = oldAdmission, oldKey, oldReq
		pe.release()
	}
	d.mu.Unlock()
	if err != nil {
		return protocol.RegisterResponse{}, err
	}
	if err := ticket.Wait(ctx); err != nil {
		return protocol.RegisterResponse{}, err
	}
	d.mu.Lock()
	d.unacked = false
	d.mu.Unlock()
	resp := protocol.RegisterResponse{DeviceID: strconv.FormatUint(d.id, 10), PushInterval: pe.interval(), DeviceKey: key}
	if stayPending {
		resp.New, resp.Pending, resp.RetryAfter = true, true, PendingRetry
		resp.Message = "registration waits for an operator's approval; ask again with device_key"
		return resp, nil
	}
	resp.Token = token
	return resp, nil
}

// deleteDevice removes d from the registry and the store.
func (s *Service) deleteDevice(ctx context.Context, d *device) error {
	s.regMu.Lock()
	defer s.regMu.Unlock()
	if id, _ := s.machineIDs.get(d.machineID()); id != d.id {
		return ErrNotFound // deleted meanwhile
	}
	d.mu.Lock()
	labels := d.labels
	err := persist(ctx, s.persist, func(b *Batch) { b.Trust = append(b.Trust, TrustRecord{DeviceID: d.id, Deleted: true}) })
	if err == nil {
		d.tokenHash, d.keyHash, d.request, d.admission = [32]byte{}, keyDigest{}, nil, Blocked
		adopt(d, nil) // List and Counts skip it from now on
	}
	d.mu.Unlock()
	if err != nil {
		return err
	}
	s.machineIDs.delete(d.machineID())
	s.devMu.Lock()
	s.devices[d.id] = nil
	s.devMu.Unlock()
	// Label assignments in a label store that keeps them apart.
	if ls := s.labelStore(); ls != nil {
		for _, l := range labels {
			if err := ls.AssignLabel(ctx, l, []uint64{d.id}, false); err != nil {
				s.log.Warn("device labels not deleted", "device_id", d.id, "err", err)
			}
		}
	}
	return nil
}

// deviceOf is the ID of the device registered with machineID.
func (s *Service) deviceOf(machineID string) (uint64, bool) {
	s.regMu.Lock()
	defer s.regMu.Unlock()
	return s.machineIDs.get(machineID)
}

// loadTrust applies a TrustStore's records (New): the devices' admission
// and the trust room's tokens and preauthorized machine IDs; a deleted
// device's ID is never handed out again.
func (s *Service) loadTrust(ctx context.Context, ts TrustStore) error {
	maxDeleted, err := s.trust.loadTrust(ctx, ts)
	if err != nil {
		return err
	}
	if maxDeleted >= s.nextID {
		s.nextID = maxDeleted + 1
	}
	return nil
}
