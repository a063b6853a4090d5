package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/drover/drover/internal/alert"
	"github.com/drover/drover/internal/fleet"
	"github.com/drover/drover/internal/web"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// setupAlerts loads labels and starts the alert engine's state; the engine
// runs from Serve (startAlerts).
func (s *Server) setupAlerts(ctx context.Context, hook *alert.Hook) error {
	if ls, ok := s.store.(fleet.LabelStore); ok {
		if err := s.fleet.AttachLabels(ctx, ls); err != nil {
			return err
		}
	}
	var as alert.Store // nil: kept in memory
	if st, ok := s.store.(alert.Store); ok {
		as = st
	}
	eng, err := alert.New(ctx, alert.Options{Fleet: s.fleet, Store: as, Logger: s.log, Retention: s.cfg.HistoryRetention, Hook: hook})
	if err != nil {
		return err
	}
	s.alerts = eng
	s.m.reg.MustRegister(eng.Collector())
	return nil
}

// startAlerts runs the alert engine; the returned function stops it after
// it has written its queued events.
func (s *Server) startAlerts() (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.alerts.Run(ctx)
	}()
	return func() {
		cancel()
		<-done
	}
}

// withDashboard mounts the dashboard at /ui/ and the alert and label API
// next to the core routes.
func (s *Server) withDashboard(a *api) (http.Handler, error) {
	ov := &overloadWatch{counters: []prometheus.Counter{
		a.m.pushes.WithLabelValues(outOverloaded), a.m.registrations.WithLabelValues(outOverloaded),
	}}
	ui, err := web.New(web.Options{
		Fleet: s.fleet, Alerts: s.alerts, AdminToken: s.Secrets.AdminToken, Ready: s.ready, Overloaded: ov.reason, Logger: s.log,
	})
	if err != nil {
		return nil, err
	}
	x := &alertAPI{api: a, eng: s.alerts}
	mux := http.NewServeMux()
	mux.Handle(web.Prefix, ui)
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, web.Prefix, http.StatusFound)
	})
	mux.HandleFunc("GET /api/v1/alerts", a.admin(x.listAlerts))
	mux.HandleFunc("GET /api/v1/alerts/rules", a.admin(x.listRules))
	mux.HandleFunc("POST /api/v1/alerts/rules", a.admin(x.createRule))
	mux.HandleFunc("GET /api/v1/alerts/rules/{id}", a.admin(x.getRule))
	mux.HandleFunc("PUT /api/v1/alerts/rules/{id}", a.admin(x.updateRule))
	mux.HandleFunc("DELETE /api/v1/alerts/rules/{id}", a.admin(x.deleteRule))
	mux.HandleFunc("GET /api/v1/alerts/deliveries", a.admin(x.deliveries))
	mux.HandleFunc("GET /api/v1/alerts/smtp", a.admin(x.getSMTP))
	mux.HandleFunc("PUT /api/v1/alerts/smtp", a.admin(x.putSMTP))
	mux.HandleFunc("GET /api/v1/labels", a.admin(x.listLabels))
	mux.HandleFunc("POST /api/v1/labels/assign", a.admin(x.assignLabel))
	mux.HandleFunc("DELETE /api/v1/labels/{name}", a.admin(x.deleteLabel))
	mux.Handle("/", a.routes())
	return mux, nil
}

// overloadWatch reports 503s for overload within the last minute.
type overloadWatch struct {
	counters []prometheus.Counter
	mu       sync.Mutex
	last     float64
	changed  time.Time
	recent   float64
}

func (o *overloadWatch) reason() string {
	total := 0.0
	for _, c := range o.counters {
		var m dto.Metric
		if c.Write(&m) == nil {
			total += m.GetCounter().GetValue()
		}
	}
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
	return fmt.Sprintf("%.0f device requests refused with 503 in the last minute (too many in flight or pending writes)", o.recent)
}

type alertAPI struct {
	*api
	eng *alert.Engine
}

