package server

import (
	"bytes"
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/drover/drover/internal/fleet"
	"github.com/drover/drover/internal/protocol"
	fastjson "github.com/goccy/go-json"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// api serves the device protocol, the operator API and the probes.
type api struct {
	fleet      *fleet.Service
	m          *metrics
	log        *slog.Logger
	adminToken []byte
	slots      chan struct{} // bounds device requests in flight
	ready      func() error
	warnLimit  rateLimiter
}

var bufPool = sync.Pool{New: func() any { return bytes.NewBuffer(make([]byte, 0, 2048)) }}

func (a *api) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+protocol.PathRegister, a.register)
	mux.HandleFunc("POST "+protocol.PathPush, a.push)
	mux.HandleFunc("GET /api/v1/devices", a.admin(a.listDevices))
	mux.HandleFunc("GET /api/v1/devices/{id}", a.admin(a.getDevice))
	mux.HandleFunc("GET /api/v1/devices/{id}/history", a.admin(a.getHistory))
	mux.HandleFunc("GET /api/v1/profiles", a.admin(a.listProfiles))
	mux.HandleFunc("GET /api/v1/profiles/{id}", a.admin(a.getProfile))
	mux.HandleFunc("PUT /api/v1/profiles/{id}", a.admin(a.updateProfile))
	mux.HandleFunc("PATCH /api/v1/profiles/{id}", a.admin(a.updateProfile))
	mux.HandleFunc("GET /api/v1/stats", a.admin(a.stats))
	mux.Handle("GET /metrics", promhttp.HandlerFor(a.m.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if err := a.ready(); err != nil {
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "not ready", "reason": err.Error()})
			return
		}
		writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		a.fail(w, "other", http.StatusNotFound, "not_found", "no such endpoint: "+r.Method+" "+r.URL.Path)
	})
	return mux
}

