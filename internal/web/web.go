// Package web is the operator's dashboard: server-rendered pages under /ui/
// with a little JavaScript, every asset embedded, no external requests.
package web

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"embed"
	"encoding/base64"
	"errors"
	"html/template"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/drover/drover/internal/access"
	"github.com/drover/drover/internal/alert"
	"github.com/drover/drover/internal/fleet"
	"github.com/drover/drover/internal/httpclose"
	"github.com/drover/drover/internal/sessions"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// Options configure the dashboard.
type Options struct {
	Fleet  *fleet.Service
	Alerts *alert.Engine
	// Access checks logins and roles (users, the admin token); nil: one
	// in memory with AdminToken as the only credential (tests).
	Access     *access.Service
	AdminToken string
	// Audit records a change made on the dashboard: called before it with
	// the object's API path ("" for none), its result after it with the
	// path of an object the change created and what the handler reports.
	// nil: no audit log.
	Audit func(r *http.Request, who access.Actor, action, object string) func(created string, after any)
	// Ready returns why the service cannot work right now (store failing,
	// shutting down), or nil.
	Ready func() error
	// Overloaded returns why requests are being refused, or "".
	Overloaded func() string
	Logger     *slog.Logger
	Now        func() time.Time
	// SessionTTL is how long a login lasts (default 12 h).
	SessionTTL time.Duration
	// Sessions keeps logins across restarts (default: in memory only).
	Sessions sessions.Store
	// SharedSessions: other servers share Sessions (cluster mode) and may
	// end a session, so every request checks the store, not only the
	// first one this server sees.
	SharedSessions bool
	// Cluster, in cluster mode, lists the cluster's nodes for the
	// overview, and names this one; nil: not a cluster.
	Cluster func(ctx context.Context) (nodes []fleet.ClusterNode, self string, err error)
	// UploadFirmware and DeleteFirmware handle firmware files (the
	// server's); nil: the firmware page takes no uploads. TransferTimeout
	// bounds an upload (default: the server's request deadline).
	// OIDC enables single sign-on (oidc.go); nil: passwords only.
	OIDC *OIDC
	// Terminal serves a remote terminal's WebSocket for a logged-in
	// operator (the server's, docs/remote-access.md); nil: the device
	// page has no terminal.
	Terminal func(w http.ResponseWriter, r *http.Request, who access.Actor)
	// Download serves a file from a device (?path=) for a logged-in
	// operator (the server's); nil: the device page offers none.
	Download func(w http.ResponseWriter, r *http.Request, who access.Actor)
	// Upload writes a request's body to a file on a device (?path=) for
	// a logged-in operator (the server's); nil: the device page offers
	// none.
	Upload          func(w http.ResponseWriter, r *http.Request, who access.Actor)
	UploadFirmware  FirmwareUpload
	DeleteFirmware  func(ctx context.Context, id uint64) error
	TransferTimeout time.Duration
}

// Prefix is where the dashboard is mounted.
const Prefix = "/ui/"

// Handler serves the dashboard.
type Handler struct {
	opts  Options
	acc   *access.Service
	oidc  *oidcLogin // nil: no single sign-on
	fleet *fleet.Service
	eng   *alert.Engine
	log   *slog.Logger
	now   func() time.Time
	mux   *http.ServeMux
	pages map[string]*template.Template

	mu       sync.Mutex
	sessions map[string]*session // cache of opts.Sessions by cookie value
	failures map[string]*failure // login failures by client address

	cachedStatus Status
}

type session struct {
	csrf    string
	expires time.Time
	flash   string
	user    string // "" for the admin token (access.Service.Session)
	cred    string
}

type failure struct {
	count int
	until time.Time
}