func (x *alertAPI) listAlerts(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	var eq alert.EventQuery
	var err error
	switch q.Get("state") {
	case "", "all":
	case "active":
		eq.Active = true
	default:
		x.fail(w, "admin", http.StatusBadRequest, "invalid_field", "state must be active or all")
		return
	}
	for _, p := range []struct {
		name string
		dst  *uint64
	}{{"device_id", &eq.DeviceID}, {"rule_id", &eq.RuleID}, {"before", &eq.Before}} {
		if *p.dst, err = optUint(q.Get(p.name)); err != nil {
			x.fail(w, "admin", http.StatusBadRequest, "invalid_field", p.name+" must be a positive integer")
			return
		}
	}
	if v := q.Get("limit"); v != "" {
		if eq.Limit, err = strconv.Atoi(v); err != nil || eq.Limit < 1 || eq.Limit > 1000 {
			x.fail(w, "admin", http.StatusBadRequest, "invalid_field", "limit must be 1..1000")
			return
		}
	}
	evs, err := x.eng.Events(r.Context(), eq)
	if err != nil {
		x.storeFailure(w, "admin", nil, err)
		return
	}
	out := map[string]any{"alerts": evs, "active": x.eng.ActiveCount()}
	if len(evs) == eq.EffectiveLimit() {
		out["next_before"] = strconv.FormatUint(evs[len(evs)-1].ID, 10)
	}
	writeJSON(w, http.StatusOK, out)
}

// ruleOut is a rule with its active alert count.
type ruleOut struct {
	alert.Rule
	Active int `json:"active"`
}

func (x *alertAPI) listRules(w http.ResponseWriter, r *http.Request) {
	active := x.eng.ActiveByRule()
	out := []ruleOut{}
	for _, rl := range x.eng.Rules() {
		out = append(out, ruleOut{rl, active[rl.ID]})
	}
	writeJSON(w, http.StatusOK, map[string]any{"rules": out})
}

func (x *alertAPI) getRule(w http.ResponseWriter, r *http.Request) {
	id, ok := x.pathID(w, r)
	if !ok {
		return
	}
	rl, ok := x.eng.Rule(id)
	if !ok {
		x.fail(w, "admin", http.StatusNotFound, "not_found", "no rule "+strconv.FormatUint(id, 10))
		return
	}
	writeJSON(w, http.StatusOK, ruleOut{rl, x.eng.ActiveByRule()[id]})
}

// decodeStrict reads a JSON body that must not have unknown fields.
func (x *alertAPI) decodeStrict(w http.ResponseWriter, r *http.Request, v any) bool {
	buf, err := readBody(w, r)
	if err != nil {
		x.badInput(w, "admin", nil, err)
		return false
	}
	defer putBuf(buf)
	dec := json.NewDecoder(bytes.NewReader(buf.Bytes()))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		x.fail(w, "admin", http.StatusBadRequest, "malformed_json", err.Error())
		return false
	}
	return true
}

func (x *alertAPI) createRule(w http.ResponseWriter, r *http.Request) {
	var rl alert.Rule
	if !x.decodeStrict(w, r, &rl) {
		return
	}
	out, err := x.eng.CreateRule(r.Context(), rl)
	if !x.ruleError(w, err) {
		return
	}
	writeJSON(w, http.StatusCreated, out)
}

func (x *alertAPI) updateRule(w http.ResponseWriter, r *http.Request) {
	id, ok := x.pathID(w, r)
	if !ok {
		return
	}
	var rl alert.Rule
	if !x.decodeStrict(w, r, &rl) {
		return
	}
	out, err := x.eng.UpdateRule(r.Context(), id, rl)
	if !x.ruleError(w, err) {
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// ruleError answers a rule change's error; true when there was none.
func (x *alertAPI) ruleError(w http.ResponseWriter, err error) bool {
	switch {
	case err == nil:
		return true
	case errors.Is(err, alert.ErrNotFound):
		x.fail(w, "admin", http.StatusNotFound, "not_found", "no such rule")
	case errors.Is(err, alert.ErrDuplicateName):
		x.fail(w, "admin", http.StatusConflict, "duplicate_name", err.Error())
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		x.storeFailure(w, "admin", nil, err)
	case errors.Is(err, alert.ErrInvalid):
		x.fail(w, "admin", http.StatusBadRequest, "invalid_field", err.Error())
	default:
		x.storeFailure(w, "admin", nil, err)
	}
	return false
}

func (x *alertAPI) deleteRule(w http.ResponseWriter, r *http.Request) {
	id, ok := x.pathID(w, r)
	if !ok {
		return
	}
	if err := x.eng.DeleteRule(r.Context(), id); !x.ruleError(w, err) {
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"deleted": strconv.FormatUint(id, 10)})
}

func (x *alertAPI) deliveries(w http.ResponseWriter, r *http.Request) {
	queued, dropped := x.eng.Queued()
	writeJSON(w, http.StatusOK, map[string]any{"deliveries": x.eng.Deliveries(), "queued": queued, "dropped": dropped})
}

// smtpOut hides the password.
type smtpOut struct {
	alert.SMTPSettings
	Password    string `json:"password,omitempty"`
	PasswordSet bool   `json:"password_set"`
}

func (x *alertAPI) getSMTP(w http.ResponseWriter, r *http.Request) {
	s := x.eng.SMTP()
	writeJSON(w, http.StatusOK, smtpOut{SMTPSettings: s, PasswordSet: s.Password != ""})
}

func (x *alertAPI) putSMTP(w http.ResponseWriter, r *http.Request) {
	var in alert.SMTPSettings
	if !x.decodeStrict(w, r, &in) {
		return
	}
	if err := in.Normalize(); err != nil {
		x.fail(w, "admin", http.StatusBadRequest, "invalid_field", err.Error())
		return
	}
	s, err := x.eng.SetSMTP(r.Context(), in)
	if err != nil {
		x.storeFailure(w, "admin", nil, err)
		return
	}
	writeJSON(w, http.StatusOK, smtpOut{SMTPSettings: s, PasswordSet: s.Password != ""})
}

func (x *alertAPI) listLabels(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{"labels": x.fleet.Labels()})
}

