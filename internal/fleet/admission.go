package fleet

// Device admission and trust (docs/protocol.md#admission): who may register
// which machine ID, how a known device proves it is the same device, and
// what operators do about devices (approve, reject, block, decommission,
// delete).
//
// A registration for a known machine ID gets a new token only with a proof
// of identity: the device's current token (bearer), its device key, an
// operator's enrollment token, or a client certificate naming the machine
// ID. The fleet's enrollment secret alone never revokes a working token: it
// files a re-enrollment request that an operator approves or rejects.

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/drover/drover/internal/protocol"
)

// TrustStore is implemented by stores that keep device admission: admission
// states, device key hashes, re-enrollment requests (through Batch.Trust),
// enrollment tokens and preauthorized machine IDs. Without one, all of it
// lives in memory only. Every adapter implements it; storetest checks it.
type TrustStore interface {
	// LoadTrust streams every device's trust record (devices without one
	// are active and have no key), then returns the rest.
	LoadTrust(ctx context.Context, each func(TrustRecord) error) (TrustState, error)
	// SaveEnrollmentToken inserts or replaces a token by ID.
	SaveEnrollmentToken(ctx context.Context, t EnrollmentToken) error
	// AddPreauthorized adds machine IDs (present ones are kept as they are).
	AddPreauthorized(ctx context.Context, machineIDs []string, at time.Time) error
	// DeletePreauthorized removes one machine ID; absent is no error.
	DeletePreauthorized(ctx context.Context, machineID string) error
}

// Errors of admission. The server answers them with 403 or 409 and a
// stable JSON error code (docs/protocol.md).
var (
	ErrBlocked             = errors.New("this device is blocked by the operator")
	ErrDecommissioned      = errors.New("this device is decommissioned")
	ErrNotPreauthorized    = errors.New("this machine ID is not preauthorized")
	ErrEnrollmentToken     = errors.New("enrollment token unknown, used, revoked, expired or for another machine ID")
	ErrCertificateRequired = errors.New("a client certificate naming this machine ID is required")
	ErrEnrollConflict      = errors.New("another registration of this machine ID waits for an operator; it must be rejected first")
	ErrNothingToDo         = errors.New("the device is not in a state this action applies to")
	ErrEnrollment          = errors.New("wrong enrollment secret")
)

// Admission is a device's standing with the operator.
type Admission uint8

const (
	Active         Admission = iota // admitted: may push
	Pending                         // new, waiting for an operator's approval
	Blocked                         // refused; nothing it sends is stored
	Decommissioned                  // retired by the operator; refused like Blocked, history kept
)

var admissionNames = [...]string{"active", "pending", "blocked", "decommissioned"}

func (a Admission) String() string {
	if int(a) < len(admissionNames) {
		return admissionNames[a]
	}
	return "unknown"
}

// ParseAdmission accepts the names String returns.
func ParseAdmission(v string) (Admission, bool) {
	for i, n := range admissionNames {
		if n == v {
			return Admission(i), true
		}
	}
	return 0, false
}

// Policy is the operator's rule for machine IDs the fleet does not know.
type Policy uint8

const (
	PolicyOpen          Policy = iota // admitted with the fleet's enrollment secret
	PolicyApprove                     // wait in Pending until an operator approves
	PolicyPreauthorized               // only machine IDs the operator listed
)

var policyNames = [...]string{"open", "approve", "preauthorized"}

func (p Policy) String() string { return policyNames[p] }

// ParsePolicy accepts the names String returns.
func ParsePolicy(v string) (Policy, bool) {
	for i, n := range policyNames {
		if n == v {
			return Policy(i), true
		}
	}
	return 0, false
}

// PendingRetry is the Retry-After, in seconds, of a pending registration.
const PendingRetry = 60

// enrollRequest is a re-enrollment request of a known device that lost its
// credentials (or of someone claiming its machine ID).
type enrollRequest struct {
	keyHash  keyDigest
	at       int64 // unix ns
	from     string
	approved bool
}

// EnrollRequestInfo shows a re-enrollment request to operators.
type EnrollRequestInfo struct {
	At       time.Time `json:"at"`
	From     string    `json:"from,omitempty"`
	Approved bool      `json:"approved"`
}

// Proof is what the transport knows about a registering device besides its
// request body.
type Proof struct {
	Token     string   // the bearer token sent with the registration
	CertNames []string // CN and DNS/URI SANs of a verified client certificate
	Source    string   // the client's address, shown with enrollment requests
}

