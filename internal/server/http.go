package server

import (
	"bytes"
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/drover/drover/internal/access"
	"github.com/drover/drover/internal/alert"
	"github.com/drover/drover/internal/cluster"
	"github.com/drover/drover/internal/fleet"
	"github.com/drover/drover/internal/httpclose"
	"github.com/drover/drover/internal/protocol"
	"github.com/drover/drover/internal/server/transport"
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
	relays    *relays  // cluster mode: sessions relayed to other nodes (relay.go)
	fileMax   int64    // the largest file upload to a device (remote.go)

	backend, persistence string // GET /api/v1/server (serverinfo.go)

	// metricsToken may read /metrics only; nil or empty: none. Reload
	// replaces it.
	metricsToken atomic.Pointer[[]byte]

	// refused counts device requests refused with 503 for overload.
	refused atomic.Uint64

	node []string // the X-Drover-Node header's value; nil: none
	// tarpit holds the answers to pushes over quota (push.go),
	// quotaAnswers counts them by answer; quota429 counts those refusals
	// where fail would.
	tarpit       transport.Tarpit
	quotaAnswers struct{ atOnce, held, closed prometheus.Counter }
	quota429     struct{ pushes, errors prometheus.Counter }

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
		errors.Is(err, fleet.ErrFirmwareInUse), errors.Is(err, fleet.ErrRolloutState), errors.Is(err, fleet.ErrNoDevices),
		errors.Is(err, fleet.ErrLabelLive), errors.Is(err, fleet.ErrLabelInUse):
		return &apiError{status: http.StatusConflict, code: "conflict", msg: err.Error()}
	case errors.Is(err, fleet.ErrNotPending):
		return &apiError{status: http.StatusNotFound, code: "not_found", msg: err.Error()}
	case errors.Is(err, fleet.ErrTooManyLifts):
		return &apiError{status: http.StatusConflict, code: "too_many_lifts", msg: err.Error()}
	case errors.Is(err, fleet.ErrSchema):
		return &apiError{status: http.StatusUnprocessableEntity, code: "schema_violation", msg: err.Error(), outcome: outInvalid}
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

// closeAfter marks the answer as the connection's last, sent without
// reading the rest of the request body: net/http would otherwise read up
// to 256 KiB of it before the answer, waiting for bytes a client declared
// and may never send. Run the function it returns after the answer:
// defer closeAfter(w, r)().
func closeAfter(w http.ResponseWriter, r *http.Request) func() {
	return httpclose.After(w, r)
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

// declaredBody is the body of a request to an apiFunc, with its route:
// decodeStrict decodes it only into the type the route declares (route.in),
// so that the OpenAPI document describes every body a handler reads.
type declaredBody struct {
	io.ReadCloser
	rt *route
}

// decodeStrict reads a JSON body that must not have unknown fields.
func decodeStrict(r *http.Request, what string, v any) error {
	if d, ok := r.Body.(*declaredBody); ok && (d.rt.in == nil || reflect.TypeOf(d.rt.in) != reflect.TypeOf(v).Elem()) {
		return &apiError{status: http.StatusInternalServerError, code: "internal",
			msg: fmt.Sprintf("%s %s decodes a body of type %v, but its route declares %v: set route.in in routes.go", d.rt.method, d.rt.path, reflect.TypeOf(v).Elem(), reflect.TypeOf(d.rt.in))}
	}
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
	if p, ok := v.(protocol.PushResponse); ok && plainPushAnswer(&p) {
		buf.Write(appendPushAnswer(buf.AvailableBuffer(), p.PushInterval))
	} else if err := fastjson.NewEncoder(buf).Encode(v); err != nil {
		buf.Reset()
		status = http.StatusInternalServerError
		buf.WriteString(`{"error":{"code":"internal","message":"encoding the answer failed"}}` + "\n")
	}
	// The keys are canonical already: no Header.Set, which canonicalizes
	// them again on every answer. One allocation holds both values.
	h := w.Header()
	hv := make([]string, 2)
	hv[0], hv[1] = "application/json", strconv.Itoa(buf.Len())
	h["Content-Type"], h["Content-Length"] = hv[0:1:1], hv[1:2:2]
	w.WriteHeader(status)
	w.Write(buf.Bytes())
	putBuf(buf)
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
