package server

// The whole HTTP interface of `drover serve`, on one page.
//
// To add an endpoint: add one line to (*api).table below, with its summary
// and the types of its request body and answer (in, out: the OpenAPI
// document is made from them), and write its handler as an apiFunc,
// func(*http.Request) (any, error). Return the answer
// (written as JSON with 200, or created(v) for 201) or an error: an
// *apiError made with badField, notFound... or a domain error, which
// answerError maps to HTTP status, JSON error code, outcome metrics and log
// line, once for every endpoint. Access is checked from the table (need:
// the least role of the caller's bearer token, authz.go; docs/security.md),
// and every change is written to the audit log there too; a path in the
// table asked with another method gets 405 with Allow, any other path 404,
// both with the JSON error body. Plain handlers (probes, /metrics, the
// dashboard) are listed with h instead; their access is checked from the
// table too.
// query lists the query parameters an apiFunc route reads: any other
// answers 400 unknown_parameter (query.go), so that a typo never widens a
// list. The OpenAPI document (/api/v1/openapi.json, openapi.go) is built
// from this table.

import (
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/drover/drover/internal/access"
	"github.com/drover/drover/internal/alert"
	"github.com/drover/drover/internal/fleet"
	"github.com/drover/drover/internal/protocol"
	"github.com/drover/drover/internal/tunnel"
	"github.com/drover/drover/internal/web"
	"github.com/prometheus/client_golang/prometheus"
)

// apiFunc answers one request with a value for the JSON body, or an error.
type apiFunc func(r *http.Request) (any, error)

// route is one line of the table.
type route struct {
	method, path string // path as http.ServeMux takes it; method "" for any
	need         need   // who may call it (authz.go)
	endpoint     string // the endpoint label of the request metrics (default: "admin", or the path)
	// object is the path (GET route) of the object a change acts on,
	// for the audit log's before and after; routes() sets it.
	object  string
	fn      apiFunc
	query   []string     // the query parameters fn reads (fn routes only)
	h       http.Handler // instead of fn: served as is
	limited bool         // takes a device request slot (503 when none free)
	// refuse runs before a slot is taken: it answers the request when it
	// returns true (pushes over quota), or returns the request to go on
	// with (its context carries what it checked).
	refuse func(w http.ResponseWriter, r *http.Request) (*http.Request, bool)
	// stream: the handler bounds the body itself and may take up to
	// -firmware-download-max (firmware uploads), or it is a plain handler
	// whose body may reach -remote-file-max-size (file uploads to a
	// device).
	stream bool
	// Device endpoints count every answer in outcomes; ok names the
	// counter of a success.
	outcomes *prometheus.CounterVec
	ok       func(v any) prometheus.Counter

	// The OpenAPI document (openapi.go) is made from these; every route
	// with a method has them (TestOpenAPIComplete). summary says what the
	// route does. in is the type of the JSON body the handler decodes (a
	// zero value; noBody{} for a POST, PUT or PATCH that reads none):
	// decodeStrict refuses to decode another. out is the type of the
	// success answer: created(v) for 201, answers for several statuses,
	// oneOf for one of several types, rawAnswer for a body not JSON.
	// errs adds error statuses to those openapi.go derives (errorStatuses).
	summary string
	in, out any
	errs    []int
}

