package server

// The device protocol's registration, POST /api/v1/register
// (docs/protocol.md): its proofs (bearer token, client certificate), its
// answers (202 while pending, 403/409/429 with stable codes, admission.go)
// and its rate limits (transport.RegisterLimiter).

import (
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/drover/drover/internal/fleet"
	"github.com/drover/drover/internal/protocol"
	"github.com/drover/drover/internal/server/transport"
)

// Outcomes of drover_registrations_total added by admission.
const (
	outPending     = "pending"
	outRateLimited = "rate_limited"
	outRefused     = "refused" // blocked, decommissioned, not preauthorized, conflicting
)

// acceptedBody is an answer sent with 202 Accepted and Retry-After.
type acceptedBody struct {
	v          any
	retryAfter int
}

// registerDevice is POST /api/v1/register.
func (a *api) registerDevice(r *http.Request) (any, error) {
	if a.regLimit != nil {
		if ok, wait := a.regLimit.Allow(r.RemoteAddr, time.Now()); !ok {
			return nil, rateLimited(wait)
		}
	}
	buf, err := readBody(r)
	if err != nil {
		return nil, err
	}
	req, err := protocol.DecodeRegister(buf.Bytes())
	putBuf(buf)
	pr := fleet.Proof{Source: r.RemoteAddr, CertNames: certNames(r)}
	if errors.Is(err, protocol.ErrNoCredential) && len(pr.CertNames) > 0 {
		err = nil // a client certificate is the credential (docs/protocol.md)
	}
	if err != nil {
		return nil, err
	}
	pr.Token, _ = bearer(r)
	resp, err := a.fleet.RegisterWith(r.Context(), req, pr)
	if err != nil {
		return nil, err
	}
	if resp.Pending {
		return acceptedBody{v: resp, retryAfter: resp.RetryAfter}, nil
	}
	return resp, nil
}

// certNames are the CN and SANs of the verified client certificate, if any.
func certNames(r *http.Request) []string {
	if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 || len(r.TLS.VerifiedChains[0]) == 0 {
		return nil
	}
	c := r.TLS.VerifiedChains[0][0]
	names := append([]string{c.Subject.CommonName}, c.DNSNames...)
	for _, u := range c.URIs {
		names = append(names, u.String())
	}
	return names
}

func rateLimited(wait time.Duration) *apiError {
	secs := max(1, int((wait+time.Second-1)/time.Second))
	return &apiError{status: http.StatusTooManyRequests, code: "rate_limited", outcome: outRateLimited,
		msg: "too many registrations; retry after " + strconv.Itoa(secs) + " s", retryAfter: secs, spread: true}
}

// registerLimits are the configured registration limits.
func (c *Config) registerLimits() transport.RegisterLimits {
	exempt, _ := transport.ParsePrefixes(c.RegisterRateExempt) // checked by Validate
	return transport.RegisterLimits{Rate: c.RegisterRate, Burst: c.RegisterBurst, PerAddress: c.RegisterRatePerAddress,
		PerAddressBurst: c.RegisterBurstPerAddress, Exempt: exempt}
}

// The registration limiter as the api and New name it.
type regLimiter = transport.RegisterLimiter

var newRegLimiter = transport.NewRegisterLimiter