// New builds the dashboard handler; mount it at Prefix.
func New(opts Options) (*Handler, error) {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.SessionTTL <= 0 {
		opts.SessionTTL = 12 * time.Hour
	}
	if opts.Ready == nil {
		opts.Ready = func() error { return nil }
	}
	if opts.Overloaded == nil {
		opts.Overloaded = func() string { return "" }
	}
	if opts.Sessions == nil {
		opts.Sessions = sessions.NewMem()
	}
	if opts.Access == nil {
		opts.Access = access.New(access.Options{AdminToken: opts.AdminToken})
	}
	h := &Handler{
		opts: opts, acc: opts.Access, fleet: opts.Fleet, eng: opts.Alerts, log: opts.Logger, now: opts.Now,
		sessions: map[string]*session{}, failures: map[string]*failure{},
	}
	if opts.OIDC != nil {
		h.oidc = &oidcLogin{cfg: *opts.OIDC}
	}
	if err := h.parseTemplates(); err != nil {
		return nil, err
	}
	h.routes()
	return h, nil
}

func (h *Handler) routes() {
	m := http.NewServeMux()
	m.Handle("GET "+Prefix+"static/", staticHandler(Prefix+"static/"))
	m.HandleFunc("GET "+Prefix+"login", h.loginPage)
	m.HandleFunc("POST "+Prefix+"login", h.login)
	if h.oidc != nil {
		m.HandleFunc("GET "+Prefix+"oidc/start", h.oidcStart)
		m.HandleFunc("GET "+Prefix+"oidc/callback", h.oidcCallback)
	}
	// Each page with the least role it needs and, for a change, the API
	// path of its object for the audit log (access.go).
	V, O, A := access.Viewer, access.Operator, access.Admin
	m.HandleFunc("POST "+Prefix+"logout", h.auth(h.logout))
	m.HandleFunc("GET "+Prefix+"{$}", h.can(V, "", h.overview))
	m.HandleFunc("GET "+Prefix+"status.json", h.can(V, "", h.statusJSON))
	m.HandleFunc("GET "+Prefix+"devices", h.can(V, "", h.devices))
	m.HandleFunc("POST "+Prefix+"devices/label", h.can(O, "/api/v1/labels", h.labelDevices))
	m.HandleFunc("GET "+Prefix+"devices/{id}", h.can(V, "", h.device))
	if h.opts.Terminal != nil {
		// The WebSocket of the device page's terminal: audited as a
		// session by the server, not as a change.
		m.HandleFunc("GET "+Prefix+"devices/{id}/terminal", h.can(access.RemoteAccess.Least(), "", func(w http.ResponseWriter, r *http.Request, _ *session) {
			h.opts.Terminal(w, r, actorOf(r))
		}))
	}
	if h.opts.Download != nil {
		m.HandleFunc("GET "+Prefix+"devices/{id}/files", h.can(access.RemoteAccess.Least(), "", func(w http.ResponseWriter, r *http.Request, _ *session) {
			h.opts.Download(w, r, actorOf(r))
		}))
	}
	if h.opts.Upload != nil {
		// The page's script sends the file as the body, with the
		// session's CSRF token in a header (not a form: the body
		// streams to the device).
		m.HandleFunc("PUT "+Prefix+"devices/{id}/files", h.can(access.RemoteAccess.Least(), "", func(w http.ResponseWriter, r *http.Request, s *session) {
			if !sameOrigin(r) || subtle.ConstantTimeCompare([]byte(r.Header.Get("X-CSRF-Token")), []byte(s.csrf)) != 1 {
				w.Header().Set("Connection", "close")
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusForbidden)
				w.Write([]byte(`{"error":{"code":"forbidden","message":"invalid or missing CSRF token: reload the page and try again"}}` + "\n"))
				return
			}
			h.opts.Upload(w, r, actorOf(r))
		}))
	}
	m.HandleFunc("POST "+Prefix+"devices/{id}/admission", h.can(O, "/api/v1/devices/{id}", h.admitDevice))
	m.HandleFunc("POST "+Prefix+"devices/{id}/quota", h.can(O, "/api/v1/devices/{id}/quota", h.deviceQuota))
	m.HandleFunc("GET "+Prefix+"profiles", h.can(V, "", h.profiles))
	m.HandleFunc("GET "+Prefix+"profiles/{id}", h.can(V, "", h.profile))
	m.HandleFunc("POST "+Prefix+"profiles/{id}", h.can(O, "/api/v1/profiles/{id}", h.saveProfile))
	m.HandleFunc("POST "+Prefix+"profiles/policy", h.can(O, "/api/v1/profiles/policy", h.saveProfilePolicy))
	m.HandleFunc("POST "+Prefix+"profiles/approve", h.can(O, "/api/v1/profiles/pending", h.approveFirmware))
	m.HandleFunc("POST "+Prefix+"profiles/cleanup", h.can(O, "/api/v1/profiles", h.cleanupProfiles))
	m.HandleFunc("POST "+Prefix+"profiles/{id}/rollback", h.can(O, "/api/v1/profiles/{id}", h.rollbackProfile))
	m.HandleFunc("GET "+Prefix+"firmware", h.can(V, "", h.firmware))
	m.HandleFunc("POST "+Prefix+"firmware", h.uploadFirmware) // its own session, role and CSRF checks: the body streams
	m.HandleFunc("POST "+Prefix+"firmware/{id}/delete", h.can(O, "/api/v1/firmware/{id}", h.deleteFirmware))
	m.HandleFunc("POST "+Prefix+"rollouts", h.can(O, "", h.createRollout))
	m.HandleFunc("GET "+Prefix+"rollouts/{id}", h.can(V, "", h.rollout))
	m.HandleFunc("POST "+Prefix+"rollouts/{id}/{action}", h.can(O, "/api/v1/rollouts/{id}", h.controlRollout))
	m.HandleFunc("GET "+Prefix+"labels", h.can(V, "", h.labels))
	m.HandleFunc("POST "+Prefix+"labels", h.can(O, "/api/v1/labels", h.createLabel))
	m.HandleFunc("POST "+Prefix+"labels/delete", h.can(O, "/api/v1/labels", h.deleteLabel))
	m.HandleFunc("POST "+Prefix+"labels/rollout", h.can(O, "", h.stageConfig))
	m.HandleFunc("GET "+Prefix+"commands", h.can(V, "", h.commands))
	m.HandleFunc("POST "+Prefix+"commands", h.can(O, "", h.sendCommand))
	m.HandleFunc("POST "+Prefix+"commands/{id}/{op}", h.can(O, "/api/v1/commands/{id}", h.changeCommand))
	m.HandleFunc("GET "+Prefix+"alerts", h.can(V, "", h.alerts))
	m.HandleFunc("GET "+Prefix+"alerts/rules", h.can(V, "", h.rules))
	m.HandleFunc("GET "+Prefix+"alerts/rules/new", h.can(V, "", h.ruleForm))
	m.HandleFunc("GET "+Prefix+"alerts/rules/{id}", h.can(V, "", h.ruleForm))
	m.HandleFunc("POST "+Prefix+"alerts/rules", h.can(O, "/api/v1/alerts/rules", h.saveRule))
	m.HandleFunc("POST "+Prefix+"alerts/rules/{id}", h.can(O, "/api/v1/alerts/rules/{id}", h.saveRule))
	m.HandleFunc("POST "+Prefix+"alerts/rules/{id}/delete", h.can(O, "/api/v1/alerts/rules/{id}", h.deleteRule))
	m.HandleFunc("GET "+Prefix+"alerts/deliveries", h.can(V, "", h.deliveries))
	m.HandleFunc("GET "+Prefix+"settings", h.can(A, "", h.settings))
	m.HandleFunc("POST "+Prefix+"settings", h.can(A, "/api/v1/alerts/smtp", h.saveSettings))
	m.HandleFunc("GET "+Prefix+"users", h.can(A, "", h.users))
	m.HandleFunc("POST "+Prefix+"users", h.can(A, "", h.addUser))
	m.HandleFunc("POST "+Prefix+"users/{name}", h.can(A, "/api/v1/users/{name}", h.updateUser))
	m.HandleFunc("POST "+Prefix+"users/{name}/delete", h.can(A, "/api/v1/users/{name}", h.deleteUser))
	m.HandleFunc("POST "+Prefix+"users/{name}/tokens", h.can(A, "", h.createToken))
	m.HandleFunc("POST "+Prefix+"tokens/{id}/revoke", h.can(A, "/api/v1/tokens/{id}", h.revokeToken))
	m.HandleFunc("GET "+Prefix+"audit", h.can(A, "", h.auditLog))
	m.HandleFunc(Prefix, h.can(V, "", func(w http.ResponseWriter, r *http.Request, s *session) {
		h.render(w, r, http.StatusNotFound, "error", s, page{Title: "Not found", Data: "No page at " + r.URL.Path})
	}))
	h.mux = m
}