// table is the whole API.
func (a *api) table() []route {
	m := a.m
	pushOK := func(any) prometheus.Counter { return m.pushAccepted }
	regOK := func(v any) prometheus.Counter {
		if _, ok := v.(acceptedBody); ok {
			return m.regPending
		}
		if v.(protocol.RegisterResponse).New {
			return m.regNew
		}
		return m.regRenewed
	}
	return []route{
		// Device protocol (docs/protocol.md).
		{method: "POST", path: protocol.PathRegister, endpoint: "register", fn: a.registerDevice, limited: true, outcomes: m.registrations, ok: regOK,
			summary: "Register a device", in: protocol.RegisterRequest{}, out: answers{200: protocol.RegisterResponse{}, 202: protocol.RegisterResponse{}}, errs: e(403, 409, 429)},
		{method: "GET", path: protocol.PathConnect, endpoint: "connect", h: a.connectHandler(),
			summary: "Open a device's live connection (WebSocket)", out: rawAnswer{101, ""}, errs: e(401)},
		{method: "GET", path: tunnel.PathLink, endpoint: "tunnel_link", h: a.tunnelLinkHandler(),
			summary: "Open a device's tunnel link (WebSocket)", out: rawAnswer{101, ""}, errs: e(401, 409, 503)},
		{method: "POST", path: protocol.PathPush, endpoint: "push", fn: a.push, limited: true, refuse: a.admitPush, outcomes: m.pushes, ok: pushOK,
			summary: "Push a device's state", in: protocol.PushRequest{}, out: protocol.PushResponse{}, errs: e(401, 403, 429)},

		// Operator API (docs/operations.md).
		{method: "GET", path: "/api/v1/devices", need: viewer, fn: a.listDevices, query: deviceListQuery,
			summary: "List devices", out: devicePage{}},
		{method: "GET", path: "/api/v1/devices/{id}", need: viewer, fn: a.getDevice,
			summary: "Get a device", out: fleet.Device{}},
		{method: "GET", path: "/api/v1/devices/{id}/tunnel", need: remoteAccess, endpoint: "tunnel", h: a.tunnelHandler(), query: q("to"),
			summary: "Open a tunnel to a device (WebSocket)", out: rawAnswer{101, ""}, errs: e(409, 429, 502, 503, 504)},
		{method: "GET", path: "/api/v1/devices/{id}/terminal", need: remoteAccess, endpoint: "terminal", h: a.terminalHandler(), query: q("cols", "rows", "command"),
			summary: "Open a terminal on a device (WebSocket)", out: rawAnswer{101, ""}, errs: e(409, 429, 501, 502, 503, 504)},
		{method: "GET", path: "/api/v1/devices/{id}/files", need: remoteAccess, endpoint: "files", h: a.filesHandler(false), query: q("path"),
			summary: "Download a file from a device", out: rawAnswer{200, "application/octet-stream"}, errs: e(404, 409, 429, 501, 502, 503, 504)},
		{method: "PUT", path: "/api/v1/devices/{id}/files", need: remoteAccess, endpoint: "files", h: a.filesHandler(true), query: q("path"), stream: true,
			summary: "Upload a file to a device", in: rawUpload{}, out: created(fileAnswer{}), errs: e(404, 409, 411, 429, 501, 502, 503, 504)},
		{method: "GET", path: "/api/v1/devices/{id}/history", need: viewer, fn: a.getHistory, query: q("from", "to", "limit", "format"),
			summary: "Get a device's state history", out: historyPage{}},
		{method: "POST", path: "/api/v1/devices/{id}/approve", need: operator, fn: a.admitDevice(fleet.Approve),
			summary: "Approve a device's registration", in: noBody{}, out: fleet.Device{}, errs: e(409)},
		{method: "POST", path: "/api/v1/devices/{id}/reject", need: operator, fn: a.admitDevice(fleet.Reject),
			summary: "Reject a device's registration", in: noBody{}, out: oneOf{fleet.Device{}, deviceDeleted{}}, errs: e(409)},
		{method: "POST", path: "/api/v1/devices/{id}/block", need: operator, fn: a.admitDevice(fleet.Block),
			summary: "Block a device", in: noBody{}, out: fleet.Device{}, errs: e(409)},
		{method: "POST", path: "/api/v1/devices/{id}/decommission", need: operator, fn: a.admitDevice(fleet.Decommission),
			summary: "Decommission a device", in: noBody{}, out: fleet.Device{}, errs: e(409)},
		{method: "DELETE", path: "/api/v1/devices/{id}", need: operator, fn: a.admitDevice(fleet.Delete),
			summary: "Delete a device", out: deviceDeleted{}, errs: e(409)},
		{method: "GET", path: "/api/v1/enrollment-tokens", need: admin, fn: a.listEnrollmentTokens,
			summary: "List enrollment tokens", out: enrollmentTokenList{}},
		{method: "POST", path: "/api/v1/enrollment-tokens", need: admin, fn: a.createEnrollmentToken,
			summary: "Create an enrollment token", in: enrollmentTokenBody{}, out: created(newEnrollmentToken{})},
		{method: "DELETE", path: "/api/v1/enrollment-tokens/{id}", need: admin, fn: a.revokeEnrollmentToken,
			summary: "Revoke an enrollment token", out: fleet.EnrollmentToken{}},
		{method: "GET", path: "/api/v1/preauthorized", need: viewer, fn: a.listPreauthorized,
			summary: "List preauthorized machine IDs", out: preauthorizedList{}},
		{method: "POST", path: "/api/v1/preauthorized", need: operator, fn: a.addPreauthorized,
			summary: "Preauthorize machine IDs", in: preauthorizedBody{}, out: preauthorizedAdded{}},
		{method: "DELETE", path: "/api/v1/preauthorized/{machine_id}", need: operator, fn: a.removePreauthorized,
			summary: "Remove a preauthorized machine ID", out: preauthorizedRemoved{}},
		{method: "GET", path: "/api/v1/profiles", need: viewer, fn: a.listProfiles,
			summary: "List profiles", out: profileList{}},
		{method: "GET", path: "/api/v1/profiles/{id}", need: viewer, fn: a.getProfile,
			summary: "Get a profile", out: fleet.Profile{}},
		{method: "PUT", path: "/api/v1/profiles/{id}", need: operator, fn: a.updateProfile, query: q(dryRunQuery),
			summary: "Change a profile", in: fleet.ProfileUpdate{}, out: fleet.Profile{}, errs: e(409, 422)},
		{method: "PATCH", path: "/api/v1/profiles/{id}", need: operator, fn: a.updateProfile, query: q(dryRunQuery),
			summary: "Change a profile (the fields given)", in: fleet.ProfileUpdate{}, out: fleet.Profile{}, errs: e(409, 422)},
		{method: "DELETE", path: "/api/v1/profiles/{id}", need: operator, fn: a.deleteProfile,
			summary: "Delete an unused profile", out: deleted{}, errs: e(409)},
		{method: "GET", path: "/api/v1/profiles/policy", need: viewer, fn: a.getProfilePolicy,
			summary: "Get the profile policy", out: fleet.ProfilePolicy{}},
		{method: "PUT", path: "/api/v1/profiles/policy", need: operator, fn: a.putProfilePolicy, query: q(dryRunQuery),
			summary: "Set the profile policy", in: fleet.ProfilePolicy{}, out: fleet.ProfilePolicy{}},
		{method: "GET", path: "/api/v1/profiles/pending", need: viewer, fn: a.pendingFirmware,
			summary: "List firmware waiting for approval", out: pendingList{}},
		{method: "POST", path: "/api/v1/profiles/approve", need: operator, fn: a.approveFirmware,
			summary: "Approve a firmware waiting for approval", in: approvalBody{}, out: created(fleet.Profile{}), errs: e(404, 409)},
		{method: "POST", path: "/api/v1/profiles/cleanup", need: operator, fn: a.cleanupProfiles,
			summary: "Delete unused profiles", in: cleanupBody{}, out: fleet.CleanupResult{}},
		{method: "GET", path: "/api/v1/profiles/{id}/history", need: viewer, fn: a.profileHistory,
			summary: "List a profile's revisions", out: revisionList{}},
		{method: "GET", path: "/api/v1/profiles/{id}/diff", need: viewer, fn: a.profileDiff, query: q("from", "to"),
			summary: "Compare two revisions of a profile", out: profileDiff{}},
		{method: "POST", path: "/api/v1/profiles/{id}/rollback", need: operator, fn: a.rollbackProfile,
			summary: "Roll a profile back to a revision", in: rollbackBody{}, out: fleet.Profile{}, errs: e(409)},
		{method: "POST", path: "/api/v1/profiles/{id}/rollout", need: operator, fn: a.createProfileRollout, query: q(dryRunQuery),
			summary: "Stage a profile's new configuration as a rollout in waves (dry_run: check it, 200)", in: profileRolloutBody{}, out: answers{201: fleet.Rollout{}, 200: fleet.Rollout{}}, errs: e(404, 409, 422)},
		{method: "GET", path: "/api/v1/firmware", need: viewer, fn: a.listFirmware,
			summary: "List firmware", out: firmwareList{}},
		{method: "POST", path: "/api/v1/firmware", need: operator, fn: a.uploadFirmware, stream: true, query: q("device_type", "version", "sha256", "signature"),
			summary: "Upload a firmware file, or add one kept elsewhere", in: firmwareRefBody{}, out: created(fleet.Firmware{}), errs: e(409)},
		{method: "GET", path: "/api/v1/firmware/{id}", need: viewer, fn: a.getFirmware,
			summary: "Get a firmware", out: fleet.Firmware{}},
		{method: "DELETE", path: "/api/v1/firmware/{id}", need: operator, fn: a.deleteFirmware,
			summary: "Delete a firmware", out: firmwareDeleted{}, errs: e(409)},
		// Firmware files: devices with their token (own device type), or
		// the admin token; checked in the handler.
		{method: "GET", path: protocol.PathFirmware + "{id}/file", h: http.HandlerFunc(a.firmwareFile),
			summary: "Download a firmware file (Range: 206; a file kept elsewhere: 302 to it)", errs: e(401, 403, 404),
			out: answers{200: rawAnswer{200, "application/octet-stream"}, 206: rawAnswer{206, "application/octet-stream"}, 302: rawAnswer{302, ""}}},
		{method: "GET", path: "/api/v1/rollouts", need: viewer, fn: a.listRollouts,
			summary: "List rollouts", out: rolloutList{}},
		{method: "POST", path: "/api/v1/rollouts", need: operator, fn: a.createRollout,
			summary: "Start a rollout", in: rolloutBody{}, out: created(fleet.Rollout{}), errs: e(404, 409)},
		{method: "GET", path: "/api/v1/rollouts/{id}", need: viewer, fn: a.getRollout,
			summary: "Get a rollout", out: fleet.Rollout{}},
		{method: "GET", path: "/api/v1/rollouts/{id}/devices", need: viewer, fn: a.rolloutDevices, query: q("state", "limit", "cursor", "after"),
			summary: "List a rollout's devices", out: rolloutDevicePage{}},
		{method: "POST", path: "/api/v1/rollouts/{id}/pause", need: operator, fn: a.controlRollout(fleet.ActionPause),
			summary: "Pause a rollout", in: noBody{}, out: fleet.Rollout{}, errs: e(409)},
		{method: "POST", path: "/api/v1/rollouts/{id}/resume", need: operator, fn: a.controlRollout(fleet.ActionResume),
			summary: "Resume a rollout", in: noBody{}, out: fleet.Rollout{}, errs: e(409)},
		{method: "POST", path: "/api/v1/rollouts/{id}/abort", need: operator, fn: a.controlRollout(fleet.ActionAbort),
			summary: "Abort a rollout", in: noBody{}, out: fleet.Rollout{}, errs: e(409)},
		{method: "GET", path: "/api/v1/rollout-policies", need: viewer, fn: a.listRolloutPolicies,
			summary: "List rollout policies", out: rolloutPolicyList{}},
		{method: "GET", path: "/api/v1/rollout-policies/{name}", need: viewer, fn: a.getRolloutPolicy,
			summary: "Get a rollout policy", out: fleet.RolloutPolicy{}, errs: e(404)},
		{method: "PUT", path: "/api/v1/rollout-policies/{name}", need: operator, fn: a.putRolloutPolicy, query: q(dryRunQuery),
			summary: "Create (201) or replace a rollout policy (dry_run: check it, 200)", in: rolloutPolicyBody{}, out: answers{201: fleet.RolloutPolicy{}, 200: fleet.RolloutPolicy{}}},
		{method: "DELETE", path: "/api/v1/rollout-policies/{name}", need: operator, fn: a.deleteRolloutPolicy, query: q(dryRunQuery),
			summary: "Delete a rollout policy (running rollouts keep their plan)", out: deleted{}, errs: e(404)},
		// Configuration layers (docs/configuration.md).
		{method: "GET", path: "/api/v1/devices/{id}/config/effective", need: viewer, fn: a.effectiveConfig,
			summary: "Get a device's effective configuration and where each value comes from", out: fleet.EffectiveConfig{}, errs: e(404)},
		{method: "GET", path: "/api/v1/devices/{id}/config", need: viewer, fn: a.getLayer(deviceLayer),
			summary: "Get a device's own configuration values", out: fleet.ConfigLayer{}, errs: e(404)},
		{method: "PUT", path: "/api/v1/devices/{id}/config", need: operator, fn: a.putLayer(deviceLayer), query: q(dryRunQuery),
			summary: "Set a device's own configuration values", in: fleet.LayerUpdate{}, out: fleet.ConfigLayer{}, errs: e(404, 422)},
		{method: "DELETE", path: "/api/v1/devices/{id}/config", need: operator, fn: a.deleteLayer(deviceLayer),
			summary: "Delete a device's own configuration values", out: layerDeleted{}, errs: e(404, 422)},
		{method: "GET", path: "/api/v1/devices/{id}/config/history", need: viewer, fn: a.layerHistory(deviceLayer),
			summary: "List the revisions of a device's own configuration values", out: layerRevisions{}, errs: e(404)},
		{method: "GET", path: "/api/v1/devices/{id}/config/diff", need: viewer, fn: a.layerDiff(deviceLayer), query: q("from", "to"),
			summary: "Compare two revisions of a device's own configuration values", out: profileDiff{}, errs: e(404)},
		{method: "POST", path: "/api/v1/devices/{id}/config/rollback", need: operator, fn: a.rollbackLayer(deviceLayer),
			summary: "Roll a device's own configuration values back to a revision", in: rollbackBody{}, out: fleet.ConfigLayer{}, errs: e(404, 422)},
		{method: "GET", path: "/api/v1/labels/{name}/config", need: viewer, fn: a.getLayer(labelLayer),
			summary: "Get a label's (group's) configuration values", out: fleet.ConfigLayer{}, errs: e(404)},
		{method: "PUT", path: "/api/v1/labels/{name}/config", need: operator, fn: a.putLayer(labelLayer), query: q(dryRunQuery),
			summary: "Set a label's (group's) configuration values", in: fleet.LayerUpdate{}, out: fleet.ConfigLayer{}, errs: e(404, 409, 422)},
		{method: "DELETE", path: "/api/v1/labels/{name}/config", need: operator, fn: a.deleteLayer(labelLayer),
			summary: "Delete a label's (group's) configuration values", out: layerDeleted{}, errs: e(404, 409, 422)},
		{method: "GET", path: "/api/v1/labels/{name}/config/history", need: viewer, fn: a.layerHistory(labelLayer),
			summary: "List the revisions of a label's (group's) configuration values", out: layerRevisions{}, errs: e(404)},
		{method: "GET", path: "/api/v1/labels/{name}/config/diff", need: viewer, fn: a.layerDiff(labelLayer), query: q("from", "to"),
			summary: "Compare two revisions of a label's (group's) configuration values", out: profileDiff{}, errs: e(404)},
		{method: "POST", path: "/api/v1/labels/{name}/config/rollout", need: operator, fn: a.createConfigRollout, query: q(dryRunQuery),
			summary: "Stage new values of a label's configuration as a rollout in waves (dry_run: check it, 200)", in: configRolloutBody{}, out: answers{201: fleet.Rollout{}, 200: fleet.Rollout{}}, errs: e(404, 409, 422)},
		{method: "POST", path: "/api/v1/labels/{name}/config/rollback", need: operator, fn: a.rollbackLayer(labelLayer),
			summary: "Roll a label's (group's) configuration values back to a revision", in: rollbackBody{}, out: fleet.ConfigLayer{}, errs: e(404, 409, 422)},
		{method: "GET", path: "/api/v1/config/layers", need: viewer, fn: a.listLayers,
			summary: "List every configuration layer's current revision: devices', labels' and device types' schemas", out: layerList{}},
		{method: "GET", path: "/api/v1/device-types/{type}/schema", need: viewer, fn: a.getLayer(schemaLayer),
			summary: "Get a device type's configuration schema", out: fleet.ConfigLayer{}, errs: e(404)},
		{method: "PUT", path: "/api/v1/device-types/{type}/schema", need: operator, fn: a.putLayer(schemaLayer), query: q(dryRunQuery),
			summary: "Set a device type's configuration schema", in: fleet.LayerUpdate{}, out: fleet.ConfigLayer{}, errs: e(404, 422)},
		{method: "DELETE", path: "/api/v1/device-types/{type}/schema", need: operator, fn: a.deleteLayer(schemaLayer),
			summary: "Delete a device type's configuration schema", out: layerDeleted{}, errs: e(404, 422)},
		{method: "GET", path: "/api/v1/device-types/{type}/schema/history", need: viewer, fn: a.layerHistory(schemaLayer),
			summary: "List the revisions of a device type's configuration schema", out: layerRevisions{}, errs: e(404)},
		{method: "GET", path: "/api/v1/device-types/{type}/schema/diff", need: viewer, fn: a.layerDiff(schemaLayer), query: q("from", "to"),
			summary: "Compare two revisions of a device type's configuration schema", out: profileDiff{}, errs: e(404)},
		{method: "POST", path: "/api/v1/device-types/{type}/schema/rollback", need: operator, fn: a.rollbackLayer(schemaLayer),
			summary: "Roll a device type's configuration schema back to a revision", in: rollbackBody{}, out: fleet.ConfigLayer{}, errs: e(404, 422)},
		{method: "GET", path: "/api/v1/quotas", need: viewer, fn: a.listQuotas,
			summary: "List the quotas and the devices that hit them", out: quotaList{}},
		{method: "GET", path: "/api/v1/devices/{id}/quota", need: viewer, fn: a.getDeviceQuota,
			summary: "Get a device's quota", out: fleet.QuotaHit{}},
		{method: "PUT", path: "/api/v1/devices/{id}/quota", need: operator, fn: a.liftQuota,
			summary: "Lift a device's quota", in: quotaLiftBody{}, out: fleet.QuotaLift{}, errs: e(409)},
		{method: "DELETE", path: "/api/v1/devices/{id}/quota", need: operator, fn: a.restoreQuota,
			summary: "Restore a device's quota", out: quotaRestored{}},
		{method: "GET", path: "/api/v1/stats", need: viewer, fn: a.stats,
			summary: "Get the fleet's counts", out: fleet.Stats{}},
		{method: "GET", path: "/api/v1/cluster", need: viewer, fn: a.getCluster,
			summary: "Get the cluster's nodes", out: clusterView{}, errs: e(404)},
		{method: "GET", path: "/api/v1/server", need: viewer, fn: a.serverInfo,
			summary: "Get the server's machine and process", out: serverInfo{}},
		{method: "GET", path: "/api/v1/labels", need: viewer, fn: a.listLabels,
			summary: "List labels", out: labelList{}},
		{method: "POST", path: "/api/v1/labels/assign", need: operator, fn: a.assignLabel,
			summary: "Add a label to (or remove it from) the devices of a filter", in: labelAssignBody{}, out: labelAssigned{}, errs: e(404, 409)},
		{method: "GET", path: "/api/v1/labels/{name}", need: viewer, fn: a.getLabel,
			summary: "Get a label (with its filter when it is live)", out: fleet.Label{}, errs: e(404)},
		{method: "PUT", path: "/api/v1/labels/{name}", need: operator, fn: a.defineLabel, query: q(dryRunQuery),
			summary: "Make a label live: the devices its filter selects, kept current", in: labelDefineBody{}, out: fleet.Label{}, errs: e(409)},
		{method: "DELETE", path: "/api/v1/labels/{name}", need: operator, fn: a.deleteLabel,
			summary: "Delete a label", out: deleted{}, errs: e(409)},
		{method: "GET", path: "/api/v1/commands", need: viewer, fn: a.listCommands, query: q("limit"),
			summary: "List commands", out: jobList{}},
		{method: "POST", path: "/api/v1/commands", need: operator, fn: a.sendCommand,
			summary: "Send a command", in: commandBody{}, out: created(fleet.Job{}), errs: e(404)},
		{method: "GET", path: "/api/v1/commands/{id}", need: viewer, fn: a.getCommand,
			summary: "Get a command", out: fleet.Job{}},
		{method: "GET", path: "/api/v1/commands/{id}/devices", need: viewer, fn: a.commandDevices, query: q("state", "limit", "cursor", "after"),
			summary: "List a command's devices", out: commandPage{}},
		{method: "POST", path: "/api/v1/commands/{id}/pause", need: operator, fn: a.changeCommand("pause"),
			summary: "Pause a command", in: noBody{}, out: fleet.Job{}, errs: e(409)},
		{method: "POST", path: "/api/v1/commands/{id}/resume", need: operator, fn: a.changeCommand("resume"),
			summary: "Resume a command", in: noBody{}, out: fleet.Job{}, errs: e(409)},
		{method: "POST", path: "/api/v1/commands/{id}/cancel", need: operator, fn: a.changeCommand("cancel"),
			summary: "Cancel a command", in: noBody{}, out: fleet.Job{}, errs: e(409)},
		{method: "GET", path: "/api/v1/devices/{id}/commands", need: viewer, fn: a.deviceCommands, query: q("state", "limit", "cursor", "after"),
			summary: "List a device's commands", out: commandPage{}},
		{method: "GET", path: "/api/v1/alerts", need: viewer, fn: a.listAlerts, query: q("state", "device_id", "rule_id", "limit", "cursor", "before"),
			summary: "List alerts", out: alertPage{}},
		{method: "GET", path: "/api/v1/alerts/rules", need: viewer, fn: a.listRules,
			summary: "List alert rules", out: ruleList{}},
		{method: "POST", path: "/api/v1/alerts/rules", need: operator, fn: a.createRule, query: q(dryRunQuery),
			summary: "Create an alert rule (dry_run: check it, 200)", in: alert.Rule{}, out: answers{201: alert.Rule{}, 200: alert.Rule{}}, errs: e(409)},
		{method: "GET", path: "/api/v1/alerts/rules/{id}", need: viewer, fn: a.getRule,
			summary: "Get an alert rule", out: ruleOut{}},
		{method: "PUT", path: "/api/v1/alerts/rules/{id}", need: operator, fn: a.updateRule, query: q(dryRunQuery),
			summary: "Replace an alert rule", in: alert.Rule{}, out: alert.Rule{}, errs: e(409)},
		{method: "DELETE", path: "/api/v1/alerts/rules/{id}", need: operator, fn: a.deleteRule,
			summary: "Delete an alert rule", out: deleted{}},
		{method: "GET", path: "/api/v1/alerts/deliveries", need: viewer, fn: a.deliveries,
			summary: "List notification deliveries", out: deliveryList{}},
		{method: "GET", path: "/api/v1/alerts/smtp", need: admin, fn: a.getSMTP,
			summary: "Get the e-mail settings", out: smtpOut{}},
		{method: "PUT", path: "/api/v1/alerts/smtp", need: admin, fn: a.putSMTP,
			summary: "Set the e-mail settings", in: alert.SMTPSettings{}, out: smtpOut{}},

		{method: "GET", path: "/api/v1/openapi.json", fn: a.openAPIDoc, // this table as OpenAPI 3.1 (openapi.go)
			summary: "Get this OpenAPI document", out: map[string]any{}},
		{method: "GET", path: "/api/v1/whoami", need: viewer, fn: a.whoami,
			summary: "Get the caller's name and role", out: access.Actor{}},
		{method: "GET", path: "/api/v1/users", need: admin, fn: a.listUsers,
			summary: "List users", out: userList{}},
		{method: "POST", path: "/api/v1/users", need: admin, fn: a.createUser, query: q(dryRunQuery),
			summary: "Create a user (dry_run: check it, 200)", in: userBody{}, out: answers{201: access.User{}, 200: access.User{}}, errs: e(409)},
		{method: "GET", path: "/api/v1/users/{name}", need: admin, fn: a.getUser,
			summary: "Get a user", out: access.User{}},
		{method: "PATCH", path: "/api/v1/users/{name}", need: admin, fn: a.updateUser, query: q(dryRunQuery),
			summary: "Change a user's role or password", in: access.UserChange{}, out: access.User{}},
		{method: "DELETE", path: "/api/v1/users/{name}", need: admin, fn: a.deleteUser,
			summary: "Delete a user", out: deleted{}},
		{method: "GET", path: "/api/v1/tokens", need: admin, fn: a.listTokens, query: q("user"),
			summary: "List API tokens", out: tokenList{}},
		{method: "POST", path: "/api/v1/tokens", need: admin, fn: a.createToken,
			summary: "Create an API token", in: tokenBody{}, out: created(newToken{}), errs: e(404, 409)},
		{method: "GET", path: "/api/v1/tokens/{id}", need: admin, fn: a.getToken,
			summary: "Get an API token", out: access.Token{}},
		{method: "DELETE", path: "/api/v1/tokens/{id}", need: admin, fn: a.revokeToken,
			summary: "Revoke an API token", out: access.Token{}},
		{method: "GET", path: "/api/v1/audit", need: admin, fn: a.listAudit, query: q("actor", "action", "object", "since", "until", "limit", "cursor"),
			summary: "List the audit log", out: auditPage{}},

		// Dashboard (docs/dashboard.md): its own sessions, methods and errors.
		{path: web.Prefix, h: a.ui},
		{method: "GET", path: "/{$}", h: http.RedirectHandler(web.Prefix, http.StatusFound)},

		// Metrics: devices share this port, so a credential is needed
		// (docs/operations.md#metrics-access); --metrics-listen serves
		// them without one on another address.
		{method: "GET", path: "/metrics", need: metricsReader, endpoint: "metrics", h: m.handler(),
			summary: "Get the Prometheus metrics", out: rawAnswer{200, "text/plain"}},

		// Probes, unauthenticated.
		{method: "GET", path: "/healthz", h: http.HandlerFunc(a.healthz),
			summary: "Liveness probe", out: probeAnswer{}},
		{method: "GET", path: "/readyz", h: http.HandlerFunc(a.readyz),
			summary: "Readiness probe", out: answers{200: probeAnswer{}, 503: probeAnswer{}}},
	}
}

