package fleet

import (
	"encoding/json"
	"sync"
	"time"
)

// SyncState is a device's configuration state as operators see it.
type SyncState uint8

const (
	Arriving     SyncState = iota // registered, no data yet
	Synchronized                  // applied the desired configuration
	SyncPending                   // desired configuration newer than applied
	SyncError                     // device reported that applying failed
)

var syncNames = [...]string{"arriving", "synchronized", "sync_pending", "sync_error"}

func (s SyncState) String() string { return syncNames[s] }

// ParseSyncState accepts the names String returns.
func ParseSyncState(v string) (SyncState, bool) {
	for i, n := range syncNames {
		if n == v {
			return SyncState(i), true
		}
	}
	return 0, false
}

// AllSyncStates lists every sync state in order.
func AllSyncStates() []SyncState { return []SyncState{Arriving, Synchronized, SyncPending, SyncError} }

// Liveness says whether a device pushes on time.
type Liveness uint8

const (
	Online  Liveness = iota
	Late             // no push for 1.5 intervals
	Offline          // no push for 3 intervals
	Unknown          // never pushed
)

var livenessNames = [...]string{"online", "late", "offline", "unknown"}

func (l Liveness) String() string { return livenessNames[l] }

// ParseLiveness accepts the names String returns.
func ParseLiveness(v string) (Liveness, bool) {
	for i, n := range livenessNames {
		if n == v {
			return Liveness(i), true
		}
	}
	return 0, false
}

// AllLiveness lists every liveness value in order.
func AllLiveness() []Liveness { return []Liveness{Online, Late, Offline, Unknown} }

// device is the in-memory record of one device, kept small: the registry
// holds one per registered device (BenchmarkRegistryMemory measures it).
type device struct {
	mu             sync.Mutex
	idLen          uint32    // length of the machine ID at the start of ids
	admission      Admission // admission.go; with unacked in idLen's padding
	unacked        bool      // its first registration was not acknowledged: nobody holds its credentials
	asked          uint8     // pushes the server asked for and was not sent yet (quota.go); in idLen's padding too
	marks          uint8     // what the server asked for last (quota.go)
	id             uint64
	ids            string // machine ID then serial: one allocation, one header
	deviceType     string // interned
	model          string // interned
	firmware       string // interned
	tokenHash      [32]byte
	registeredAt   int64 // unix seconds
	lastSeen       int64 // unix nanoseconds, 0: never pushed
	seq            uint64
	appliedVersion int64
	configError    string
	state          string // compact JSON of the latest push's state (memory mode; a string keeps the struct in the 256-byte size class)
	profile        *profileEntry
	labels         []uint16 // label IDs, sorted; replaced, never modified in place (labels.go)
	// Admission and trust (admission.go).
	keyHash    keyDigest      // of the device key; zero: none
	request    *enrollRequest // a re-enrollment waiting for an operator; nil: none
	pushTAT    uint32         // quota clocks in 1/8 s (quota.go)
	lastSample uint32
	cmds       *cmdQueue // remote commands not finished (commands.go); nil: none
}

// setIDs stores the machine ID and serial in one new string.
func (d *device) setIDs(machineID, serial string) {
	d.ids, d.idLen = machineID+serial, uint32(len(machineID))
}

// machineID returns the machine ID (sharing ids' memory); it never changes.
func (d *device) machineID() string { return d.ids[:d.idLen] }

// serial returns the serial; d.mu held (re-registration changes it).
func (d *device) serial() string { return d.ids[d.idLen:] }

// Device is a snapshot of one device for the operator API.
type Device struct {
	ID             uint64          `json:"id,string"`
	MachineID      string          `json:"machine_id"`
	DeviceType     string          `json:"device_type"`
	Model          string          `json:"model,omitempty"`
	Firmware       string          `json:"firmware"`
	Serial         string          `json:"serial,omitempty"`
	RegisteredAt   time.Time       `json:"registered_at"`
	LastSeen       *time.Time      `json:"last_seen,omitempty"`
	Seq            uint64          `json:"seq"`
	SyncState      string          `json:"sync_state"`
	Liveness       string          `json:"liveness"`
	AppliedVersion int64           `json:"applied_version"`
	DesiredVersion int64           `json:"desired_version"`
	ConfigError    string          `json:"config_error,omitempty"`
	ProfileID      uint64          `json:"profile_id,string"`
	PushInterval   int             `json:"push_interval"`
	State          json.RawMessage `json:"state,omitempty"`
	Admission      string          `json:"admission"`
	// EnrollRequest is a re-enrollment waiting for an operator (admission.go).
	EnrollRequest *EnrollRequestInfo `json:"enrollment_request,omitempty"`
}

// Behind says whether a device running applied must be sent desired.
// Configuration versions are unique across profiles (see UpdateProfile), so
// any other version, also one from a profile the device left after a firmware
// change, is out of date. Version 0 means no managed configuration.
func Behind(applied, desired int64) bool { return desired != 0 && applied != desired }

// syncState derives the sync state; d.mu must be held.
func (d *device) syncState() SyncState {
	switch {
	case d.lastSeen == 0:
		return Arriving
	case d.configError != "":
		return SyncError
	case Behind(d.appliedVersion, d.desired()):
		return SyncPending
	default:
		return Synchronized
	}
}

// liveness derives liveness at now; d.mu must be held.
func (d *device) liveness(now int64) Liveness {
	if d.lastSeen == 0 {
		return Unknown
	}
	interval := int64(d.profile.interval()) * int64(time.Second)
	age := now - d.lastSeen
	switch {
	case age >= 3*interval:
		return Offline
	case 2*age >= 3*interval:
		return Late
	default:
		return Online
	}
}

func (d *device) snapshot(now int64, withState bool) Device {
	d.mu.Lock()
	defer d.mu.Unlock()
	p := d.profile.get()
	desired := d.desired()
	out := Device{
		ID: d.id, MachineID: d.machineID(), DeviceType: d.deviceType, Model: d.model,
		Firmware: d.firmware, Serial: d.serial(), RegisteredAt: time.Unix(d.registeredAt, 0).UTC(),
		Seq: d.seq, SyncState: d.syncState().String(), Liveness: d.liveness(now).String(),
		AppliedVersion: d.appliedVersion, DesiredVersion: desired, ConfigError: d.configError,
		ProfileID: p.ID, PushInterval: p.PushInterval, Admission: d.admission.String(),
	}
	if rq := d.request; rq != nil {
		out.EnrollRequest = &EnrollRequestInfo{At: time.Unix(0, rq.at).UTC(), From: rq.from, Approved: rq.approved}
	}
	if d.lastSeen != 0 {
		t := time.Unix(0, d.lastSeen).UTC()
		out.LastSeen = &t
	}
	if withState && d.state != "" {
		out.State = json.RawMessage(d.state)
	}
	return out
}