// ServeHTTP sets the security headers and dispatches.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	hd := w.Header()
	hd.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "+
		"connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	hd.Set("X-Frame-Options", "DENY")
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("Referrer-Policy", "same-origin")
	hd.Set("Cross-Origin-Opener-Policy", "same-origin")
	hd.Set("Permissions-Policy", "camera=(), microphone=(), geolocation=()")
	if r.TLS != nil {
		hd.Set("Strict-Transport-Security", "max-age=31536000")
	}
	if !strings.HasPrefix(r.URL.Path, Prefix+"static/") {
		hd.Set("Cache-Control", "no-store")
	}
	h.mux.ServeHTTP(w, r)
}

const (
	sessionCookie = "drover_session"
	loginCookie   = "drover_login" // CSRF token of the login form
)

func randomToken() string {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	return base64.RawURLEncoding.EncodeToString(b[:])
}

func (h *Handler) setCookie(w http.ResponseWriter, r *http.Request, name, value string, maxAge int) {
	http.SetCookie(w, &http.Cookie{
		Name: name, Value: value, Path: Prefix, MaxAge: maxAge,
		HttpOnly: true, Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode,
	})
}

// session returns the request's live session, or nil.
func (h *Handler) session(r *http.Request) *session {
	c, err := r.Cookie(sessionCookie)
	if err != nil {
		return nil
	}
	h.mu.Lock()
	s := h.sessions[c.Value]
	h.mu.Unlock()
	if s != nil && h.opts.SharedSessions {
		if _, err := h.opts.Sessions.LoadSession(r.Context(), sessions.Hash(c.Value)); err != nil {
			if !errors.Is(err, sessions.ErrNotFound) {
				h.log.Error("dashboard session lookup failed", "err", err)
				return nil
			}
			h.mu.Lock()
			delete(h.sessions, c.Value) // ended on another server
			h.mu.Unlock()
			return nil
		}
	}
	if s == nil {
		// Not seen since this process started: a login from before a
		// restart is in the store.
		st, err := h.opts.Sessions.LoadSession(r.Context(), sessions.Hash(c.Value))
		if err != nil {
			if !errors.Is(err, sessions.ErrNotFound) {
				h.log.Error("dashboard session lookup failed", "err", err)
			}
			return nil
		}
		s = &session{csrf: st.CSRF, expires: st.Expires, user: st.User, cred: st.Credential}
		h.mu.Lock()
		if old := h.sessions[c.Value]; old != nil {
			s = old
		} else {
			h.evictLocked()
			h.sessions[c.Value] = s
		}
		h.mu.Unlock()
	}
	if h.now().After(s.expires) {
		h.endSession(r.Context(), c.Value)
		return nil
	}
	return s
}