// routes builds the handler for the whole table.
func (a *api) routes() http.Handler {
	mux := http.NewServeMux()
	a.allowed = http.NewServeMux()
	a.methods = map[string][]string{}
	qa := &a.quotaAnswers
	qa.atOnce, qa.held, qa.closed = a.m.quotaAnswers.WithLabelValues("at_once"), a.m.quotaAnswers.WithLabelValues("held"), a.m.quotaAnswers.WithLabelValues("closed")
	a.quota429.pushes = a.m.pushes.WithLabelValues(outQuota)
	a.quota429.errors = a.m.badRequests.WithLabelValues("push", strconv.Itoa(http.StatusTooManyRequests), "quota_exceeded")
	table := a.table()
	a.openapi = openAPI(table)
	a.buildSnapshots(table)
	gets := map[string]bool{}
	for _, rt := range table {
		if rt.method == http.MethodGet && rt.fn != nil {
			gets[rt.path] = true
		}
	}
	a.gets = gets
	for _, rt := range table {
		if rt.fn == nil && rt.h == nil {
			continue // a part this server runs without (no dashboard in some tests)
		}
		if mutating(rt.method) {
			rt.object = objectOf(rt, gets)
		}
		h := rt.h
		if rt.fn != nil {
			h = a.wrap(rt)
		} else if rt.method != "" && rt.path != "/{$}" {
			h = a.guard(rt, h) // not the dashboard and its redirect: their own rules
		}
		pattern := rt.path
		if rt.method != "" {
			pattern = rt.method + " " + rt.path
			if _, seen := a.methods[rt.path]; !seen {
				a.allowed.Handle(rt.path, http.NotFoundHandler())
			}
			a.methods[rt.path] = append(a.methods[rt.path], rt.method)
			if rt.method == http.MethodGet {
				a.methods[rt.path] = append(a.methods[rt.path], http.MethodHead)
			}
		}
		mux.Handle(pattern, h)
	}
	mux.HandleFunc("/", a.unrouted)
	if a.node == nil {
		return mux
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header()["X-Drover-Node"] = a.node
		mux.ServeHTTP(w, r)
	})
}

