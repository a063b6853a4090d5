package batchutil

import (
	"fmt"
	"time"

	"github.com/drover/drover/internal/fleet"
)

// TrustRow is a fleet.TrustRecord as the device_trust columns hold it.
type TrustRow struct {
	DeviceID        uint64
	Admission       string
	KeyHash         []byte // nil: none
	RequestKeyHash  []byte // nil: no request
	RequestAt       int64  // unix ns
	RequestFrom     string
	RequestApproved bool
}

// TrustRowOf flattens a record.
func TrustRowOf(t *fleet.TrustRecord) TrustRow {
	r := TrustRow{DeviceID: t.DeviceID, Admission: t.Admission.String(), KeyHash: t.KeyHash}
	if q := t.Request; q != nil {
		r.RequestKeyHash, r.RequestAt, r.RequestFrom, r.RequestApproved = NonNil(q.KeyHash), q.At.UnixNano(), q.From, q.Approved
	}
	return r
}

// Record is the inverse of TrustRowOf.
func (r *TrustRow) Record() (fleet.TrustRecord, error) {
	a, ok := fleet.ParseAdmission(r.Admission)
	if !ok {
		return fleet.TrustRecord{}, fmt.Errorf("device %d: unknown admission %q", r.DeviceID, r.Admission)
	}
	t := fleet.TrustRecord{DeviceID: r.DeviceID, Admission: a}
	if len(r.KeyHash) > 0 {
		t.KeyHash = r.KeyHash
	}
	if r.RequestKeyHash != nil {
		t.Request = &fleet.EnrollRequest{KeyHash: r.RequestKeyHash, At: time.Unix(0, r.RequestAt).UTC(), From: r.RequestFrom, Approved: r.RequestApproved}
	}
	return t, nil
}

// NonNil keeps NOT NULL binary columns from receiving NULL.
func NonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

// TokenTimes are an enrollment token's times as stored (unix ms; used 0:
// unused).
func TokenTimes(t *fleet.EnrollmentToken) (created, expires, used int64) {
	created, expires = t.CreatedAt.UnixMilli(), t.ExpiresAt.UnixMilli()
	if t.UsedAt != nil {
		used = t.UsedAt.UnixMilli()
	}
	return
}

// SetTokenTimes is the inverse of TokenTimes.
func SetTokenTimes(t *fleet.EnrollmentToken, created, expires, used int64) {
	t.CreatedAt, t.ExpiresAt = time.UnixMilli(created).UTC(), time.UnixMilli(expires).UTC()
	if used != 0 {
		u := time.UnixMilli(used).UTC()
		t.UsedAt = &u
	}
}

// CounterMaxDeleted names the trust_counters row of the highest deleted
// device ID.
const CounterMaxDeleted = "max_deleted_device_id"
