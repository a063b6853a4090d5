package server

import (
	"bytes"
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/drover/drover/internal/access"
	"github.com/drover/drover/internal/alert"
	"github.com/drover/drover/internal/cluster"
	"github.com/drover/drover/internal/fleet"
	"github.com/drover/drover/internal/protocol"
	fastjson "github.com/goccy/go-json"
	"github.com/prometheus/client_golang/prometheus"
)

// api serves the device protocol, the operator API and the probes; its
// routes are in routes.go.
type api struct {
	fleet     *fleet.Service
	alerts    *alert.Engine
	ui        http.Handler // the dashboard; nil: none
	m         *metrics
	log       *slog.Logger
	acc       *access.Service // users, tokens, audit log (authz.go)
	openapi   map[string]any  // the OpenAPI document of the table (openapi.go)
	snaps     *snapshots      // GET routes answered in process, for the audit log
	gets      map[string]bool // paths of GET routes
	slots     chan struct{}   // bounds device requests in flight
	ready     func() error
	degraded  func() string // what works less well while ready ("": nothing)
	cnode     *cluster.Node // cluster mode; nil: not
	writable  func() error  // non-nil: device writes are refused (instance lock lost)
	warnLimit rateLimiter
	regLimit  *regLimiter // registrations; nil: unlimited
	fw        firmwareFiles
	hub       *hub     // persistent connections; nil: none (connect.go)
	tunnels   *tunnels // port forwarding; nil: none (tunnel.go)

	backend, persistence string // GET /api/v1/server (serverinfo.go)

	// metricsToken may read /metrics only; nil or empty: none. Reload
	// replaces it.
	metricsToken atomic.Pointer[[]byte]

	// refused counts device requests refused with 503 for overload.
	refused atomic.Uint64

	node []string // the X-Drover-Node header's value; nil: none
	// tarpit holds the answers to pushes over quota (tarpit.go);
	// quota429 counts those refusals where fail would.
	tarpit   tarpit
	quota429 struct{ pushes, errors prometheus.Counter }

	allowed *http.ServeMux      // the table's paths, for 405
	methods map[string][]string // the methods of each path in allowed
}

var bufPool = sync.Pool{New: func() any { return bytes.NewBuffer(make([]byte, 0, 2048)) }}

// apiError is an answer other than 2xx.
type apiError struct {
	status  int
	code    string // the JSON error code
	msg     string
	outcome string // counted by device endpoints
	// retryAfter is the Retry-After header, in seconds; 0 for none.
	retryAfter int
	// spread draws Retry-After from [retryAfter, 2×retryAfter], so that
	// clients refused together do not come back together.
	spread bool
	// log is the line logged (rate-limited) for this answer; "" for none.
	log   string
	cause error
}

func (e *apiError) Error() string { return e.msg }

// retryAfterSeconds is the Retry-After of this answer, spread when asked.
func (e *apiError) retryAfterSeconds() int {
	if !e.spread {
		return e.retryAfter
	}
	return e.retryAfter + rand.IntN(e.retryAfter+1)
}

// badField is a 400 for a wrong request field or parameter.
func badField(msg string) error {
	return &apiError{status: http.StatusBadRequest, code: "invalid_field", msg: msg, outcome: outInvalid}
}

// malformed is a 400 for a body that is not the JSON expected.
func malformed(msg string) error {
	return &apiError{status: http.StatusBadRequest, code: "malformed_json", msg: msg, outcome: outInvalid}
}

// notFound is a 404 for the thing named.
func notFound(what string) error {
	return &apiError{status: http.StatusNotFound, code: "not_found", msg: "no " + what}
}

// ifNotFound turns a not-found error of the domain into notFound(what).
func ifNotFound(err error, what string) error {
	if errors.Is(err, fleet.ErrNotFound) || errors.Is(err, alert.ErrNotFound) {
		return notFound(what)
	}
	return err
}

