package server

// The request and answer bodies of the operator API that are not domain
// types of their own: the handlers decode and return these, and the routes
// table names them (route.in, route.out), so that the OpenAPI document
// (openapi.go) describes what the handlers read and write. In request
// bodies a field is required only when tagged openapi:"required"; the
// handlers check the rest.

import (
	"encoding/json"
	"time"

	"github.com/drover/drover/internal/access"
	"github.com/drover/drover/internal/alert"
	"github.com/drover/drover/internal/fleet"
)

// noBody is route.in of a POST, PUT or PATCH that reads no body.
type noBody struct{}

// Request bodies.

type enrollmentTokenBody struct {
	MachineID string `json:"machine_id"` // "": any machine ID
	TTL       string `json:"ttl"`        // a duration such as 72h
	Note      string `json:"note"`
}

type preauthorizedBody struct {
	MachineIDs []string `json:"machine_ids" openapi:"required"`
}

type labelAssignBody struct {
	Label  string       `json:"label" openapi:"required"`
	Remove bool         `json:"remove"`
	Filter *labelFilter `json:"filter" openapi:"required"` // {} selects every device
}

type approvalBody struct {
	DeviceType string `json:"device_type" openapi:"required"`
	Firmware   string `json:"firmware" openapi:"required"`
	Carry      string `json:"carry"`
}

type cleanupBody struct {
	MinAge int  `json:"min_age"` // seconds, default 3600
	DryRun bool `json:"dry_run"`
}

type rollbackBody struct {
	Rev int `json:"rev" openapi:"required"`
}

// firmwareRefBody is POST /api/v1/firmware with Content-Type
// application/json: a file kept elsewhere.
type firmwareRefBody struct {
	DeviceType *string `json:"device_type"`
	Version    *string `json:"version"`
	SHA256     *string `json:"sha256"`
	Size       *int64  `json:"size"`
	Signature  *string `json:"signature"`
	URL        *string `json:"url"`
}

type rolloutBody struct {
	*fleet.RolloutSpec
	FirmwareID json.Number `json:"firmware_id" openapi:"required"` // a decimal string, as firmware answers give it, or a number
	inline     string      // a plan field the body gives (inlinePlan)
}

func (b *rolloutBody) UnmarshalJSON(data []byte) error {
	type plain rolloutBody
	b.inline = inlinePlan(data)
	return strictUnmarshal(data, (*plain)(b))
}

// stagedWaves are the waves of a configuration rollout; what a body
// leaves out is the rollouts' default.
type stagedWaves struct {
	Filter string `json:"filter"`
	// Policy names a rollout policy whose plan the rollout takes instead
	// of the fields below.
	Policy        string        `json:"policy"`
	Waves         []string      `json:"waves"`
	MaxFailurePct float64       `json:"max_failure_pct"`
	Window        *fleet.Window `json:"window"`
	StallTimeout  int           `json:"stall_timeout"`
}

// configRolloutBody stages a label's new values as a configuration
// rollout.
type configRolloutBody struct {
	Values json.RawMessage `json:"values" openapi:"required"` // a JSON object, as the label's values
	stagedWaves
	inline string // a plan field the body gives (inlinePlan)
}

func (b *configRolloutBody) UnmarshalJSON(data []byte) error {
	type plain configRolloutBody
	b.inline = inlinePlan(data)
	return strictUnmarshal(data, (*plain)(b))
}

// profileRolloutBody stages a profile's new configuration as a
// configuration rollout.
type profileRolloutBody struct {
	Config json.RawMessage `json:"config" openapi:"required"` // a JSON object, as the profile's configuration
	stagedWaves
	inline string // a plan field the body gives (inlinePlan)
}

func (b *profileRolloutBody) UnmarshalJSON(data []byte) error {
	type plain profileRolloutBody
	b.inline = inlinePlan(data)
	return strictUnmarshal(data, (*plain)(b))
}

// rolloutPolicyBody creates or replaces a rollout policy; what it leaves
// out is the rollouts' default.
type rolloutPolicyBody struct {
	Name string `json:"name"` // optional: the path's name
	fleet.RolloutPlan
}

type rolloutPolicyList struct {
	Policies []fleet.RolloutPolicy `json:"policies"`
}

type quotaLiftBody struct {
	Until *time.Time `json:"until"` // default: until restored
	Note  string     `json:"note"`
}

type userBody struct {
	Name     string      `json:"name" openapi:"required"`
	Role     access.Role `json:"role" openapi:"required"`
	Password string      `json:"password"`
}

