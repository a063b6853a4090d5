package server

// The whole HTTP interface of `drover serve`, on one page.
//
// To add an endpoint: add one line to (*api).table below and write its
// handler as an apiFunc, func(*http.Request) (any, error). Return the answer
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
		{method: "POST", path: protocol.PathRegister, endpoint: "register", fn: a.registerDevice, limited: true, outcomes: m.registrations, ok: regOK},
		{method: "GET", path: protocol.PathConnect, endpoint: "connect", h: a.connectHandler()},
		{method: "GET", path: tunnel.PathLink, endpoint: "tunnel_link", h: a.tunnelLinkHandler()},
		{method: "POST", path: protocol.PathPush, endpoint: "push", fn: a.push, limited: true, refuse: a.admitPush, outcomes: m.pushes, ok: pushOK},

		// Operator API (docs/operations.md).
		{method: "GET", path: "/api/v1/devices", need: viewer, fn: a.listDevices, query: deviceListQuery},
		{method: "GET", path: "/api/v1/devices/{id}", need: viewer, fn: a.getDevice},
		{method: "GET", path: "/api/v1/devices/{id}/tunnel", need: remoteAccess, endpoint: "tunnel", h: a.tunnelHandler(), query: q("to")},
		{method: "GET", path: "/api/v1/devices/{id}/terminal", need: remoteAccess, endpoint: "terminal", h: a.terminalHandler(), query: q("cols", "rows", "command")},
		{method: "GET", path: "/api/v1/devices/{id}/files", need: remoteAccess, endpoint: "files", h: a.filesHandler(false), query: q("path")},
		{method: "PUT", path: "/api/v1/devices/{id}/files", need: remoteAccess, endpoint: "files", h: a.filesHandler(true), query: q("path"), stream: true},
		{method: "GET", path: "/api/v1/devices/{id}/history", need: viewer, fn: a.getHistory, query: q("from", "to", "limit", "format")},
		{method: "POST", path: "/api/v1/devices/{id}/approve", need: operator, fn: a.admitDevice(fleet.Approve)},
		{method: "POST", path: "/api/v1/devices/{id}/reject", need: operator, fn: a.admitDevice(fleet.Reject)},
		{method: "POST", path: "/api/v1/devices/{id}/block", need: operator, fn: a.admitDevice(fleet.Block)},
		{method: "POST", path: "/api/v1/devices/{id}/decommission", need: operator, fn: a.admitDevice(fleet.Decommission)},
		{method: "DELETE", path: "/api/v1/devices/{id}", need: operator, fn: a.admitDevice(fleet.Delete)},
		{method: "GET", path: "/api/v1/enrollment-tokens", need: admin, fn: a.listEnrollmentTokens},
		{method: "POST", path: "/api/v1/enrollment-tokens", need: admin, fn: a.createEnrollmentToken},
		{method: "DELETE", path: "/api/v1/enrollment-tokens/{id}", need: admin, fn: a.revokeEnrollmentToken},
		{method: "GET", path: "/api/v1/preauthorized", need: viewer, fn: a.listPreauthorized},
		{method: "POST", path: "/api/v1/preauthorized", need: operator, fn: a.addPreauthorized},
		{method: "DELETE", path: "/api/v1/preauthorized/{machine_id}", need: operator, fn: a.removePreauthorized},
		{method: "GET", path: "/api/v1/profiles", need: viewer, fn: a.listProfiles},
		{method: "GET", path: "/api/v1/profiles/{id}", need: viewer, fn: a.getProfile},
		{method: "PUT", path: "/api/v1/profiles/{id}", need: operator, fn: a.updateProfile},
		{method: "PATCH", path: "/api/v1/profiles/{id}", need: operator, fn: a.updateProfile},
		{method: "DELETE", path: "/api/v1/profiles/{id}", need: operator, fn: a.deleteProfile},
		{method: "GET", path: "/api/v1/profiles/policy", need: viewer, fn: a.getProfilePolicy},
		{method: "PUT", path: "/api/v1/profiles/policy", need: operator, fn: a.putProfilePolicy},
		{method: "GET", path: "/api/v1/profiles/pending", need: viewer, fn: a.pendingFirmware},
		{method: "POST", path: "/api/v1/profiles/approve", need: operator, fn: a.approveFirmware},
		{method: "POST", path: "/api/v1/profiles/cleanup", need: operator, fn: a.cleanupProfiles},
		{method: "GET", path: "/api/v1/profiles/{id}/history", need: viewer, fn: a.profileHistory},
		{method: "GET", path: "/api/v1/profiles/{id}/diff", need: viewer, fn: a.profileDiff, query: q("from", "to")},
		{method: "POST", path: "/api/v1/profiles/{id}/rollback", need: operator, fn: a.rollbackProfile},
		{method: "GET", path: "/api/v1/firmware", need: viewer, fn: a.listFirmware},
		{method: "POST", path: "/api/v1/firmware", need: operator, fn: a.uploadFirmware, stream: true, query: q("device_type", "version", "sha256", "signature")},
		{method: "GET", path: "/api/v1/firmware/{id}", need: viewer, fn: a.getFirmware},
		{method: "DELETE", path: "/api/v1/firmware/{id}", need: operator, fn: a.deleteFirmware},
		// Firmware files: devices with their token (own device type), or
		// the admin token; checked in the handler.
		{method: "GET", path: protocol.PathFirmware + "{id}/file", h: http.HandlerFunc(a.firmwareFile)},
		{method: "GET", path: "/api/v1/rollouts", need: viewer, fn: a.listRollouts},
		{method: "POST", path: "/api/v1/rollouts", need: operator, fn: a.createRollout},
		{method: "GET", path: "/api/v1/rollouts/{id}", need: viewer, fn: a.getRollout},
		{method: "GET", path: "/api/v1/rollouts/{id}/devices", need: viewer, fn: a.rolloutDevices, query: q("state", "limit", "cursor", "after")},
		{method: "POST", path: "/api/v1/rollouts/{id}/pause", need: operator, fn: a.controlRollout(fleet.ActionPause)},
		{method: "POST", path: "/api/v1/rollouts/{id}/resume", need: operator, fn: a.controlRollout(fleet.ActionResume)},
		{method: "POST", path: "/api/v1/rollouts/{id}/abort", need: operator, fn: a.controlRollout(fleet.ActionAbort)},
		{method: "GET", path: "/api/v1/quotas", need: viewer, fn: a.listQuotas},
		{method: "GET", path: "/api/v1/devices/{id}/quota", need: viewer, fn: a.getDeviceQuota},
		{method: "PUT", path: "/api/v1/devices/{id}/quota", need: operator, fn: a.liftQuota},
		{method: "DELETE", path: "/api/v1/devices/{id}/quota", need: operator, fn: a.restoreQuota},
		{method: "GET", path: "/api/v1/stats", need: viewer, fn: a.stats},
		{method: "GET", path: "/api/v1/cluster", need: viewer, fn: a.getCluster},
		{method: "GET", path: "/api/v1/server", need: viewer, fn: a.serverInfo},
		{method: "GET", path: "/api/v1/labels", need: viewer, fn: a.listLabels},
		{method: "POST", path: "/api/v1/labels/assign", need: operator, fn: a.assignLabel},
		{method: "DELETE", path: "/api/v1/labels/{name}", need: operator, fn: a.deleteLabel},
		{method: "GET", path: "/api/v1/commands", need: viewer, fn: a.listCommands, query: q("limit")},
		{method: "POST", path: "/api/v1/commands", need: operator, fn: a.sendCommand},
		{method: "GET", path: "/api/v1/commands/{id}", need: viewer, fn: a.getCommand},
		{method: "GET", path: "/api/v1/commands/{id}/devices", need: viewer, fn: a.commandDevices, query: q("state", "limit", "cursor", "after")},
		{method: "POST", path: "/api/v1/commands/{id}/pause", need: operator, fn: a.changeCommand("pause")},
		{method: "POST", path: "/api/v1/commands/{id}/resume", need: operator, fn: a.changeCommand("resume")},
		{method: "POST", path: "/api/v1/commands/{id}/cancel", need: operator, fn: a.changeCommand("cancel")},
		{method: "GET", path: "/api/v1/devices/{id}/commands", need: viewer, fn: a.deviceCommands, query: q("state", "limit", "cursor", "after")},
		{method: "GET", path: "/api/v1/alerts", need: viewer, fn: a.listAlerts, query: q("state", "device_id", "rule_id", "limit", "cursor", "before")},
		{method: "GET", path: "/api/v1/alerts/rules", need: viewer, fn: a.listRules},
		{method: "POST", path: "/api/v1/alerts/rules", need: operator, fn: a.createRule},
		{method: "GET", path: "/api/v1/alerts/rules/{id}", need: viewer, fn: a.getRule},
		{method: "PUT", path: "/api/v1/alerts/rules/{id}", need: operator, fn: a.updateRule},
		{method: "DELETE", path: "/api/v1/alerts/rules/{id}", need: operator, fn: a.deleteRule},
		{method: "GET", path: "/api/v1/alerts/deliveries", need: viewer, fn: a.deliveries},
		{method: "GET", path: "/api/v1/alerts/smtp", need: admin, fn: a.getSMTP},
		{method: "PUT", path: "/api/v1/alerts/smtp", need: admin, fn: a.putSMTP},

		{method: "GET", path: "/api/v1/openapi.json", fn: a.openAPIDoc}, // this table as OpenAPI 3.1 (openapi.go)
		{method: "GET", path: "/api/v1/whoami", need: viewer, fn: a.whoami},
		{method: "GET", path: "/api/v1/users", need: admin, fn: a.listUsers},
		{method: "POST", path: "/api/v1/users", need: admin, fn: a.createUser},
		{method: "GET", path: "/api/v1/users/{name}", need: admin, fn: a.getUser},
		{method: "PATCH", path: "/api/v1/users/{name}", need: admin, fn: a.updateUser},
		{method: "DELETE", path: "/api/v1/users/{name}", need: admin, fn: a.deleteUser},
		{method: "GET", path: "/api/v1/tokens", need: admin, fn: a.listTokens, query: q("user")},
		{method: "POST", path: "/api/v1/tokens", need: admin, fn: a.createToken},
		{method: "GET", path: "/api/v1/tokens/{id}", need: admin, fn: a.getToken},
		{method: "DELETE", path: "/api/v1/tokens/{id}", need: admin, fn: a.revokeToken},
		{method: "GET", path: "/api/v1/audit", need: admin, fn: a.listAudit, query: q("actor", "action", "object", "since", "until", "limit", "cursor")},

		// Dashboard (docs/dashboard.md): its own sessions, methods and errors.
		{path: web.Prefix, h: a.ui},
		{method: "GET", path: "/{$}", h: http.RedirectHandler(web.Prefix, http.StatusFound)},

		// Metrics: devices share this port, so a credential is needed
		// (docs/operations.md#metrics-access); --metrics-listen serves
		// them without one on another address.
		{method: "GET", path: "/metrics", need: metricsReader, endpoint: "metrics", h: m.handler()},

		// Probes, unauthenticated.
		{method: "GET", path: "/healthz", h: http.HandlerFunc(a.healthz)},
		{method: "GET", path: "/readyz", h: http.HandlerFunc(a.readyz)},
	}
}

// routes builds the handler for the whole table.
func (a *api) routes() http.Handler {
	mux := http.NewServeMux()
	a.allowed = http.NewServeMux()
	a.methods = map[string][]string{}
	t := &a.tarpit
	t.atOnce, t.held, t.closed = a.m.quotaAnswers.WithLabelValues("at_once"), a.m.quotaAnswers.WithLabelValues("held"), a.m.quotaAnswers.WithLabelValues("closed")
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
		} else {
			r.Body = http.MaxBytesReader(w, r.Body, protocol.MaxBodyBytes)
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