// evictLocked makes room in the cache by ending the session that expires
// first (h.mu held).
func (h *Handler) evictLocked() {
	if len(h.sessions) < maxSessions {
		return
	}
	var oldest string
	for k, s := range h.sessions {
		if oldest == "" || s.expires.Before(h.sessions[oldest].expires) {
			oldest = k
		}
	}
	delete(h.sessions, oldest)
	go h.opts.Sessions.DeleteSession(context.Background(), sessions.Hash(oldest))
}

// endSession forgets a session here and in the store.
func (h *Handler) endSession(ctx context.Context, id string) {
	h.mu.Lock()
	delete(h.sessions, id)
	h.mu.Unlock()
	if err := h.opts.Sessions.DeleteSession(ctx, sessions.Hash(id)); err != nil {
		h.log.Error("dashboard session delete failed", "err", err)
	}
}

// sameOrigin rejects cross-site form posts (defence in depth besides the
// CSRF token and SameSite cookies).
func sameOrigin(r *http.Request) bool {
	if site := r.Header.Get("Sec-Fetch-Site"); site != "" && site != "same-origin" && site != "none" {
		return false
	}
	if o := r.Header.Get("Origin"); o != "" && o != "null" {
		u, err := url.Parse(o)
		if err != nil || u.Host != r.Host {
			return false
		}
	}
	return true
}