// readBody reads a bounded request body into a pooled buffer.
func readBody(w http.ResponseWriter, r *http.Request) (*bytes.Buffer, error) {
	if r.ContentLength > protocol.MaxBodyBytes {
		return nil, &protocol.Error{Code: protocol.CodeTooLarge, Message: "body exceeds " + strconv.Itoa(protocol.MaxBodyBytes) + " bytes"}
	}
	buf := bufPool.Get().(*bytes.Buffer)
	buf.Reset()
	_, err := buf.ReadFrom(http.MaxBytesReader(w, r.Body, protocol.MaxBodyBytes))
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

// acquire takes a request slot or answers 503.
func (a *api) acquire(w http.ResponseWriter, endpoint string) bool {
	select {
	case a.slots <- struct{}{}:
		a.m.inflight.Inc()
		return true
	default:
		a.overloaded(w, endpoint, "too many requests in flight")
		return false
	}
}

func (a *api) release() {
	<-a.slots
	a.m.inflight.Dec()
}

func (a *api) overloaded(w http.ResponseWriter, endpoint, why string) {
	if a.warnLimit.allow() {
		a.log.Warn("overloaded", "endpoint", endpoint, "reason", why)
	}
	w.Header().Set("Retry-After", "2")
	a.fail(w, endpoint, http.StatusServiceUnavailable, "overloaded", why+"; retry later")
}

func (a *api) register(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	defer func() { a.m.regDuration.Observe(time.Since(start).Seconds()) }()
	if !a.acquire(w, "register") {
		a.m.registrations.WithLabelValues(outOverloaded).Inc()
		return
	}
	defer a.release()
	buf, err := readBody(w, r)
	if err != nil {
		a.badInput(w, "register", a.m.registrations, err)
		return
	}
	req, err := protocol.DecodeRegister(buf.Bytes())
	putBuf(buf)
	if err != nil {
		a.badInput(w, "register", a.m.registrations, err)
		return
	}
	resp, err := a.fleet.Register(r.Context(), req)
	if err != nil {
		switch {
		case errors.Is(err, fleet.ErrEnrollment):
			a.m.registrations.WithLabelValues(outForbidden).Inc()
			a.fail(w, "register", http.StatusForbidden, "wrong_enrollment_secret", "the enrollment secret is wrong")
		default:
			a.storeFailure(w, "register", a.m.registrations, err)
		}
		return
	}
	if resp.New {
		a.m.regNew.Inc()
	} else {
		a.m.regRenewed.Inc()
	}
	writeJSON(w, http.StatusOK, resp)
}

func (a *api) push(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	defer func() { a.m.pushDuration.Observe(time.Since(start).Seconds()) }()
	if !a.acquire(w, "push") {
		a.m.pushes.WithLabelValues(outOverloaded).Inc()
		return
	}
	defer a.release()
	token, ok := bearer(r)
	if !ok {
		a.m.pushes.WithLabelValues(outUnauth).Inc()
		a.unauthorized(w, "push", "missing bearer token")
		return
	}
	buf, err := readBody(w, r)
	if err != nil {
		a.badInput(w, "push", a.m.pushes, err)
		return
	}
	req, err := protocol.DecodePush(buf.Bytes())
	putBuf(buf)
	if err != nil {
		a.badInput(w, "push", a.m.pushes, err)
		return
	}
	resp, err := a.fleet.Push(r.Context(), token, req)
	if err != nil {
		if errors.Is(err, fleet.ErrUnauthorized) {
			a.m.pushes.WithLabelValues(outUnauth).Inc()
			a.unauthorized(w, "push", "unknown or revoked token: register again")
			return
		}
		a.storeFailure(w, "push", a.m.pushes, err)
		return
	}
	a.m.pushAccepted.Inc()
	writeJSON(w, http.StatusOK, resp)
}

func bearer(r *http.Request) (string, bool) {
	h := r.Header.Get("Authorization")
	if len(h) < 8 || !strings.EqualFold(h[:7], "bearer ") {
		return "", false
	}
	t := strings.TrimSpace(h[7:])
	return t, t != ""
}

func (a *api) unauthorized(w http.ResponseWriter, endpoint, msg string) {
	w.Header().Set("WWW-Authenticate", `Bearer realm="drover"`)
	a.fail(w, endpoint, http.StatusUnauthorized, "unauthorized", msg)
}

func (a *api) badInput(w http.ResponseWriter, endpoint string, c counterVec, err error) {
	count(c, outInvalid)
	var pe *protocol.Error
	status, code, msg := http.StatusBadRequest, "bad_request", err.Error()
	if errors.As(err, &pe) {
		code, msg = pe.Code, pe.Message
		if pe.Code == protocol.CodeTooLarge {
			status = http.StatusRequestEntityTooLarge
		}
	}
	a.fail(w, endpoint, status, code, msg)
}

func (a *api) storeFailure(w http.ResponseWriter, endpoint string, c counterVec, err error) {
	switch {
	case errors.Is(err, fleet.ErrOverloaded):
		count(c, outOverloaded)
		a.overloaded(w, endpoint, "too many writes pending")
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		count(c, outUnavailable)
		w.Header().Set("Retry-After", "5")
		a.fail(w, endpoint, http.StatusServiceUnavailable, "unavailable", "the request was cancelled before it was stored")
	default:
		count(c, outUnavailable)
		if a.warnLimit.allow() {
			a.log.Error("store unavailable", "endpoint", endpoint, "err", err)
		}
		w.Header().Set("Retry-After", "5")
		a.fail(w, endpoint, http.StatusServiceUnavailable, "unavailable", "the store could not make this durable; retry later")
	}
}

// counterVec counts outcomes; nil counts nothing.
type counterVec = *prometheus.CounterVec

func count(c counterVec, outcome string) {
	if c != nil {
		c.WithLabelValues(outcome).Inc()
	}
}

// fail writes the JSON error body and counts it.
func (a *api) fail(w http.ResponseWriter, endpoint string, status int, code, msg string) {
	a.m.badRequests.WithLabelValues(endpoint, strconv.Itoa(status), code).Inc()
	writeJSON(w, status, protocol.ErrorBody{Error: protocol.ErrorDetail{Code: code, Message: msg}})
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

// admin wraps operator endpoints with bearer-token authentication.
func (a *api) admin(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		t, ok := bearer(r)
		if !ok || subtle.ConstantTimeCompare([]byte(t), a.adminToken) != 1 {
			a.unauthorized(w, "admin", "admin token missing or wrong")
			return
		}
		start := time.Now()
		h(w, r)
		a.m.duration.WithLabelValues("admin").Observe(time.Since(start).Seconds())
	}
}

func (a *api) listDevices(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	var f fleet.Filter
	if v := q.Get("sync_state"); v != "" {
		s, ok := fleet.ParseSyncState(v)
		if !ok {
			a.fail(w, "admin", http.StatusBadRequest, "invalid_field", "sync_state must be arriving, synchronized, sync_pending or sync_error")
			return
		}
		f.SyncState = &s
	}
	if v := q.Get("liveness"); v != "" {
		l, ok := fleet.ParseLiveness(v)
		if !ok {
			a.fail(w, "admin", http.StatusBadRequest, "invalid_field", "liveness must be online, late, offline or unknown")
			return
		}
		f.Liveness = &l
	}
	f.DeviceType, f.Firmware, f.Text = q.Get("device_type"), q.Get("firmware"), q.Get("q")
	if v := q["label"]; len(v) > 0 {
		f.Labels = a.fleet.LabelIDs(v) // alerts_api.go: labels
	}
	var err error
	if f.ProfileID, err = optUint(q.Get("profile_id")); err != nil {
		a.fail(w, "admin", http.StatusBadRequest, "invalid_field", "profile_id must be a positive integer")
		return
	}
	cursor, err := optUint(q.Get("cursor"))
	if err != nil {
		a.fail(w, "admin", http.StatusBadRequest, "invalid_field", "cursor must be a next_cursor value")
		return
	}
	limit := 100
	if v := q.Get("limit"); v != "" {
		if limit, err = strconv.Atoi(v); err != nil || limit < 1 || limit > 1000 {
			a.fail(w, "admin", http.StatusBadRequest, "invalid_field", "limit must be 1..1000")
			return
		}
	}
	writeJSON(w, http.StatusOK, a.fleet.List(f, cursor, limit))
}

func optUint(v string) (uint64, error) {
	if v == "" {
		return 0, nil
	}
	return strconv.ParseUint(v, 10, 64)
}

func (a *api) pathID(w http.ResponseWriter, r *http.Request) (uint64, bool) {
	id, err := strconv.ParseUint(r.PathValue("id"), 10, 64)
	if err != nil || id == 0 {
		a.fail(w, "admin", http.StatusBadRequest, "invalid_field", "id must be a positive integer")
		return 0, false
	}
	return id, true
}

func (a *api) getDevice(w http.ResponseWriter, r *http.Request) {
	id, ok := a.pathID(w, r)
	if !ok {
		return
	}
	d, err := a.fleet.Device(r.Context(), id)
	a.answer(w, "device", id, d, err)
}

// answer writes v, or 404 when the fleet has no such thing, or 503 when the
// store failed.
func (a *api) answer(w http.ResponseWriter, what string, id uint64, v any, err error) {
	switch {
	case errors.Is(err, fleet.ErrNotFound):
		a.fail(w, "admin", http.StatusNotFound, "not_found", "no "+what+" "+strconv.FormatUint(id, 10))
	case err != nil:
		a.storeFailure(w, "admin", nil, err)
	default:
		writeJSON(w, http.StatusOK, v)
	}
}

func (a *api) getHistory(w http.ResponseWriter, r *http.Request) {
	id, ok := a.pathID(w, r)
	if !ok {
		return
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
				a.fail(w, "admin", http.StatusBadRequest, "invalid_field", p.name+" must be an RFC 3339 time")
				return
			}
			*p.t = t
		}
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 10000 {
			a.fail(w, "admin", http.StatusBadRequest, "invalid_field", "limit must be 1..10000")
			return
		}
		hq.Limit = n
	}
	samples, err := a.fleet.History(r.Context(), id, hq)
	a.answer(w, "device", id, map[string]any{"device_id": strconv.FormatUint(id, 10), "samples": samples}, err)
}