func overloaded(why string) *apiError {
	return &apiError{status: http.StatusServiceUnavailable, code: "overloaded", msg: why + "; retry later",
		outcome: outOverloaded, retryAfter: 2, spread: true, log: "overloaded"}
}

var (
	errInflight      = overloaded("too many requests in flight")
	errWritesPending = overloaded("too many writes pending")
	errAdminToken    = &apiError{status: http.StatusUnauthorized, code: "unauthorized", msg: "credential missing or wrong: the admin token or a user's API token is needed", outcome: outUnauth}
	errMetricsToken  = &apiError{status: http.StatusUnauthorized, code: "unauthorized", msg: "metrics need the metrics token or the admin token", outcome: outUnauth}
	errNoBearer      = &apiError{status: http.StatusUnauthorized, code: "unauthorized", msg: "missing bearer token", outcome: outUnauth}
	errDeviceToken   = &apiError{status: http.StatusUnauthorized, code: "unauthorized", msg: "unknown or revoked token: register again", outcome: outUnauth}
	errEnrollment    = &apiError{status: http.StatusForbidden, code: "wrong_enrollment_secret", msg: "the enrollment secret is wrong", outcome: outForbidden}
	errCancelled     = &apiError{status: http.StatusServiceUnavailable, code: "unavailable", msg: "the request was cancelled before it was stored",
		outcome: outUnavailable, retryAfter: 5, spread: true}
)

// answerError maps any error a handler returns to its answer: the one place
// where domain errors meet HTTP.
func answerError(err error) *apiError {
	var ae *apiError
	var pe *protocol.Error
	if a := admissionAnswer(err); a != nil {
		return a
	}
	switch {
	case errors.As(err, &ae):
		return ae
	case errors.As(err, &pe):
		status := http.StatusBadRequest
		if pe.Code == protocol.CodeTooLarge {
			status = http.StatusRequestEntityTooLarge
		}
		return &apiError{status: status, code: pe.Code, msg: pe.Message, outcome: outInvalid}
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return errCancelled
	case errors.Is(err, fleet.ErrOverloaded):
		return errWritesPending
	case errors.Is(err, fleet.ErrEnrollment):
		return errEnrollment
	case errors.Is(err, fleet.ErrUnauthorized):
		return errDeviceToken
	case errors.Is(err, fleet.ErrQuota):
		return quotaError(err)
	case errors.Is(err, fleet.ErrProfileInUse), errors.Is(err, fleet.ErrProfileExists), errors.Is(err, fleet.ErrFirmwareExists),
		errors.Is(err, fleet.ErrFirmwareInUse), errors.Is(err, fleet.ErrRolloutState), errors.Is(err, fleet.ErrNoDevices):
		return &apiError{status: http.StatusConflict, code: "conflict", msg: err.Error()}
	case errors.Is(err, fleet.ErrNotPending):
		return &apiError{status: http.StatusNotFound, code: "not_found", msg: err.Error()}
	case errors.Is(err, fleet.ErrTooManyLifts):
		return &apiError{status: http.StatusConflict, code: "too_many_lifts", msg: err.Error()}
	case errors.Is(err, fleet.ErrCursor):
		return &apiError{status: http.StatusBadRequest, code: "invalid_field", msg: "cursor must be a next_cursor value", outcome: outInvalid}
	case errors.Is(err, access.ErrExists):
		return &apiError{status: http.StatusConflict, code: "conflict", msg: err.Error()}
	case errors.Is(err, fleet.ErrInvalid), errors.Is(err, alert.ErrInvalid), errors.Is(err, access.ErrInvalid):
		return &apiError{status: http.StatusBadRequest, code: "invalid_field", msg: err.Error(), outcome: outInvalid}
	case errors.Is(err, fleet.ErrNotFound), errors.Is(err, alert.ErrNotFound), errors.Is(err, access.ErrNotFound):
		return &apiError{status: http.StatusNotFound, code: "not_found", msg: err.Error()}
	case errors.Is(err, alert.ErrDuplicateName):
		return &apiError{status: http.StatusConflict, code: "duplicate_name", msg: err.Error()}
	default:
		return &apiError{status: http.StatusServiceUnavailable, code: "unavailable",
			msg: "the store could not make this durable; retry later", outcome: outUnavailable, retryAfter: 5, spread: true,
			log: "store unavailable", cause: err}
	}
}

