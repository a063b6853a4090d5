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
	"log/slog"
	"slices"
	"strconv"
	"sync"
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

// trust is the trust room: who may register and how (the admission
// policy, the enrollment secret, enrollment tokens, preauthorized machine
// IDs), and the devices' admission states, which operators change
// (admission.go). The Service embeds it, so that its exported methods are
// the Service's; the registry creates and deletes devices (register.go).
type trust struct {
	mu        sync.Mutex
	store     TrustStore // nil: memory only
	tokens    map[uint64]*EnrollmentToken
	nextToken uint64
	preauth   map[string]time.Time
	secret    enrollmentSecret // secret.go

	// Set by New: the Options of the room, and what it needs of the others.
	policy        Policy
	requireCert   bool
	defaultSecret string // Options.EnrollmentSecret
	devs          trustDevices
	persist       Persister
	cluster       ClusterStore // nil: one server
	now           func() time.Time
	log           *slog.Logger
	// note writes a change log entry (cluster glue, cluster.go).
	note func(ctx context.Context, kind ChangeKind, id uint64)
	// mayRead says whether a database read for an unknown token or
	// machine ID is within the cluster's budget (cluster glue).
	mayRead func() bool
}

// trustDevices is what the trust room needs of the registry.
type trustDevices interface {
	deviceFinder
	deviceOf(machineID string) (uint64, bool)
	deviceForToken(token string) (*device, [32]byte, bool)
	deleteDevice(ctx context.Context, d *device) error
	Device(ctx context.Context, id uint64) (Device, error)
}

// wire gives the room its options and what it needs of the others (New).
func (t *trust) wire(s *Service) {
	t.policy, t.requireCert, t.defaultSecret = s.opts.Admission, s.opts.RequireCertificate, s.opts.EnrollmentSecret
	t.devs, t.persist, t.cluster, t.now, t.log = s, s.persist, s.opts.Cluster, s.now, s.log
	t.note = s.noteChange
	t.mayRead = s.cluster.mayRead
	t.init()
}

func (t *trust) init() {
	if t.tokens == nil {
		t.tokens, t.preauth, t.nextToken = map[uint64]*EnrollmentToken{}, map[string]time.Time{}, 1
	}
	if t.nextToken == 0 {
		t.nextToken = 1
	}
}

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

// credentials checks what a registration presents: a certificate naming
// its machine ID, the enrollment secret, an enrollment token.
func (t *trust) credentials(ctx context.Context, r protocol.RegisterRequest, pr Proof) (credentials, error) {
	var c credentials
	c.cert = slices.Contains(pr.CertNames, r.MachineID)
	if t.requireCert && !c.cert {
		return credentials{}, ErrCertificateRequired
	}
	c.secret = r.EnrollmentSecret != "" && subtle.ConstantTimeCompare([]byte(r.EnrollmentSecret), []byte(t.enrollmentSecret())) == 1
	if r.EnrollmentToken != "" {
		et, err := t.checkEnrollmentToken(ctx, r.EnrollmentToken, r.MachineID)
		if err != nil {
			return credentials{}, err
		}
		c.token = &et
	}
	return c, nil
}