// auth requires a session; POSTs also need the session's CSRF token.
func (h *Handler) auth(fn func(http.ResponseWriter, *http.Request, *session)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && refuseDeclared(w, r, maxFormBytes) {
			return
		}
		s := h.session(r)
		if s == nil {
			if r.Method == http.MethodGet && !strings.HasSuffix(r.URL.Path, ".json") {
				http.Redirect(w, r, Prefix+"login?next="+url.QueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
				return
			}
			http.Error(w, "not logged in", http.StatusUnauthorized)
			return
		}
		if r.Method == http.MethodPost {
			r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
			if !sameOrigin(r) || subtle.ConstantTimeCompare([]byte(r.PostFormValue("csrf")), []byte(s.csrf)) != 1 {
				http.Error(w, "invalid or missing CSRF token: reload the page and try again", http.StatusForbidden)
				return
			}
		}
		fn(w, r, s)
	}
}

// Limits on the forms' bodies (firmware uploads: the server's own).
const (
	maxFormBytes  = 1 << 20
	maxLoginBytes = 64 << 10
)

// refuseDeclared answers 413 at once when r declares a body over limit
// bytes, without reading it, and closes an HTTP/1 connection afterwards:
// net/http would otherwise wait for the rest of a body a client declared
// and may never send.
func refuseDeclared(w http.ResponseWriter, r *http.Request, limit int64) bool {
	if r.ContentLength <= limit {
		return false
	}
	defer httpclose.After(w, r)()
	http.Error(w, "the form is larger than "+strconv.FormatInt(limit, 10)+" bytes", http.StatusRequestEntityTooLarge)
	return true
}