// fail answers err with its JSON error body, counts it and logs it.
func (a *api) fail(w http.ResponseWriter, rt *route, err error) {
	e := answerError(err)
	if rt.outcomes != nil && e.outcome != "" {
		rt.outcomes.WithLabelValues(e.outcome).Inc()
		if e.outcome == outOverloaded {
			a.refused.Add(1)
		}
	}
	if e.log != "" && a.warnLimit.allow() {
		if e.cause != nil {
			a.log.Error(e.log, "endpoint", rt.endpoint, "err", e.cause)
		} else {
			a.log.Warn(e.log, "endpoint", rt.endpoint, "reason", strings.TrimSuffix(e.msg, "; retry later"))
		}
	}
	h := w.Header()
	if e.retryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(e.retryAfterSeconds()))
	}
	if e.status == http.StatusUnauthorized {
		h.Set("WWW-Authenticate", `Bearer realm="drover"`)
	}
	a.m.badRequests.WithLabelValues(rt.endpoint, strconv.Itoa(e.status), e.code).Inc()
	writeJSON(w, e.status, protocol.ErrorBody{Error: protocol.ErrorDetail{Code: e.code, Message: e.msg}})
}

// bodyTooLarge is the 413 of a body over limit bytes (a firmware upload's
// limit is --firmware-max-size).
func bodyTooLarge(limit int64, firmware bool) error {
	if firmware {
		return firmwareTooLarge(limit)
	}
	return &protocol.Error{Code: protocol.CodeTooLarge, Message: "body exceeds " + strconv.FormatInt(limit, 10) + " bytes"}
}

// closeAfter closes an HTTP/1 connection after the answer, which is sent
// without reading the rest of the request body: net/http would otherwise
// read up to 256 KiB of it, before the answer and again after it, waiting
// for bytes a client declared and may never send (until the 30 s read
// timeout).
// HTTP/2 resets the stream instead.
func closeAfter(w http.ResponseWriter, r *http.Request) {
	if r.ProtoMajor != 1 {
		return
	}
	w.Header().Set("Connection", "close")
	http.NewResponseController(w).SetReadDeadline(time.Now())
}

// readBody reads a bounded request body into a pooled buffer; wrap has
// bounded r.Body.
func readBody(r *http.Request) (*bytes.Buffer, error) {
	if r.ContentLength > protocol.MaxBodyBytes {
		return nil, &protocol.Error{Code: protocol.CodeTooLarge, Message: "body exceeds " + strconv.Itoa(protocol.MaxBodyBytes) + " bytes"}
	}
	buf := bufPool.Get().(*bytes.Buffer)
	buf.Reset()
	_, err := buf.ReadFrom(r.Body)
	if err != nil {
		putBuf(buf)
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return nil, &protocol.Error{Code: protocol.CodeTooLarge, Message: "body exceeds " + strconv.Itoa(protocol.MaxBodyBytes) + " bytes"}
		}
		return nil, &protocol.Error{Code: "read_error", Message: "reading the body failed: " + err.Error()}
	}
	return buf, nil
}

func putBuf(b *bytes.Buffer) {
	if b.Cap() <= 64<<10 {
		bufPool.Put(b)
	}
}

// decodeStrict reads a JSON body that must not have unknown fields.
func decodeStrict(r *http.Request, what string, v any) error {
	buf, err := readBody(r)
	if err != nil {
		return err
	}
	defer putBuf(buf)
	dec := json.NewDecoder(bytes.NewReader(buf.Bytes()))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return malformed(what + err.Error())
	}
	return nil
}