// credentials is what a registration proves, worked out once.
type credentials struct {
	secret bool             // the fleet's enrollment secret
	cert   bool             // a client certificate naming the machine ID
	token  *EnrollmentToken // a valid enrollment token (not yet used)
}

func newSecret(prefix string) (string, [32]byte) {
	var b [24]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand never fails on Linux
	}
	v := prefix + base64.RawURLEncoding.EncodeToString(b[:])
	return v, sha256.Sum256([]byte(v))
}

// keyDigest is what the fleet keeps of a device key: the first 128 bits of
// its SHA-256 (keys are 192 random bits; 16 bytes less per device).
type keyDigest [16]byte

func digestKey(v string) keyDigest {
	h := sha256.Sum256([]byte(v))
	return keyDigest(h[:16])
}

func digestEq(a, b keyDigest) bool { return subtle.ConstantTimeCompare(a[:], b[:]) == 1 }

// newDeviceKey makes a device key and its digest.
func newDeviceKey() (string, keyDigest) {
	v, _ := newSecret("dk-")
	return v, digestKey(v)
}

func hashEq(a, b [32]byte) bool { return subtle.ConstantTimeCompare(a[:], b[:]) == 1 }

func sha(v string) [32]byte { return sha256.Sum256([]byte(v)) }

func digestBytes(h keyDigest) []byte {
	if h == (keyDigest{}) {
		return nil
	}
	return append([]byte(nil), h[:]...)
}

// trustRecord is d's trust record; d.mu held.
func (d *device) trustRecord() TrustRecord {
	t := TrustRecord{DeviceID: d.id, Admission: d.admission, KeyHash: digestBytes(d.keyHash)}
	if rq := d.request; rq != nil {
		t.Request = &EnrollRequest{KeyHash: digestBytes(rq.keyHash), At: time.Unix(0, rq.at).UTC(), From: rq.from, Approved: rq.approved}
	}
	return t
}