// wrap turns an apiFunc into a handler: access, request slots, the answer
// or its error, and the metrics.
func (a *api) wrap(rt route) http.HandlerFunc {
	if rt.endpoint == "" && rt.need != public {
		rt.endpoint = "admin"
	} else if rt.endpoint == "" {
		rt.endpoint = rt.path
	}
	duration := a.m.duration.WithLabelValues(rt.endpoint)
	audit := mutating(rt.method) && rt.need != public
	limit := int64(protocol.MaxBodyBytes)
	if rt.stream {
		limit = a.fw.max
	}
	return func(w http.ResponseWriter, r *http.Request) {
		// A declared body over the limit is refused before anything
		// else, and before it is read (fail closes the connection).
		if r.ContentLength > limit {
			defer closeAfter(w, r)()
			a.fail(w, &rt, bodyTooLarge(limit, rt.stream))
			return
		}
		r, err := a.authorize(rt.need, r)
		if err == nil {
			err = checkQuery(&rt, r)
		}
		if err != nil {
			a.fail(w, &rt, err)
			return
		}
		// Not timed: a refused push may be held on purpose.
		if rt.refuse != nil {
			var refused bool
			if r, refused = rt.refuse(w, r); refused {
				return
			}
		}
		start := time.Now()
		defer func() { duration.Observe(time.Since(start).Seconds()) }()
		if rt.limited && a.writable != nil {
			if err := a.writable(); err != nil {
				a.fail(w, &rt, &apiError{status: http.StatusServiceUnavailable, code: "unavailable", msg: err.Error(),
					outcome: outUnavailable, retryAfter: 60, spread: true, log: "refusing device writes", cause: err})
				return
			}
		}
		if rt.limited {
			select {
			case a.slots <- struct{}{}:
				a.m.inflight.Inc()
				defer a.release()
			default:
				a.fail(w, &rt, errInflight)
				return
			}
		}
		if rt.stream {
			a.fw.extend(w)
		} else if rt.limited { // the device protocol: decoded in protocol
			r.Body = http.MaxBytesReader(w, r.Body, protocol.MaxBodyBytes)
		} else {
			r.Body = &declaredBody{http.MaxBytesReader(w, r.Body, protocol.MaxBodyBytes), &rt}
		}
		var v any
		if audit {
			v, err = a.audited(&rt, r)
		} else {
			v, err = rt.fn(r)
		}
		if err != nil {
			if answerError(err).status == http.StatusRequestEntityTooLarge {
				defer closeAfter(w, r)() // the rest of the body stays unread
			}
			a.fail(w, &rt, err)
			return
		}
		status := http.StatusOK
		if rt.ok != nil {
			rt.ok(v).Inc()
		}
		switch c := v.(type) {
		case streamBody: // CSV exports (csvexport.go)
			c(w)
			return
		case createdBody:
			status, v = http.StatusCreated, c.v
		case unchangedBody:
			v = c.v
		case acceptedBody:
			status, v = http.StatusAccepted, c.v
			w.Header().Set("Retry-After", strconv.Itoa(c.retryAfter))
		}
		writeJSON(w, status, v)
	}
}