func (a *api) push(r *http.Request) (any, error) {
	token, ok := bearer(r)
	if !ok {
		return nil, errNoBearer
	}
	// A device over its quota was refused before (refuseOverQuota), which
	// left the token looked up and hashed on the connection.
	auth, ok := takePushAuth(r, token)
	if !ok {
		auth = a.fleet.LookUpToken(token)
	}
	buf, err := readBody(r)
	if err != nil {
		return nil, err
	}
	req, err := protocol.DecodePush(buf.Bytes())
	putBuf(buf)
	if err != nil {
		return nil, err
	}
	return a.fleet.PushChecked(r.Context(), auth, req)
}

func bearer(r *http.Request) (string, bool) {
	h := r.Header.Get("Authorization")
	if len(h) < 8 || !strings.EqualFold(h[:7], "bearer ") {
		return "", false
	}
	t := strings.TrimSpace(h[7:])
	return t, t != ""
}

// isMetricsReader checks the metrics token in constant time.
func (a *api) isMetricsReader(r *http.Request) bool {
	t, ok := bearer(r)
	m := a.metricsToken.Load()
	return ok && m != nil && len(*m) > 0 && subtle.ConstantTimeCompare([]byte(t), *m) == 1
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	buf := bufPool.Get().(*bytes.Buffer)
	buf.Reset()
	if err := fastjson.NewEncoder(buf).Encode(v); err != nil {
		buf.Reset()
		status = http.StatusInternalServerError
		buf.WriteString(`{"error":{"code":"internal","message":"encoding the answer failed"}}` + "\n")
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(buf.Len()))
	w.WriteHeader(status)
	w.Write(buf.Bytes())
	putBuf(buf)
}

func (a *api) listDevices(r *http.Request) (any, error) {
	q := r.URL.Query()
	f, err := a.fleet.ParseFilter(q)
	if err != nil {
		return nil, err
	}
	fq := fleet.Query{Filter: f, After: q.Get("cursor"), Limit: 100, NoTotal: true, Desc: q.Get("dir") == "desc"}
	if v := q.Get("sort"); v != "" {
		var ok bool
		if fq.Sort, ok = fleet.ParseSortBy(v); !ok {
			return nil, badField("sort must be id, machine_id, device_type, firmware, last_seen or sync_state")
		}
	}
	if v := q.Get("dir"); v != "" && v != "asc" && v != "desc" {
		return nil, badField("dir must be asc or desc")
	}
	asCSV, err := wantCSV(r)
	if err != nil {
		return nil, err
	}
	if v := q.Get("limit"); v != "" {
		if asCSV {
			return nil, badField("the CSV export streams every matching device: no limit")
		}
		if fq.Limit, err = strconv.Atoi(v); err != nil || fq.Limit < 1 || fq.Limit > 1000 {
			return nil, badField("limit must be 1..1000")
		}
	}
	if asCSV {
		fq.Limit = 1000
		if _, err := a.fleet.Query(fleet.Query{Filter: f, After: fq.After, Sort: fq.Sort, Desc: fq.Desc, Limit: 1, NoTotal: true}); err != nil {
			return nil, err // a bad cursor, before the 200
		}
		return a.devicesCSV(fq), nil
	}
	res, err := a.fleet.Query(fq)
	if err != nil {
		return nil, err
	}
	return devicePage{res.Devices, res.Next}, nil
}

// devicePage is a page of the devices list, in the order asked (ID by default).
type devicePage struct {
	Devices []fleet.Device `json:"devices"`
	Next    string         `json:"next_cursor,omitempty"`
}

func optUint(v string) (uint64, error) {
	if v == "" {
		return 0, nil
	}
	return strconv.ParseUint(v, 10, 64)
}

// pathID is the {id} of the path.
func pathID(r *http.Request) (uint64, error) {
	id, err := strconv.ParseUint(r.PathValue("id"), 10, 64)
	if err != nil || id == 0 {
		return 0, badField("id must be a positive integer")
	}
	return id, nil
}