// admissionError is the error of a device that may not talk to the fleet.
func admissionError(a Admission) error {
	switch a {
	case Blocked:
		return ErrBlocked
	case Decommissioned:
		return ErrDecommissioned
	}
	return nil
}

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
	var c credentials
	c.cert = slices.Contains(pr.CertNames, r.MachineID)
	if s.opts.RequireCertificate && !c.cert {
		return protocol.RegisterResponse{}, ErrCertificateRequired
	}
	c.secret = r.EnrollmentSecret != "" && subtle.ConstantTimeCompare([]byte(r.EnrollmentSecret), []byte(s.enrollmentSecret())) == 1
	if r.EnrollmentToken != "" {
		t, err := s.checkEnrollmentToken(ctx, r.EnrollmentToken, r.MachineID)
		if err != nil {
			return protocol.RegisterResponse{}, err
		}
		c.token = &t
	}
	for {
		s.regMu.Lock()
		id, exists := s.machineIDs.get(r.MachineID)
		s.regMu.Unlock()
		if exists {
			if d := s.get(id); d != nil {
				return s.reregister(ctx, d, r, pr, c)
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
	pending := false
	switch {
	case c.cert || c.token != nil:
	case !c.secret:
		return protocol.RegisterResponse{}, false, ErrEnrollment
	case s.opts.Admission == PolicyApprove:
		pending = true
	case s.opts.Admission == PolicyPreauthorized:
		if ok, err := s.isPreauthorized(ctx, r.MachineID); err != nil {
			return protocol.RegisterResponse{}, false, err
		} else if !ok {
			return protocol.RegisterResponse{}, false, ErrNotPreauthorized
		}
	}
	// The profile policy picks the profile (policy.go); the new device
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
		if err := s.useEnrollmentToken(ctx, c.token.ID, s.nextID); err != nil {
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
		err = s.useEnrollmentToken(ctx, c.token.ID, id)
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

// decision is what a re-registration of a known device leads to.
type decision uint8

const (
	refuse    decision = iota
	reissue            // new token (and a new key when asked)
	waiting            // 202: still waiting for an operator
	requested          // 202: a new re-enrollment request, with its key
)

// reregister handles a registration of a known machine ID.
func (s *Service) reregister(ctx context.Context, d *device, r protocol.RegisterRequest, pr Proof, c credentials) (protocol.RegisterResponse, error) {
	var keyHash keyDigest
	if r.DeviceKey != "" {
		keyHash = digestKey(r.DeviceKey)
	}
	tokenOK := false
	if pr.Token != "" {
		if td, th, ok := s.deviceForToken(pr.Token); ok && td == d {
			d.mu.Lock()
			tokenOK = hashEq(th, d.tokenHash)
			d.mu.Unlock()
		}
	}
	d.mu.Lock()
	if err := admissionError(d.admission); err != nil {
		d.mu.Unlock()
		return protocol.RegisterResponse{}, err
	}
	keyOK := r.DeviceKey != "" && d.keyHash != keyDigest{} && digestEq(keyHash, d.keyHash)
	reqOK := r.DeviceKey != "" && d.request != nil && digestEq(keyHash, d.request.keyHash)
	strong := c.cert || c.token != nil // operator-made credentials: admit even a pending device
	var dec decision
	newKey := false
	switch {
	case d.unacked && (c.secret || strong):
		// Its first registration failed: nobody holds its credentials.
		dec, newKey = reissue, true
	case d.admission == Pending && strong:
		dec = reissue
	case d.admission == Pending && keyOK:
		dec = waiting
	case d.admission == Pending && c.secret:
		d.mu.Unlock()
		return protocol.RegisterResponse{}, ErrEnrollConflict
	case d.admission == Pending:
		d.mu.Unlock()
		return protocol.RegisterResponse{}, ErrEnrollment
	case strong || tokenOK || keyOK:
		dec, newKey = reissue, d.keyHash == keyDigest{} || c.token != nil
	case reqOK && d.request.approved:
		dec = reissue
	case reqOK:
		dec = waiting
	case c.secret && d.request == nil:
		dec = requested
	case c.secret:
		d.mu.Unlock()
		return protocol.RegisterResponse{}, ErrEnrollConflict
	default:
		d.mu.Unlock()
		return protocol.RegisterResponse{}, ErrEnrollment
	}
	id := d.id
	resp := protocol.RegisterResponse{DeviceID: strconv.FormatUint(id, 10), PushInterval: d.profile.interval()}
	switch dec {
	case waiting:
		d.mu.Unlock()
		resp.Pending, resp.RetryAfter = true, PendingRetry
		resp.Message = "registration waits for an operator's approval"
		return resp, nil
	case requested:
		key, kh := newDeviceKey()
		old := d.request
		d.request = &enrollRequest{keyHash: kh, at: s.now().UnixNano(), from: pr.Source}
		tr := d.trustRecord()
		err := persist(ctx, s.persist, func(b *Batch) { b.Trust = append(b.Trust, tr) })
		if err != nil {
			d.request = old
		}
		machineID := d.machineID()
		d.mu.Unlock()
		if err != nil {
			return protocol.RegisterResponse{}, err
		}
		s.log.Info("device admission", "action", "reenroll_request", "device_id", id, "machine_id", machineID, "from", pr.Source)
		resp.Pending, resp.RetryAfter, resp.DeviceKey = true, PendingRetry, key
		resp.Message = "this machine ID is registered and no proof of identity was given: the re-enrollment request waits for an operator's approval; ask again with device_key"
		return resp, nil
	}
	d.mu.Unlock()
	return s.reissue(ctx, d, r, c, newKey, reqOK)
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
		if err := s.useEnrollmentToken(ctx, c.token.ID, d.id); err != nil {
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

// Action is what an operator does to a device.
type Action string

// Operator actions on devices.
const (
	Approve      Action = "approve"      // admit a pending device or a re-enrollment request; re-admit a blocked or decommissioned one
	Reject       Action = "reject"       // delete a pending device, or drop a re-enrollment request
	Block        Action = "block"        // refuse everything from the device
	Decommission Action = "decommission" // retire the device, keeping its history
	Delete       Action = "delete"       // forget the device and everything stored of it
)

// ParseAction accepts the actions' names.
func ParseAction(v string) (Action, bool) {
	switch a := Action(v); a {
	case Approve, Reject, Block, Decommission, Delete:
		return a, true
	}
	return "", false
}

// Admit applies an operator's action to a device and logs it (who: actor).
// It returns the device as it is afterwards (zero after a deletion).
func (s *Service) Admit(ctx context.Context, id uint64, a Action, actor string) (Device, error) {
	d := s.get(id)
	if d == nil {
		return Device{}, ErrNotFound
	}
	d.mu.Lock()
	before, machineID := d.admission, d.machineID()
	oldReq := d.request
	del := false
	switch a {
	case Approve:
		switch {
		case d.admission != Active:
			d.admission = Active
		case d.request != nil && !d.request.approved:
			rq := *d.request
			rq.approved = true
			d.request = &rq
		default:
			d.mu.Unlock()
			return Device{}, ErrNothingToDo
		}
	case Reject:
		switch {
		case d.admission == Pending:
			del = true
		case d.request != nil:
			d.request = nil
		default:
			d.mu.Unlock()
			return Device{}, ErrNothingToDo
		}
	case Block:
		d.admission, d.request = Blocked, nil
	case Decommission:
		d.admission, d.request = Decommissioned, nil
	case Delete:
		del = true
	default:
		d.mu.Unlock()
		return Device{}, fmt.Errorf("%w: unknown action %q", ErrNothingToDo, a)
	}
	if del {
		d.mu.Unlock()
		if err := s.deleteDevice(ctx, d); err != nil {
			return Device{}, err
		}
		s.log.Info("device admission", "action", string(a), "device_id", id, "machine_id", machineID, "by", actor,
			"was", before.String(), "admission", "deleted")
		return Device{}, nil
	}
	tr := d.trustRecord()
	err := persist(ctx, s.persist, func(b *Batch) { b.Trust = append(b.Trust, tr) })
	if err != nil {
		d.admission, d.request = before, oldReq
	}
	after := d.admission
	d.mu.Unlock()
	if err != nil {
		return Device{}, err
	}
	s.log.Info("device admission", "action", string(a), "device_id", id, "machine_id", machineID, "by", actor,
		"was", before.String(), "admission", after.String(), "request", oldReq != nil)
	return s.Device(ctx, id)
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

// AdmissionFilter selects devices by admission; the zero value matches all.
type AdmissionFilter struct {
	Admission *Admission
	Requested bool // only devices with a re-enrollment request
}

// admissionFilterNames are the values ParseAdmissionFilter accepts.
var admissionFilterNames = append(admissionNames[:len(admissionNames):len(admissionNames)], "reenroll")

// AdmissionFilterNames lists the values ParseAdmissionFilter accepts.
func AdmissionFilterNames() []string { return slices.Clone(admissionFilterNames) }

// ParseAdmissionFilter accepts an admission name or "reenroll" (devices
// with a re-enrollment request).
func ParseAdmissionFilter(v string) (AdmissionFilter, bool) {
	if v == "reenroll" {
		return AdmissionFilter{Requested: true}, true
	}
	a, ok := ParseAdmission(v)
	if !ok {
		return AdmissionFilter{}, false
	}
	return AdmissionFilter{Admission: &a}, true
}

// match reports whether d passes; d.mu held.
func (f AdmissionFilter) match(d *device) bool {
	if f.Admission != nil && d.admission != *f.Admission {
		return false
	}
	return !f.Requested || d.request != nil
}

// AdmissionCounts counts devices by admission state, and the re-enrollment
// requests waiting.
func (s *Service) AdmissionCounts() (map[string]int, int) {
	// Counted by value, named once: /metrics calls this over every device.
	var counts [len(admissionNames) + 1]int // the last: unknown values
	requests := 0
	s.each(func(d *device) {
		counts[min(int(d.admission), len(admissionNames))]++
		if d.request != nil && !d.request.approved {
			requests++
		}
	})
	out := map[string]int{}
	for i, n := range counts {
		if n > 0 || i < len(admissionNames) {
			out[Admission(i).String()] = n
		}
	}
	return out, requests
}

// loadTrust applies a TrustStore's records; called by New.
func (s *Service) loadTrust(ctx context.Context, ts TrustStore) error {
	st, err := ts.LoadTrust(ctx, func(t TrustRecord) error {
		d := s.get(t.DeviceID)
		if d == nil {
			return nil
		}
		d.admission = t.Admission
		copy(d.keyHash[:], t.KeyHash)
		if rq := t.Request; rq != nil {
			d.request = &enrollRequest{at: rq.At.UnixNano(), from: rq.From, approved: rq.Approved}
			copy(d.request.keyHash[:], rq.KeyHash)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("load trust: %w", err)
	}
	s.trust.store = ts
	s.trust.tokens = make(map[uint64]*EnrollmentToken, len(st.Tokens))
	for i := range st.Tokens {
		t := st.Tokens[i]
		s.trust.tokens[t.ID] = &t
		s.trust.nextToken = max(s.trust.nextToken, t.ID+1)
	}
	s.trust.preauth = make(map[string]time.Time, len(st.Preauthorized))
	for _, p := range st.Preauthorized {
		s.trust.preauth[p.MachineID] = p.AddedAt
	}
	if st.MaxDeletedDeviceID >= s.nextID {
		s.nextID = st.MaxDeletedDeviceID + 1
	}
	return nil
}