// guard checks a plain handler's access and query parameters.
func (a *api) guard(rt route, h http.Handler) http.HandlerFunc {
	if rt.endpoint == "" {
		rt.endpoint = rt.path
	}
	return func(w http.ResponseWriter, r *http.Request) {
		limit := int64(protocol.MaxBodyBytes) // none of them reads a body but uploads to devices
		if rt.stream {
			limit = a.fileMax
		}
		if r.ContentLength > limit {
			defer closeAfter(w, r)()
			a.fail(w, &rt, bodyTooLarge(limit, false))
			return
		}
		r, err := a.authorize(rt.need, r)
		if err == nil {
			err = checkQuery(&rt, r)
		}
		if err != nil {
			a.fail(w, &rt, err)
			return
		}
		h.ServeHTTP(w, r)
	}
}

func (a *api) release() {
	<-a.slots
	a.m.inflight.Dec()
}

// createdBody is an answer sent with 201 Created.
type createdBody struct{ v any }

func created(v any) any { return createdBody{v} }

// unchangedBody is the answer (200) of a change that changed nothing: the
// audit log records no row for it.
type unchangedBody struct{ v any }

// unrouted answers paths outside the table with 404, and paths in it asked
// with another method with 405 and Allow.
func (a *api) unrouted(w http.ResponseWriter, r *http.Request) {
	other := &route{endpoint: "other"}
	if r.ContentLength > protocol.MaxBodyBytes {
		defer closeAfter(w, r)() // answered without reading the body
	}
	if _, pattern := a.allowed.Handler(r); pattern != "" {
		allow := strings.Join(a.methods[pattern], ", ")
		w.Header().Set("Allow", allow)
		a.fail(w, other, &apiError{status: http.StatusMethodNotAllowed, code: "method_not_allowed",
			msg: r.Method + " is not allowed on " + r.URL.Path + "; allowed: " + allow})
		return
	}
	a.fail(w, other, &apiError{status: http.StatusNotFound, code: "not_found", msg: "no such endpoint: " + r.Method + " " + r.URL.Path})
}

func (a *api) healthz(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

func (a *api) readyz(w http.ResponseWriter, r *http.Request) {
	if err := a.ready(); err != nil {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "not ready", "reason": err.Error()})
		return
	}
	d := ""
	if a.degraded != nil {
		d = a.degraded()
	}
	if d != "" {
		// Still serving correctly, from the database: no reason to take
		// the node out of the balancer.
		writeJSON(w, http.StatusOK, map[string]string{"status": "ready", "degraded": d})
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
}