// labelFilter is the JSON form of the devices filter.
type labelFilter struct {
	SyncState  string   `json:"sync_state"`
	Liveness   string   `json:"liveness"`
	DeviceType string   `json:"device_type"`
	Firmware   string   `json:"firmware"`
	ProfileID  uint64   `json:"profile_id,string"`
	Q          string   `json:"q"`
	Labels     []string `json:"labels"`
}

func (x *alertAPI) assignLabel(w http.ResponseWriter, r *http.Request) {
	var in struct {
		Label  string       `json:"label"`
		Remove bool         `json:"remove"`
		Filter *labelFilter `json:"filter"`
	}
	if !x.decodeStrict(w, r, &in) {
		return
	}
	if in.Filter == nil {
		x.fail(w, "admin", http.StatusBadRequest, "invalid_field", `filter is required ({} selects every device)`)
		return
	}
	f, msg := in.Filter.fleetFilter(x.fleet)
	if msg != "" {
		x.fail(w, "admin", http.StatusBadRequest, "invalid_field", msg)
		return
	}
	n, err := x.fleet.AssignLabel(r.Context(), in.Label, f, in.Remove)
	switch {
	case errors.Is(err, fleet.ErrLabelName), errors.Is(err, fleet.ErrTooManyIDs):
		x.fail(w, "admin", http.StatusBadRequest, "invalid_field", "label: "+err.Error())
	case errors.Is(err, fleet.ErrNotFound):
		x.fail(w, "admin", http.StatusNotFound, "not_found", "no label "+strconv.Quote(in.Label))
	case err != nil:
		x.storeFailure(w, "admin", nil, err)
	default:
		writeJSON(w, http.StatusOK, map[string]any{"label": in.Label, "changed": n, "removed": in.Remove})
	}
}

func (f *labelFilter) fleetFilter(fl *fleet.Service) (fleet.Filter, string) {
	var out fleet.Filter
	if f.SyncState != "" {
		v, ok := fleet.ParseSyncState(f.SyncState)
		if !ok {
			return out, "sync_state must be arriving, synchronized, sync_pending or sync_error"
		}
		out.SyncState = &v
	}
	if f.Liveness != "" {
		v, ok := fleet.ParseLiveness(f.Liveness)
		if !ok {
			return out, "liveness must be online, late, offline or unknown"
		}
		out.Liveness = &v
	}
	out.DeviceType, out.Firmware, out.ProfileID, out.Text = f.DeviceType, f.Firmware, f.ProfileID, f.Q
	if len(f.Labels) > 0 {
		out.Labels = fl.LabelIDs(f.Labels)
	}
	return out, ""
}

func (x *alertAPI) deleteLabel(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	err := x.fleet.DeleteLabel(r.Context(), name)
	switch {
	case errors.Is(err, fleet.ErrNotFound):
		x.fail(w, "admin", http.StatusNotFound, "not_found", "no label "+strconv.Quote(name))
	case err != nil:
		x.storeFailure(w, "admin", nil, err)
	default:
		writeJSON(w, http.StatusOK, map[string]any{"deleted": name})
	}
}
