package server

// Alerts (docs/alerts.md): the engine's setup and loop, and the operator
// API of alerts, rules, deliveries and SMTP settings.

import (
	"context"
	"net/http"
	"strconv"
	"time"

	"github.com/drover/drover/internal/alert"
	"github.com/drover/drover/internal/fleet"
)

// setupAlerts starts the alert engine's state; the engine runs from Serve
// (startAlerts).
func (s *Server) setupAlerts(ctx context.Context) error {
	var as alert.Store // nil: memory mode, kept in memory
	if s.store != nil {
		as = s.store
	}
	smtpPassword, err := readSMTPPassword(s.cfg.SMTPPasswordFile)
	if err != nil {
		return err
	}
	s.smtpPassword = smtpPassword
	opts := alert.Options{Fleet: s.fleet, Store: as, Logger: s.log, Retention: s.cfg.HistoryRetention,
		SecretKey: s.Secrets.settingsKey(), SMTPPassword: smtpPassword}
	if s.node != nil {
		// The leader alone raises alerts (docs/cluster.md); it checks
		// more often, as leadership may move.
		opts.Leading, opts.CheckEvery = s.node.Leader, 5*time.Second
	}
	if s.cstore != nil {
		opts.NextRuleID = s.cstore.NextRuleID // other nodes create rules at the same moment
		// The leadership moves, and two nodes may both lead for a moment.
		opts.NextEventIDs = s.cstore.NextEventIDs
		// A rule or the e-mail settings changed here hold on every node
		// at once: the others read them back at the change log entry.
		opts.OnChange = func(ctx context.Context) { s.fleet.NoteChange(ctx, fleet.ChangeAlerts, 0) }
	}
	eng, err := alert.New(ctx, opts)
	if err != nil {
		return err
	}
	s.alerts = eng
	if s.cstore != nil {
		s.fleet.OnChange(fleet.ChangeAlerts, func(ctx context.Context, _ fleet.Change) error {
			if err := eng.Reload(ctx); err != nil {
				// Never holds the change log up: every check reloads the rules.
				s.log.Warn("alert rules not reloaded", "err", err)
			}
			return nil
		})
	}
	if s.node != nil {
		s.node.Forward(eng.OnPush) // other nodes' pushes, for the alert engine of the leader
	}
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

func (a *api) listAlerts(r *http.Request) (any, error) {
	q := r.URL.Query()
	var eq alert.EventQuery
	var err error
	switch q.Get("state") {
	case "", "all":
	case "active":
		eq.Active = true
	default:
		return nil, badField("state must be active or all")
	}
	for _, p := range []struct {
		name string
		dst  *uint64
	}{{"device_id", &eq.DeviceID}, {"rule_id", &eq.RuleID}} {
		if *p.dst, err = optUint(q.Get(p.name)); err != nil {
			return nil, badField(p.name + " must be a positive integer")
		}
	}
	c, err := cursor(r, "before")
	if err != nil {
		return nil, err
	}
	if eq.Before, err = optUint(c); err != nil {
		return nil, badField("cursor must be a next_cursor value")
	}
	if v := q.Get("limit"); v != "" {
		if eq.Limit, err = strconv.Atoi(v); err != nil || eq.Limit < 1 || eq.Limit > 1000 {
			return nil, badField("limit must be 1..1000")
		}
	}
	evs, err := a.alerts.Events(r.Context(), eq)
	if err != nil {
		return nil, err
	}
	out := alertPage{Alerts: evs, Active: a.alerts.ActiveCount()}
	if len(evs) == eq.EffectiveLimit() {
		next := strconv.FormatUint(evs[len(evs)-1].ID, 10)
		out.NextCursor, out.NextBefore = next, next
	}
	return out, nil
}

// ruleOut is a rule with its active alert count.
type ruleOut struct {
	alert.Rule
	Active int `json:"active"`
}

func (a *api) listRules(r *http.Request) (any, error) {
	active := a.alerts.ActiveByRule()
	out := []ruleOut{}
	for _, rl := range a.alerts.Rules() {
		out = append(out, ruleOut{rl, active[rl.ID]})
	}
	return ruleList{out}, nil
}

func (a *api) getRule(r *http.Request) (any, error) {
	id, err := pathID(r)
	if err != nil {
		return nil, err
	}
	rl, ok := a.alerts.Rule(id)
	if !ok {
		return nil, notFound("rule " + strconv.FormatUint(id, 10))
	}
	return ruleOut{rl, a.alerts.ActiveByRule()[id]}, nil
}

func (a *api) createRule(r *http.Request) (any, error) {
	var rl alert.Rule
	if err := decodeStrict(r, "", &rl); err != nil {
		return nil, err
	}
	dry, err := dryRun(r)
	if err != nil {
		return nil, err
	}
	if dry {
		out, err := a.alerts.CheckRule(r.Context(), 0, rl)
		if err != nil {
			return nil, err
		}
		return unchangedBody{out}, nil
	}
	out, err := a.alerts.CreateRule(r.Context(), rl)
	if err != nil {
		return nil, err
	}
	return created(out), nil
}

func (a *api) updateRule(r *http.Request) (any, error) {
	id, err := pathID(r)
	if err != nil {
		return nil, err
	}
	var rl alert.Rule
	if err := decodeStrict(r, "", &rl); err != nil {
		return nil, err
	}
	dry, err := dryRun(r)
	if err != nil {
		return nil, err
	}
	if dry {
		out, err := a.alerts.CheckRule(r.Context(), id, rl)
		if err != nil {
			return nil, ifNotFound(err, "such rule")
		}
		return unchangedBody{out}, nil
	}
	out, err := a.alerts.UpdateRule(r.Context(), id, rl)
	return out, ifNotFound(err, "such rule")
}

func (a *api) deleteRule(r *http.Request) (any, error) {
	id, err := pathID(r)
	if err != nil {
		return nil, err
	}
	if err := a.alerts.DeleteRule(r.Context(), id); err != nil {
		return nil, ifNotFound(err, "such rule")
	}
	return deleted{strconv.FormatUint(id, 10)}, nil
}

func (a *api) deliveries(r *http.Request) (any, error) {
	queued, dropped := a.alerts.Queued()
	return deliveryList{a.alerts.Deliveries(), queued, dropped}, nil
}

// smtpOut hides the password.
type smtpOut struct {
	alert.SMTPSettings
	Password    string `json:"password,omitempty"`
	PasswordSet bool   `json:"password_set"`
}

func (a *api) getSMTP(r *http.Request) (any, error) {
	s := a.alerts.SMTP()
	return smtpOut{SMTPSettings: s, PasswordSet: s.Password != ""}, nil
}

func (a *api) putSMTP(r *http.Request) (any, error) {
	var in alert.SMTPSettings
	if err := decodeStrict(r, "", &in); err != nil {
		return nil, err
	}
	if err := in.Normalize(); err != nil {
		return nil, badField(err.Error())
	}
	s, err := a.alerts.SetSMTP(r.Context(), in)
	if err != nil {
		return nil, err
	}
	return smtpOut{SMTPSettings: s, PasswordSet: s.Password != ""}, nil
}
