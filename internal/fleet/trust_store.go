package fleet

import (
	"time"
)

// TrustRecord is one device's admission state as stored, upserted by
// DeviceID. Deleted removes the device (identity, state, trust; labels
// where the store keeps them) and raises the highest deleted device ID, so
// that IDs are never handed out again. Its history samples stay until
// retention drops them: no ID reaches them any more.
type TrustRecord struct {
	DeviceID  uint64
	Deleted   bool
	Admission Admission
	KeyHash   []byte         // SHA-256 of the device key; nil: none
	Request   *EnrollRequest // a re-enrollment waiting for an operator; nil: none
}

// EnrollRequest is a re-enrollment request as stored.
type EnrollRequest struct {
	KeyHash  []byte // SHA-256 of the key handed to the requester
	At       time.Time
	From     string // the requester's address
	Approved bool
}

// TrustState is what LoadTrust returns besides the device records.
type TrustState struct {
	Tokens             []EnrollmentToken
	Preauthorized      []Preauthorized
	MaxDeletedDeviceID uint64
}

// Preauthorized is a machine ID the operator allowed to register under the
// preauthorized admission policy.
type Preauthorized struct {
	MachineID string    `json:"machine_id"`
	AddedAt   time.Time `json:"added_at"`
	DeviceID  uint64    `json:"device_id,string,omitempty"` // set once a device has this machine ID
}

// EnrollmentToken is a single-use credential an operator makes for one
// device's provisioning, instead of the fleet's enrollment secret.
type EnrollmentToken struct {
	ID        uint64     `json:"id,string"`
	MachineID string     `json:"machine_id,omitempty"` // "": any machine ID
	Note      string     `json:"note,omitempty"`
	CreatedAt time.Time  `json:"created_at"`
	ExpiresAt time.Time  `json:"expires_at"`
	UsedAt    *time.Time `json:"used_at,omitempty"`
	DeviceID  uint64     `json:"device_id,string,omitempty"` // the device that used it
	Revoked   bool       `json:"revoked,omitempty"`
	Hash      []byte     `json:"-"` // SHA-256 of the token
}
