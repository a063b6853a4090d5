package web

import (
	"context"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"html"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	"golang.org/x/oauth2"

	"github.com/drover/drover/internal/access"
)

// OIDC configures single sign-on through an OpenID Connect provider
// (docs/security.md#single-sign-on): the authorization code flow with
// PKCE, the ID token checked (signature, issuer, audience, expiry, nonce).
type OIDC struct {
	Issuer       string // the provider's issuer URL (discovery at Issuer/.well-known/openid-configuration)
	ClientID     string
	ClientSecret string
	RedirectURL  string // this dashboard's callback: https://HOST/ui/oidc/callback
	// UserClaim names the user (default "preferred_username"; then
	// "email", then "sub" when it is missing).
	UserClaim string
	// RoleClaim holds the user's groups or roles, a string or a list
	// (default "groups"); Roles maps its values to Drover roles, the
	// highest one wins; a user with none may not log in.
	RoleClaim string
	Roles     map[string]access.Role
	// HTTPClient talks to the provider (default http.DefaultClient).
	HTTPClient *http.Client
}

// oidcLogin is the provider, discovered at the first login.
type oidcLogin struct {
	cfg      OIDC
	mu       sync.Mutex
	verifier *oidc.IDTokenVerifier
	oauth    *oauth2.Config
}

func (o *oidcLogin) ctx(ctx context.Context) context.Context {
	if o.cfg.HTTPClient != nil {
		return oidc.ClientContext(ctx, o.cfg.HTTPClient)
	}
	return ctx
}

// setup discovers the provider once (a failed discovery is tried again at
// the next login).
func (o *oidcLogin) setup(ctx context.Context) (*oauth2.Config, *oidc.IDTokenVerifier, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.oauth != nil {
		return o.oauth, o.verifier, nil
	}
	ctx, cancel := context.WithTimeout(o.ctx(ctx), 10*time.Second)
	defer cancel()
	p, err := oidc.NewProvider(ctx, o.cfg.Issuer)
	if err != nil {
		return nil, nil, err
	}
	o.verifier = p.Verifier(&oidc.Config{ClientID: o.cfg.ClientID})
	o.oauth = &oauth2.Config{ClientID: o.cfg.ClientID, ClientSecret: o.cfg.ClientSecret, RedirectURL: o.cfg.RedirectURL,
		Endpoint: p.Endpoint(), Scopes: []string{oidc.ScopeOpenID, "profile", "email"}}
	return o.oauth, o.verifier, nil
}

const oidcCookie = "drover_oidc"

// oidcStart sends the browser to the provider.
func (h *Handler) oidcStart(w http.ResponseWriter, r *http.Request) {
	oc, _, err := h.oidc.setup(r.Context())
	if err != nil {
		h.log.Error("single sign-on: provider discovery failed", "issuer", h.oidc.cfg.Issuer, "err", err)
		h.showLogin(w, r, http.StatusServiceUnavailable, "Single sign-on is unavailable (the provider did not answer); try again later.")
		return
	}
	state, nonce, verifier := randomToken(), randomToken(), oauth2.GenerateVerifier()
	next := base64.RawURLEncoding.EncodeToString([]byte(safeNext(r.URL.Query().Get("next"))))
	// SameSite=Lax: the provider's redirect back is a cross-site navigation.
	http.SetCookie(w, &http.Cookie{Name: oidcCookie, Value: state + "." + nonce + "." + verifier + "." + next, Path: Prefix + "oidc/",
		MaxAge: 600, HttpOnly: true, Secure: r.TLS != nil, SameSite: http.SameSiteLaxMode})
	http.Redirect(w, r, oc.AuthCodeURL(state, oidc.Nonce(nonce), oauth2.S256ChallengeOption(verifier)), http.StatusFound)
}

