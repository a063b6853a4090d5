package fleet

import (
	"encoding/json"
	"time"
)

// Backend is every store interface of the fleet in one: what each adapter
// (internal/store/<backend>) implements.
type Backend interface {
	Store
	StateReader
	HistoryDropper
	TrustStore
	PolicyStore
	LabelStore
	FirmwareStore
	CommandStore
	LayerStore
}

// Stores are the fleet's store dependencies, each named; New loads from
// every one that is set. A nil Devices store keeps the whole fleet in memory
// (and the other fields are ignored); another nil field keeps that part in
// memory only (tests' stores that implement part of Backend).
type Stores struct {
	Devices  Store          // devices, states, history, profiles
	States   StateReader    // current states read back: write-through keeps them out of memory
	History  HistoryDropper // nil: PruneHistory deletes row by row only
	Trust    TrustStore     // admission, device keys, enrollment tokens, deleted device IDs
	Policy   PolicyStore    // profile policy, firmware links, lifted quotas
	Labels   LabelStore     // labels and their assignments
	Firmware FirmwareStore  // firmware artifacts, rollouts, profile revisions
	Commands CommandStore   // remote command jobs and per-device commands
	Layers   LayerStore     // configuration layers and schemas, with their revisions
}

// StoresOf is every part of b; none for a nil b.
func StoresOf(b Backend) Stores {
	if b == nil {
		return Stores{}
	}
	return Stores{Devices: b, States: b, History: b, Trust: b, Policy: b, Labels: b, Firmware: b, Commands: b, Layers: b}
}

// LoadResult is what Store.Load returns besides the devices.
type LoadResult struct {
	Profiles     []Profile
	MaxDeviceID  uint64
	MaxProfileID uint64
}

// Batch is a group of writes committed in one transaction, in this order:
// profiles, devices, states, samples. Later entries for the same key win.
type Batch struct {
	Profiles []Profile
	Devices  []DeviceRecord
	States   []StateRecord
	Samples  []Sample
	// Trust records (admission, device keys, deletions; trust_store.go),
	// applied after everything else.
	Trust []TrustRecord
}

// Len is the number of records in the batch.
func (b *Batch) Len() int {
	return len(b.Profiles) + len(b.Devices) + len(b.States) + len(b.Samples) + len(b.Trust)
}

// Reset empties the batch, keeping its capacity.
func (b *Batch) Reset() {
	clear(b.Profiles)
	clear(b.Devices)
	clear(b.States)
	clear(b.Trust)
	b.Profiles, b.Devices, b.States, b.Samples = b.Profiles[:0], b.Devices[:0], b.States[:0], b.Samples[:0]
	b.Trust = b.Trust[:0]
}

// DeviceRecord is a device's identity as stored. Devices are upserted by ID;
// MachineID is unique.
type DeviceRecord struct {
	ID           uint64
	MachineID    string
	DeviceType   string
	Model        string
	Firmware     string
	Serial       string
	TokenHash    []byte // SHA-256 of the current token
	RegisteredAt time.Time
	// State fields, filled by Load only (Commit takes them from StateRecord).
	State StateRecord
}

// StateRecord is a device's latest push, stored over the previous one.
type StateRecord struct {
	DeviceID       uint64
	Firmware       string
	LastSeen       time.Time // zero: never pushed
	Seq            uint64
	AppliedVersion int64
	ConfigError    string
	State          json.RawMessage
}

// Sample is one history point: the numeric part of a push.
type Sample struct {
	DeviceID    uint64    `json:"-"`
	At          time.Time `json:"at"`
	Seq         uint64    `json:"seq"`
	Uptime      *int64    `json:"uptime,omitempty"`
	CPU         *float64  `json:"cpu,omitempty"`
	MemUsed     *int64    `json:"mem_used,omitempty"`
	MemTotal    *int64    `json:"mem_total,omitempty"`
	DiskUsed    *int64    `json:"disk_used,omitempty"`
	DiskTotal   *int64    `json:"disk_total,omitempty"`
	Temperature *float64  `json:"temperature,omitempty"`
	RxBytes     *uint64   `json:"rx_bytes,omitempty"` // sum over interfaces
	TxBytes     *uint64   `json:"tx_bytes,omitempty"`
	RSSI        *float64  `json:"rssi,omitempty"`
	RSRP        *float64  `json:"rsrp,omitempty"`
	RSRQ        *float64  `json:"rsrq,omitempty"`
	SINR        *float64  `json:"sinr,omitempty"`
}

// HistoryQuery bounds a history read. Zero From/To mean unbounded; Limit 0
// means the store's default (1000).
type HistoryQuery struct {
	From, To time.Time
	Limit    int
}

// Profile is the desired configuration and agent intervals for one
// (device type, firmware). Version grows by one with every change; a device
// is in sync when it reports this version applied.
type Profile struct {
	ID           uint64          `json:"id,string"`
	DeviceType   string          `json:"device_type"`
	Firmware     string          `json:"firmware"`
	Version      int64           `json:"version"`
	Config       json.RawMessage `json:"config"`
	PushInterval int             `json:"push_interval"` // seconds
	CreatedAt    time.Time       `json:"created_at"`
	UpdatedAt    time.Time       `json:"updated_at"`
}
