package web

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/drover/drover/internal/access"
)

// Who may do what on the dashboard (docs/security.md): routes() gives
// every page the least role it needs; can checks it, with the session,
// and records each change in the audit log through Options.Audit.

type actorKey struct{}

// actorOf is the logged-in actor of a request that passed can.
func actorOf(r *http.Request) access.Actor {
	a, _ := r.Context().Value(actorKey{}).(access.Actor)
	return a
}

// change is what a handler of a change tells the audit log beyond the
// object of its route: the path of an object it created, or what it did
// when it has no object.
type change struct {
	created string
	after   any
}

type changeKey struct{}

// changed notes a handler's change for the audit log.
func changed(r *http.Request, created string, after any) {
	if c, ok := r.Context().Value(changeKey{}).(*change); ok {
		c.created, c.after = created, after
	}
}

// can requires a session whose user has at least role; POSTs also need the
// session's CSRF token, and are recorded in the audit log with the state of
// object (an API path, its wildcards filled from the request) before and
// after.
func (h *Handler) can(role access.Role, object string, fn func(http.ResponseWriter, *http.Request, *session)) http.HandlerFunc {
	return h.auth(func(w http.ResponseWriter, r *http.Request, s *session) {
		who, err := h.acc.Session(r.Context(), s.user, s.cred)
		if err != nil {
			if c, cerr := r.Cookie(sessionCookie); cerr == nil && errors.Is(err, access.ErrUnauthorized) {
				h.endSession(r.Context(), c.Value) // the user was deleted
			}
			http.Error(w, "not logged in", http.StatusUnauthorized)
			return
		}
		if who.Role < role {
			h.render(w, r, http.StatusForbidden, "error", s, page{Title: "Not allowed",
				Data: fmt.Sprintf("Your role (%s) may not do this; it needs %s.", who.Role, role)})
			return
		}
		r = r.WithContext(context.WithValue(r.Context(), actorKey{}, who))
		if r.Method != http.MethodPost || h.opts.Audit == nil || role == access.Viewer {
			fn(w, r, s)
			return
		}
		c := &change{}
		r = r.WithContext(context.WithValue(r.Context(), changeKey{}, c))
		done := h.opts.Audit(r, who, r.Pattern, access.ObjectPath(object, r.PathValue))
		fn(w, r, s)
		done(c.created, c.after)
	})
}

// Users, their tokens and the audit log: admins only.

type usersData struct {
	Users  []access.User
	Tokens []access.Token
	Roles  []access.Role
	Now    time.Time
}

func (h *Handler) users(w http.ResponseWriter, r *http.Request, s *session) {
	us, err := h.acc.Users(r.Context())
	if err != nil {
		h.serverError(w, r, s, err)
		return
	}
	ts, err := h.acc.Tokens(r.Context(), "")
	if err != nil {
		h.serverError(w, r, s, err)
		return
	}
	h.render(w, r, http.StatusOK, "users", s, page{Title: "Users", Nav: "users",
		Data: usersData{Users: us, Tokens: ts, Roles: []access.Role{access.Viewer, access.Operator, access.Admin}, Now: h.now()}})
}

// userResult flashes the outcome of a user or token change and goes back
// to the users page.
func (h *Handler) userResult(w http.ResponseWriter, r *http.Request, s *session, err error, ok string) {
	switch {
	case errors.Is(err, access.ErrInvalid), errors.Is(err, access.ErrExists), errors.Is(err, access.ErrNotFound):
		h.flash(s, "Not done: "+err.Error())
	case err != nil:
		h.serverError(w, r, s, err)
		return
	default:
		h.flash(s, ok)
	}
	http.Redirect(w, r, Prefix+"users", http.StatusSeeOther)
}

func (h *Handler) addUser(w http.ResponseWriter, r *http.Request, s *session) {
	role, err := access.ParseRole(r.PostFormValue("role"))
	if err == nil {
		var u access.User
		u, err = h.acc.AddUser(r.Context(), strings.TrimSpace(r.PostFormValue("name")), role, r.PostFormValue("password"))
		if err == nil {
			changed(r, "/api/v1/users/"+u.Name, u)
		}
	}
	h.userResult(w, r, s, err, "User "+r.PostFormValue("name")+" added.")
}

func (h *Handler) updateUser(w http.ResponseWriter, r *http.Request, s *session) {
	var c access.UserChange
	if v := r.PostFormValue("role"); v != "" {
		role, err := access.ParseRole(v)
		if err != nil {
			h.userResult(w, r, s, err, "")
			return
		}
		c.Role = &role
	}
	if v := r.PostFormValue("password"); v != "" {
		c.Password = &v
	}
	_, err := h.acc.UpdateUser(r.Context(), r.PathValue("name"), c)
	h.userResult(w, r, s, err, "User "+r.PathValue("name")+" changed.")
}

func (h *Handler) deleteUser(w http.ResponseWriter, r *http.Request, s *session) {
	name := r.PathValue("name")
	if who := actorOf(r); who.Name == name && who.Credential != "admin-token" {
		h.userResult(w, r, s, fmt.Errorf("%w: you cannot delete yourself", access.ErrInvalid), "")
		return
	}
	h.userResult(w, r, s, h.acc.DeleteUser(r.Context(), name), "User "+name+" deleted.")
}

func (h *Handler) createToken(w http.ResponseWriter, r *http.Request, s *session) {
	var expires time.Time
	if v := strings.TrimSpace(r.PostFormValue("days")); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 3650 {
			h.userResult(w, r, s, fmt.Errorf("%w: the expiry must be 1 to 3650 days, or empty for none", access.ErrInvalid), "")
			return
		}
		expires = h.now().Add(time.Duration(n) * 24 * time.Hour)
	}
	t, secret, err := h.acc.CreateToken(r.Context(), r.PathValue("name"), strings.TrimSpace(r.PostFormValue("token_name")), expires)
	if err == nil {
		changed(r, "/api/v1/tokens/"+t.ID, t)
	}
	h.userResult(w, r, s, err, fmt.Sprintf("Token %q for %s: %s — copy it now, it is not shown again.", t.Name, t.User, secret))
}

func (h *Handler) revokeToken(w http.ResponseWriter, r *http.Request, s *session) {
	t, err := h.acc.RevokeToken(r.Context(), r.PathValue("id"))
	h.userResult(w, r, s, err, fmt.Sprintf("Token %q of %s revoked.", t.Name, t.User))
}

type auditData struct {
	Entries []access.Entry
	Filter  access.AuditFilter
	Next    string
	Query   string
}

func (h *Handler) auditLog(w http.ResponseWriter, r *http.Request, s *session) {
	q := r.URL.Query()
	f := access.AuditFilter{Actor: q.Get("actor"), Object: q.Get("object"), Action: q.Get("action"), Limit: 50}
	if n, err := strconv.ParseUint(q.Get("cursor"), 10, 64); err == nil {
		f.Before = n
	}
	es, err := h.acc.Audit(r.Context(), f)
	if err != nil {
		h.serverError(w, r, s, err)
		return
	}
	d := auditData{Entries: es, Filter: f}
	if len(es) == f.Limit {
		q.Set("cursor", strconv.FormatUint(es[len(es)-1].ID, 10))
		d.Next = q.Encode()
	}
	h.render(w, r, http.StatusOK, "audit", s, page{Title: "Audit log", Nav: "audit", Data: d})
}