// admitNew decides on a new machine ID's registration as the admission
// policy says: refused (an error), admitted, or pending an operator.
func (t *trust) admitNew(ctx context.Context, machineID string, c credentials) (pending bool, err error) {
	switch {
	case c.cert || c.token != nil:
	case !c.secret:
		return false, ErrEnrollment
	case t.policy == PolicyApprove:
		pending = true
	case t.policy == PolicyPreauthorized:
		if ok, err := t.isPreauthorized(ctx, machineID); err != nil {
			return false, err
		} else if !ok {
			return false, ErrNotPreauthorized
		}
	}
	return pending, nil
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

// decision is what a re-registration of a known device leads to.
type decision uint8

const (
	refuse    decision = iota
	reissue            // new token (and a new key when asked)
	waiting            // 202: still waiting for an operator
	requested          // 202: a new re-enrollment request, with its key
)

// reregister decides on a registration of a known machine ID: an answer
// (a refusal, a wait, a new re-enrollment request), or issue: a reissue the
// registry does (Service.reissue): a new token, and a new key when newKey,
// the request's key when fromRequest.
func (t *trust) reregister(ctx context.Context, d *device, r protocol.RegisterRequest, pr Proof, c credentials) (resp protocol.RegisterResponse, issue, newKey, fromRequest bool, err error) {
	var keyHash keyDigest
	if r.DeviceKey != "" {
		keyHash = digestKey(r.DeviceKey)
	}
	tokenOK := false
	if pr.Token != "" {
		if td, th, ok := t.devs.deviceForToken(pr.Token); ok && td == d {
			d.mu.Lock()
			tokenOK = hashEq(th, d.tokenHash)
			d.mu.Unlock()
		}
	}
	d.mu.Lock()
	if err := admissionError(d.admission); err != nil {
		d.mu.Unlock()
		return protocol.RegisterResponse{}, false, false, false, err
	}
	keyOK := r.DeviceKey != "" && d.keyHash != keyDigest{} && digestEq(keyHash, d.keyHash)
	reqOK := r.DeviceKey != "" && d.request != nil && digestEq(keyHash, d.request.keyHash)
	strong := c.cert || c.token != nil // operator-made credentials: admit even a pending device
	var dec decision
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
		return protocol.RegisterResponse{}, false, false, false, ErrEnrollConflict
	case d.admission == Pending:
		d.mu.Unlock()
		return protocol.RegisterResponse{}, false, false, false, ErrEnrollment
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
		return protocol.RegisterResponse{}, false, false, false, ErrEnrollConflict
	default:
		d.mu.Unlock()
		return protocol.RegisterResponse{}, false, false, false, ErrEnrollment
	}
	id := d.id
	resp = protocol.RegisterResponse{DeviceID: strconv.FormatUint(id, 10), PushInterval: d.profile.interval()}
	switch dec {
	case waiting:
		d.mu.Unlock()
		resp.Pending, resp.RetryAfter = true, PendingRetry
		resp.Message = "registration waits for an operator's approval"
		return resp, false, false, false, nil
	case requested:
		key, kh := newDeviceKey()
		old := d.request
		d.request = &enrollRequest{keyHash: kh, at: t.now().UnixNano(), from: pr.Source}
		trec := d.trustRecord()
		err := persist(ctx, t.persist, func(b *Batch) { b.Trust = append(b.Trust, trec) })
		if err != nil {
			d.request = old
		}
		machineID := d.machineID()
		d.mu.Unlock()
		if err != nil {
			return protocol.RegisterResponse{}, false, false, false, err
		}
		t.log.Info("device admission", "action", "reenroll_request", "device_id", id, "machine_id", machineID, "from", pr.Source)
		resp.Pending, resp.RetryAfter, resp.DeviceKey = true, PendingRetry, key
		resp.Message = "this machine ID is registered and no proof of identity was given: the re-enrollment request waits for an operator's approval; ask again with device_key"
		return resp, false, false, false, nil
	}
	d.mu.Unlock()
	return protocol.RegisterResponse{}, true, newKey, reqOK, nil
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
func (t *trust) Admit(ctx context.Context, id uint64, a Action, actor string) (Device, error) {
	d := t.devs.get(id)
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
		if err := t.devs.deleteDevice(ctx, d); err != nil {
			return Device{}, err
		}
		t.log.Info("device admission", "action", string(a), "device_id", id, "machine_id", machineID, "by", actor,
			"was", before.String(), "admission", "deleted")
		return Device{}, nil
	}
	trec := d.trustRecord()
	err := persist(ctx, t.persist, func(b *Batch) { b.Trust = append(b.Trust, trec) })
	if err != nil {
		d.admission, d.request = before, oldReq
	}
	after := d.admission
	d.mu.Unlock()
	if err != nil {
		return Device{}, err
	}
	t.log.Info("device admission", "action", string(a), "device_id", id, "machine_id", machineID, "by", actor,
		"was", before.String(), "admission", after.String(), "request", oldReq != nil)
	return t.devs.Device(ctx, id)
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
func (t *trust) AdmissionCounts() (map[string]int, int) {
	// Counted by value, named once: /metrics calls this over every device.
	var counts [len(admissionNames) + 1]int // the last: unknown values
	requests := 0
	t.devs.each(func(d *device) {
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

// loadTrust applies a TrustStore's records (New, through
// Service.loadTrust); it returns the highest device ID deleted, which is
// never handed out again.
func (t *trust) loadTrust(ctx context.Context, ts TrustStore) (maxDeleted uint64, err error) {
	st, err := ts.LoadTrust(ctx, func(rec TrustRecord) error {
		d := t.devs.get(rec.DeviceID)
		if d == nil {
			return nil
		}
		d.admission = rec.Admission
		copy(d.keyHash[:], rec.KeyHash)
		if rq := rec.Request; rq != nil {
			d.request = &enrollRequest{at: rq.At.UnixNano(), from: rq.From, approved: rq.Approved}
			copy(d.request.keyHash[:], rq.KeyHash)
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("load trust: %w", err)
	}
	t.store = ts
	t.tokens = make(map[uint64]*EnrollmentToken, len(st.Tokens))
	for i := range st.Tokens {
		et := st.Tokens[i]
		t.tokens[et.ID] = &et
		t.nextToken = max(t.nextToken, et.ID+1)
	}
	t.preauth = make(map[string]time.Time, len(st.Preauthorized))
	for _, p := range st.Preauthorized {
		t.preauth[p.MachineID] = p.AddedAt
	}
	return st.MaxDeletedDeviceID, nil
}