// oidcCallback takes the provider's answer, logs the user in and goes on
// to the dashboard.
func (h *Handler) oidcCallback(w http.ResponseWriter, r *http.Request) {
	fail := func(status int, msg string, args ...any) {
		h.log.Warn("single sign-on failed", append([]any{"addr", clientAddr(r), "reason", msg}, args...)...)
		http.SetCookie(w, &http.Cookie{Name: oidcCookie, Path: Prefix + "oidc/", MaxAge: -1, HttpOnly: true, Secure: r.TLS != nil})
		h.showLogin(w, r, status, "Single sign-on failed: "+msg+".")
	}
	c, err := r.Cookie(oidcCookie)
	parts := strings.Split(func() string {
		if err != nil {
			return ""
		}
		return c.Value
	}(), ".")
	q := r.URL.Query()
	if len(parts) != 4 || subtle.ConstantTimeCompare([]byte(parts[0]), []byte(q.Get("state"))) != 1 {
		fail(http.StatusForbidden, "the login expired or did not start here")
		return
	}
	if e := q.Get("error"); e != "" {
		fail(http.StatusUnauthorized, "the provider refused", "error", e, "description", q.Get("error_description"))
		return
	}
	oc, verifier, err := h.oidc.setup(r.Context())
	if err != nil {
		fail(http.StatusServiceUnavailable, "the provider did not answer", "err", err)
		return
	}
	ctx, cancel := context.WithTimeout(h.oidc.ctx(r.Context()), 15*time.Second)
	defer cancel()
	tok, err := oc.Exchange(ctx, q.Get("code"), oauth2.VerifierOption(parts[2]))
	if err != nil {
		fail(http.StatusUnauthorized, "the code was not accepted", "err", err)
		return
	}
	raw, _ := tok.Extra("id_token").(string)
	idt, err := verifier.Verify(ctx, raw)
	if err != nil {
		fail(http.StatusUnauthorized, "the ID token is not valid", "err", err)
		return
	}
	if subtle.ConstantTimeCompare([]byte(idt.Nonce), []byte(parts[1])) != 1 {
		fail(http.StatusUnauthorized, "the ID token is not for this login")
		return
	}
	var claims map[string]any
	if err := idt.Claims(&claims); err != nil {
		fail(http.StatusUnauthorized, "the ID token's claims are unreadable", "err", err)
		return
	}
	name, role := h.oidc.identity(claims, idt.Subject)
	if role == access.None {
		fail(http.StatusForbidden, fmt.Sprintf("%s has no Drover role (claim %q)", name, h.oidc.roleClaim()))
		return
	}
	who, err := h.acc.ExternalLogin(r.Context(), name, role, "oidc")
	if errors.Is(err, access.ErrExists) || errors.Is(err, access.ErrInvalid) {
		fail(http.StatusForbidden, err.Error())
		return
	} else if err != nil {
		fail(http.StatusServiceUnavailable, "the user could not be stored", "err", err)
		return
	}
	http.SetCookie(w, &http.Cookie{Name: oidcCookie, Path: Prefix + "oidc/", MaxAge: -1, HttpOnly: true, Secure: r.TLS != nil})
	if !h.startSession(w, r, who) {
		return
	}
	nb, _ := base64.RawURLEncoding.DecodeString(parts[3])
	next := html.EscapeString(safeNext(string(nb)))
	// A page, not a redirect: the session cookie is SameSite=Strict, and a
	// redirect chain that began at the provider would not carry it.
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	fmt.Fprintf(w, `<!doctype html><meta charset="utf-8"><meta http-equiv="refresh" content="0;url=%s"><title>Drover</title><p>Logged in. <a href="%s">Continue</a></p>`, next, next)
}

func (o *oidcLogin) roleClaim() string {
	if o.cfg.RoleClaim == "" {
		return "groups"
	}
	return o.cfg.RoleClaim
}

// identity is the user name and the highest role the claims map to.
func (o *oidcLogin) identity(claims map[string]any, sub string) (string, access.Role) {
	name := ""
	for _, k := range []string{o.cfg.UserClaim, "preferred_username", "email"} {
		if v, ok := claims[k].(string); ok && k != "" && v != "" {
			name = v
			break
		}
	}
	if name == "" {
		name = sub
	}
	var values []string
	switch v := claims[o.roleClaim()].(type) {
	case string:
		values = []string{v}
	case []any:
		for _, x := range v {
			if s, ok := x.(string); ok {
				values = append(values, s)
			}
		}
	}
	role := access.None
	for _, v := range values {
		if r := o.cfg.Roles[v]; r > role {
			role = r
		}
	}
	return name, role
}