type tokenBody struct {
	User      string    `json:"user" openapi:"required"`
	Name      string    `json:"name"`
	ExpiresAt time.Time `json:"expires_at"`
	ExpiresIn string    `json:"expires_in"` // a Go duration, e.g. "720h"
}

// Answers.

type enrollmentTokenList struct {
	Tokens []fleet.EnrollmentToken `json:"tokens"`
}

type preauthorizedList struct {
	MachineIDs []fleet.Preauthorized `json:"machine_ids"`
}

type preauthorizedAdded struct {
	Added int `json:"added"`
}

type preauthorizedRemoved struct {
	Removed string `json:"removed"`
}

// deleted answers the deletion of a named object (its name or ID).
type deleted struct {
	Deleted string `json:"deleted"`
}

type deviceDeleted struct {
	Deleted bool   `json:"deleted"`
	ID      string `json:"id"`
}

type historyPage struct {
	DeviceID string         `json:"device_id"`
	Samples  []fleet.Sample `json:"samples"`
}

type profileList struct {
	Profiles []fleet.Profile `json:"profiles"`
}

type pendingList struct {
	Pending []fleet.PendingFirmware `json:"pending"`
}

type revisionList struct {
	Revisions []fleet.ProfileRevision `json:"revisions"`
}

type profileDiff struct {
	From    int               `json:"from"`
	To      int               `json:"to"`
	Changes []fleet.DiffEntry `json:"changes"`
}

type firmwareList struct {
	Firmware []fleet.Firmware `json:"firmware"`
}

type firmwareDeleted struct {
	Deleted fleet.Firmware `json:"deleted"`
}

type rolloutList struct {
	Rollouts []fleet.Rollout `json:"rollouts"`
}

type rolloutDevicePage struct {
	Devices    []fleet.RolloutDevice `json:"devices"`
	NextCursor string                `json:"next_cursor,omitempty"`
}

type quotaList struct {
	Quotas  fleet.QuotaOptions `json:"quotas"`
	Hits    map[string]uint64  `json:"hits"`
	Devices []fleet.QuotaHit   `json:"devices"`
}

type quotaRestored struct {
	DeviceID string `json:"device_id"`
	Restored bool   `json:"restored"`
}

type labelList struct {
	Labels []fleet.Label `json:"labels"`
}

type labelAssigned struct {
	Label   string `json:"label"`
	Changed int    `json:"changed"`
	Removed bool   `json:"removed"`
}

type jobList struct {
	Jobs []fleet.Job `json:"jobs"`
}

type commandPage struct {
	Commands   []fleet.DeviceCommand `json:"commands"`
	NextCursor string                `json:"next_cursor,omitempty"`
	NextAfter  string                `json:"next_after,omitempty"` // the older name of next_cursor
}

type alertPage struct {
	Alerts     []alert.Event `json:"alerts"`
	Active     int           `json:"active"`
	NextCursor string        `json:"next_cursor,omitempty"`
	NextBefore string        `json:"next_before,omitempty"` // the older name of next_cursor
}

type ruleList struct {
	Rules []ruleOut `json:"rules"`
}

type deliveryList struct {
	Deliveries []alert.Delivery `json:"deliveries"`
	Queued     map[string]int   `json:"queued"`
	Dropped    map[string]int   `json:"dropped"`
}

type userList struct {
	Users []access.User `json:"users"`
}

type tokenList struct {
	Tokens []access.Token `json:"tokens"`
}

type auditPage struct {
	Entries    []access.Entry `json:"entries"`
	NextCursor string         `json:"next_cursor,omitempty"`
}

// probeAnswer is the answer of /healthz and /readyz.
type probeAnswer struct {
	Status   string `json:"status"`
	Reason   string `json:"reason,omitempty"`   // not ready: why
	Degraded string `json:"degraded,omitempty"` // ready, but serving from the database
}

// labelDefineBody makes a label live (PUT /api/v1/labels/{name}).
type layerList struct {
	Layers []fleet.ConfigLayer `json:"layers"`
}

type labelDefineBody struct {
	Filter string `json:"filter" openapi:"required"` // the filter language (docs/groups.md)
}

// layerDeleted answers the deletion of a configuration layer.
type layerDeleted struct {
	Deleted string          `json:"deleted"`
	Kind    fleet.LayerKind `json:"kind"`
}

// layerRevisions lists a configuration layer's revisions, oldest first.
type layerRevisions struct {
	Revisions []fleet.ConfigLayer `json:"revisions"`
}

// rawUpload is the request body of a route that takes the bytes of a file
// as they are (application/octet-stream), not JSON.
type rawUpload struct{}