func clientAddr(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// safeNext keeps redirects after login on the dashboard.
func safeNext(next string) string {
	if !strings.HasPrefix(next, Prefix) || strings.HasPrefix(next, "//") || strings.ContainsAny(next, "\\\r\n") {
		return Prefix
	}
	return next
}

func (h *Handler) loginPage(w http.ResponseWriter, r *http.Request) {
	if h.session(r) != nil {
		http.Redirect(w, r, safeNext(r.URL.Query().Get("next")), http.StatusSeeOther)
		return
	}
	h.showLogin(w, r, http.StatusOK, "")
}

func (h *Handler) showLogin(w http.ResponseWriter, r *http.Request, status int, msg string) {
	tok := randomToken()
	h.setCookie(w, r, loginCookie, tok, 3600)
	h.render(w, r, status, "login", nil, page{Title: "Log in", Data: map[string]any{
		"CSRF": tok, "Next": safeNext(r.FormValue("next")), "Error": msg, "SSO": h.oidc != nil,
	}})
}

const (
	maxFailures  = 5
	failureBlock = 5 * time.Minute
	maxSessions  = 1000
)

func (h *Handler) login(w http.ResponseWriter, r *http.Request) {
	if refuseDeclared(w, r, maxLoginBytes) {
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxLoginBytes)
	c, err := r.Cookie(loginCookie)
	if !sameOrigin(r) || err != nil || subtle.ConstantTimeCompare([]byte(c.Value), []byte(r.PostFormValue("csrf"))) != 1 {
		h.showLogin(w, r, http.StatusForbidden, "The form expired; please try again.")
		return
	}
	addr := clientAddr(r)
	now := h.now()
	h.mu.Lock()
	f := h.failures[addr]
	blocked := f != nil && f.count >= maxFailures && now.Before(f.until)
	h.mu.Unlock()
	if blocked {
		h.showLogin(w, r, http.StatusTooManyRequests, "Too many failed attempts; wait a few minutes.")
		return
	}
	who, err := h.acc.Login(r.Context(), strings.TrimSpace(r.PostFormValue("username")), r.PostFormValue("password"))
	if err != nil && !errors.Is(err, access.ErrUnauthorized) {
		h.log.Error("dashboard login: user lookup failed", "err", err)
		h.showLogin(w, r, http.StatusServiceUnavailable, "The login could not be checked; try again later.")
		return
	}
	if err != nil {
		h.mu.Lock()
		f := h.failures[addr]
		if f == nil || now.After(f.until) {
			f = &failure{}
			h.failures[addr] = f
		}
		f.count++
		f.until = now.Add(failureBlock)
		if len(h.failures) > 10000 {
			for k, v := range h.failures {
				if now.After(v.until) {
					delete(h.failures, k)
				}
			}
		}
		h.mu.Unlock()
		h.log.Warn("dashboard login failed", "addr", addr)
		h.showLogin(w, r, http.StatusUnauthorized, "Wrong user name or password.")
		return
	}
	if !h.startSession(w, r, who) {
		return
	}
	h.mu.Lock()
	delete(h.failures, addr)
	h.mu.Unlock()
	http.Redirect(w, r, safeNext(r.PostFormValue("next")), http.StatusSeeOther)
}

// startSession logs who in: a new session, its cookie, the login cookie
// cleared. false: it could not be stored (the answer is written).
func (h *Handler) startSession(w http.ResponseWriter, r *http.Request, who access.Actor) bool {
	now := h.now()
	id := randomToken()
	s := &session{csrf: randomToken(), expires: now.Add(h.opts.SessionTTL), user: who.SessionName()}
	if s.user != "" {
		s.cred = who.Credential
	} else {
		s.cred = h.acc.AdminSessionTag() // ends when the admin token is replaced
	}
	if _, err := h.opts.Sessions.PruneSessions(r.Context(), now); err != nil {
		h.log.Error("dashboard session prune failed", "err", err)
	}
	if err := h.opts.Sessions.SaveSession(r.Context(), sessions.Session{Hash: sessions.Hash(id), CSRF: s.csrf, Expires: s.expires, User: s.user, Credential: s.cred}); err != nil {
		h.log.Error("dashboard session save failed", "err", err)
		h.showLogin(w, r, http.StatusServiceUnavailable, "The session could not be stored; try again later.")
		return false
	}
	h.mu.Lock()
	h.evictLocked()
	h.sessions[id] = s
	h.mu.Unlock()
	h.setCookie(w, r, loginCookie, "", -1)
	h.setCookie(w, r, sessionCookie, id, int(h.opts.SessionTTL/time.Second))
	h.log.Info("dashboard login", "addr", clientAddr(r), "user", who.Name, "role", who.Role, "credential", who.Credential)
	return true
}

func (h *Handler) logout(w http.ResponseWriter, r *http.Request, s *session) {
	if c, err := r.Cookie(sessionCookie); err == nil {
		h.endSession(r.Context(), c.Value)
	}
	h.setCookie(w, r, sessionCookie, "", -1)
	http.Redirect(w, r, Prefix+"login", http.StatusSeeOther)
}

// flash keeps a message for the next page of the session.
func (h *Handler) flash(s *session, msg string) {
	h.mu.Lock()
	s.flash = msg
	h.mu.Unlock()
}

func (h *Handler) takeFlash(s *session) string {
	if s == nil {
		return ""
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	m := s.flash
	s.flash = ""
	return m
}