func (a *api) getDevice(r *http.Request) (any, error) {
	id, err := pathID(r)
	if err != nil {
		return nil, err
	}
	d, err := a.fleet.Device(r.Context(), id)
	return d, ifNotFound(err, "device "+strconv.FormatUint(id, 10))
}

func (a *api) getHistory(r *http.Request) (any, error) {
	id, err := pathID(r)
	if err != nil {
		return nil, err
	}
	var hq fleet.HistoryQuery
	q := r.URL.Query()
	for _, p := range []struct {
		name string
		t    *time.Time
	}{{"from", &hq.From}, {"to", &hq.To}} {
		if v := q.Get(p.name); v != "" {
			t, err := time.Parse(time.RFC3339Nano, v)
			if err != nil {
				return nil, badField(p.name + " must be an RFC 3339 time")
			}
			*p.t = t
		}
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 10000 {
			return nil, badField("limit must be 1..10000")
		}
		hq.Limit = n
	}
	asCSV, err := wantCSV(r)
	if err != nil {
		return nil, err
	}
	samples, err := a.fleet.History(r.Context(), id, hq)
	if err != nil {
		return nil, ifNotFound(err, "device "+strconv.FormatUint(id, 10))
	}
	if asCSV {
		return historyCSV(samples), nil
	}
	return map[string]any{"device_id": strconv.FormatUint(id, 10), "samples": samples}, nil
}

func (a *api) listProfiles(r *http.Request) (any, error) {
	return map[string]any{"profiles": a.fleet.Profiles()}, nil
}

func (a *api) getProfile(r *http.Request) (any, error) {
	id, err := pathID(r)
	if err != nil {
		return nil, err
	}
	p, ok := a.fleet.Profile(id)
	if !ok {
		return nil, notFound("profile " + strconv.FormatUint(id, 10))
	}
	return p, nil
}

func (a *api) updateProfile(r *http.Request) (any, error) {
	id, err := pathID(r)
	if err != nil {
		return nil, err
	}
	var u fleet.ProfileUpdate
	if err := decodeStrict(r, "profile update: ", &u); err != nil {
		return nil, err
	}
	if u.By, err = changedBy(r); err != nil {
		return nil, err
	}
	p, changed, err := a.fleet.ApplyProfileUpdate(r.Context(), id, u)
	if err != nil {
		return nil, ifNotFound(err, "profile "+strconv.FormatUint(id, 10))
	}
	if !changed {
		return unchangedBody{p}, nil
	}
	return p, nil
}

func (a *api) stats(r *http.Request) (any, error) {
	return a.fleet.Stats(), nil
}

// overloadWatch reports 503s for overload within the last minute.
type overloadWatch struct {
	refused func() uint64 // device requests refused for overload so far
	mu      sync.Mutex
	last    uint64
	changed time.Time
	recent  uint64
}

func (o *overloadWatch) reason() string {
	total := o.refused()
	o.mu.Lock()
	defer o.mu.Unlock()
	now := time.Now()
	if total > o.last {
		if now.Sub(o.changed) > time.Minute {
			o.recent = 0
		}
		o.recent += total - o.last
		o.last, o.changed = total, now
	}
	if o.changed.IsZero() || now.Sub(o.changed) > time.Minute {
		return ""
	}
	return fmt.Sprintf("%d device requests refused with 503 in the last minute (too many in flight or pending writes)", o.recent)
}

// rateLimiter lets one event per second through, so that a flood of the
// same warning logs one line per second.
type rateLimiter struct{ last atomic.Int64 }

func (l *rateLimiter) allow() bool {
	now := time.Now().UnixNano()
	last := l.last.Load()
	return now-last >= int64(time.Second) && l.last.CompareAndSwap(last, now)
}

// StatusCode is the HTTP status of the answer (the dashboard shows it too).
func (e *apiError) StatusCode() int { return e.status }

// setMetricsToken sets the token that may read /metrics ("": none).
func (a *api) setMetricsToken(t string) {
	b := []byte(t)
	a.metricsToken.Store(&b)
}