func (a *api) listProfiles(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{"profiles": a.fleet.Profiles()})
}

func (a *api) getProfile(w http.ResponseWriter, r *http.Request) {
	id, ok := a.pathID(w, r)
	if !ok {
		return
	}
	p, ok := a.fleet.Profile(id)
	if !ok {
		a.fail(w, "admin", http.StatusNotFound, "not_found", "no profile "+strconv.FormatUint(id, 10))
		return
	}
	writeJSON(w, http.StatusOK, p)
}

func (a *api) updateProfile(w http.ResponseWriter, r *http.Request) {
	id, ok := a.pathID(w, r)
	if !ok {
		return
	}
	buf, err := readBody(w, r)
	if err != nil {
		a.badInput(w, "admin", nil, err)
		return
	}
	defer putBuf(buf)
	var u fleet.ProfileUpdate
	dec := json.NewDecoder(bytes.NewReader(buf.Bytes()))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&u); err != nil {
		a.fail(w, "admin", http.StatusBadRequest, "malformed_json", "profile update: "+err.Error())
		return
	}
	if u.Config != nil {
		c := bytes.TrimSpace(u.Config)
		if len(c) == 0 || c[0] != '{' {
			a.fail(w, "admin", http.StatusBadRequest, "invalid_field", "config must be a JSON object")
			return
		}
		var compact bytes.Buffer
		if err := json.Compact(&compact, c); err != nil {
			a.fail(w, "admin", http.StatusBadRequest, "malformed_json", "config: "+err.Error())
			return
		}
		u.Config = compact.Bytes()
	}
	if u.PushInterval != nil && (*u.PushInterval < 1 || *u.PushInterval > 7*24*3600) {
		a.fail(w, "admin", http.StatusBadRequest, "invalid_field", "push_interval must be 1..604800 seconds")
		return
	}
	p, err := a.fleet.UpdateProfile(r.Context(), id, u)
	a.answer(w, "profile", id, p, err)
}

func (a *api) stats(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, a.fleet.Stats())
}

// rateLimiter lets one event per second through, so that a flood of the
// same warning logs one line per second.
type rateLimiter struct{ last atomic.Int64 }

func (l *rateLimiter) allow() bool {
	now := time.Now().UnixNano()
	last := l.last.Load()
	return now-last >= int64(time.Second) && l.last.CompareAndSwap(last, now)
}
