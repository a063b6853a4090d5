package server

// Device admission over HTTP: the operator's admission API (approve,
// reject, block, decommission, delete a device), enrollment tokens,
// preauthorized machines, the -admission policy and its metrics.

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/drover/drover/internal/fleet"
	"github.com/drover/drover/internal/server/transport"
	"github.com/prometheus/client_golang/prometheus"
)

// admissionAnswer maps admission errors to answers; nil for other errors.
func admissionAnswer(err error) *apiError {
	forbidden := func(code string) *apiError {
		return &apiError{status: http.StatusForbidden, code: code, msg: err.Error(), outcome: outRefused}
	}
	switch {
	case errors.Is(err, fleet.ErrBlocked):
		return forbidden("device_blocked")
	case errors.Is(err, fleet.ErrDecommissioned):
		return forbidden("device_decommissioned")
	case errors.Is(err, fleet.ErrNotPreauthorized):
		return forbidden("not_preauthorized")
	case errors.Is(err, fleet.ErrEnrollmentToken):
		return &apiError{status: http.StatusForbidden, code: "invalid_enrollment_token", msg: err.Error(), outcome: outForbidden}
	case errors.Is(err, fleet.ErrCertificateRequired):
		return &apiError{status: http.StatusForbidden, code: "certificate_required", msg: err.Error(), outcome: outForbidden}
	case errors.Is(err, fleet.ErrEnrollConflict):
		return &apiError{status: http.StatusConflict, code: "enrollment_conflict", msg: err.Error(), outcome: outRefused,
			retryAfter: fleet.PendingRetry}
	case errors.Is(err, fleet.ErrNothingToDo):
		return &apiError{status: http.StatusConflict, code: "nothing_to_do", msg: err.Error()}
	case errors.Is(err, fleet.ErrInvalid):
		return &apiError{status: http.StatusBadRequest, code: "invalid_field", msg: err.Error(), outcome: outInvalid}
	}
	return nil
}

func (a *api) listEnrollmentTokens(r *http.Request) (any, error) {
	return enrollmentTokenList{a.fleet.EnrollmentTokens()}, nil
}

func (a *api) createEnrollmentToken(r *http.Request) (any, error) {
	var in enrollmentTokenBody
	if err := decodeStrict(r, "", &in); err != nil {
		return nil, err
	}
	var ttl time.Duration
	if in.TTL != "" {
		var err error
		if ttl, err = time.ParseDuration(in.TTL); err != nil {
			return nil, badField("ttl must be a duration such as 72h")
		}
	}
	secret, t, err := a.fleet.CreateEnrollmentToken(r.Context(), in.MachineID, ttl, in.Note, actor(r))
	if err != nil {
		return nil, err
	}
	return created(newEnrollmentToken{t, secret}), nil
}

// newEnrollmentToken is an enrollment token as created: with its secret,
// shown this once (and never in the audit log).
type newEnrollmentToken struct {
	fleet.EnrollmentToken
	Token string `json:"token"`
}

func (t newEnrollmentToken) auditView() any { return t.EnrollmentToken }

func (a *api) revokeEnrollmentToken(r *http.Request) (any, error) {
	id, err := pathID(r)
	if err != nil {
		return nil, err
	}
	t, err := a.fleet.RevokeEnrollmentToken(r.Context(), id, actor(r))
	return t, ifNotFound(err, "enrollment token "+r.PathValue("id"))
}

func (a *api) listPreauthorized(r *http.Request) (any, error) {
	return preauthorizedList{a.fleet.PreauthorizedIDs()}, nil
}

func (a *api) addPreauthorized(r *http.Request) (any, error) {
	var in preauthorizedBody
	if err := decodeStrict(r, "", &in); err != nil {
		return nil, err
	}
	if len(in.MachineIDs) == 0 || len(in.MachineIDs) > 10000 {
		return nil, badField("machine_ids must list 1 to 10000 machine IDs")
	}
	n, err := a.fleet.AddPreauthorized(r.Context(), in.MachineIDs, actor(r))
	if err != nil {
		return nil, err
	}
	return preauthorizedAdded{n}, nil
}

func (a *api) removePreauthorized(r *http.Request) (any, error) {
	m := r.PathValue("machine_id")
	if err := a.fleet.RemovePreauthorized(r.Context(), m, actor(r)); err != nil {
		return nil, ifNotFound(err, "preauthorized machine ID "+strconv.Quote(m))
	}
	return preauthorizedRemoved{m}, nil
}

// parsePolicy checks -admission.
func parsePolicy(v string) (fleet.Policy, error) {
	p, ok := fleet.ParsePolicy(v)
	if !ok {
		return 0, fmt.Errorf("-admission must be open, approve or preauthorized, not %q", v)
	}
	return p, nil
}

// validateTrust checks the admission settings.
func (c *Config) validateTrust() error {
	if _, err := parsePolicy(c.Admission); err != nil {
		return err
	}
	if c.RequireClientCert && (c.ClientCA == "" || c.Listen == "") {
		return errors.New("-require-client-cert needs -client-ca and -listen (client certificates come with HTTPS)")
	}
	if c.RegisterRate < 0 || c.RegisterRatePerAddress < 0 || c.RegisterBurst < 0 || c.RegisterBurstPerAddress < 0 {
		return errors.New("registration rates and bursts must not be negative")
	}
	if _, err := transport.ParsePrefixes(c.RegisterRateExempt); err != nil {
		return fmt.Errorf("-register-rate-exempt: %w", err)
	}
	return nil
}

// admissionCollector reports devices by admission state and the
// re-enrollment requests waiting, computed when scraped.
type admissionCollector struct{ fleet *fleet.Service }

var (
	admissionDesc = prometheus.NewDesc("drover_devices_admission", "Registered devices by admission state.", []string{"admission"}, nil)
	requestsDesc  = prometheus.NewDesc("drover_enrollment_requests", "Re-enrollment requests waiting for an operator.", nil, nil)
)

func (c *admissionCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- admissionDesc
	ch <- requestsDesc
}

func (c *admissionCollector) Collect(ch chan<- prometheus.Metric) {
	counts, requests := c.fleet.AdmissionCounts()
	for a, n := range counts {
		ch <- prometheus.MustNewConstMetric(admissionDesc, prometheus.GaugeValue, float64(n), a)
	}
	ch <- prometheus.MustNewConstMetric(requestsDesc, prometheus.GaugeValue, float64(requests))
}

// actor names who made an operator request, for the log.
func actor(r *http.Request) string { return "admin-token@" + r.RemoteAddr }
