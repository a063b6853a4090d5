package server

// Users, API tokens and the audit log (docs/security.md): admin only, by
// the routes table; OpenAccess serves `drover user` without a server.

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"time"

	"github.com/drover/drover/internal/access"
	"github.com/drover/drover/internal/store"
)

func (a *api) whoami(r *http.Request) (any, error) {
	who, _ := actorOf(r)
	return who, nil
}

func (a *api) listUsers(r *http.Request) (any, error) {
	us, err := a.acc.Users(r.Context())
	if us == nil {
		us = []access.User{}
	}
	return userList{us}, err
}

func (a *api) getUser(r *http.Request) (any, error) {
	u, err := a.acc.User(r.Context(), r.PathValue("name"))
	return u, ifNotFound(err, "user "+strconv.Quote(r.PathValue("name")))
}

func (a *api) createUser(r *http.Request) (any, error) {
	var in userBody
	if err := decodeStrict(r, "user: ", &in); err != nil {
		return nil, err
	}
	dry, err := dryRun(r)
	if err != nil {
		return nil, err
	}
	if dry {
		if err := a.acc.CheckNewUser(r.Context(), in.Name, in.Role); err != nil {
			return nil, err
		}
		return unchangedBody{access.User{Name: in.Name, Role: in.Role}}, nil
	}
	u, err := a.acc.AddUser(r.Context(), in.Name, in.Role, in.Password)
	if err != nil {
		return nil, err
	}
	return created(u), nil
}

func (a *api) updateUser(r *http.Request) (any, error) {
	var c access.UserChange
	if err := decodeStrict(r, "user change: ", &c); err != nil {
		return nil, err
	}
	dry, err := dryRun(r)
	if err != nil {
		return nil, err
	}
	if dry {
		u, err := a.acc.CheckUserChange(r.Context(), r.PathValue("name"), c)
		if err != nil {
			return nil, ifNotFound(err, "user "+strconv.Quote(r.PathValue("name")))
		}
		return unchangedBody{u}, nil
	}
	u, err := a.acc.UpdateUser(r.Context(), r.PathValue("name"), c)
	return u, ifNotFound(err, "user "+strconv.Quote(r.PathValue("name")))
}

func (a *api) deleteUser(r *http.Request) (any, error) {
	name := r.PathValue("name")
	if err := a.acc.DeleteUser(r.Context(), name); err != nil {
		return nil, ifNotFound(err, "user "+strconv.Quote(name))
	}
	return deleted{name}, nil
}

func (a *api) listTokens(r *http.Request) (any, error) {
	ts, err := a.acc.Tokens(r.Context(), r.URL.Query().Get("user"))
	if ts == nil {
		ts = []access.Token{}
	}
	return tokenList{ts}, err
}

func (a *api) getToken(r *http.Request) (any, error) {
	t, err := a.acc.Token(r.Context(), r.PathValue("id"))
	return t, ifNotFound(err, "token "+strconv.Quote(r.PathValue("id")))
}

// newToken is a token as created: with its secret, shown this once.
type newToken struct {
	access.Token
	Secret string `json:"token"`
}

func (t newToken) auditView() any { return t.Token }

func (a *api) createToken(r *http.Request) (any, error) {
	var in tokenBody
	if err := decodeStrict(r, "token: ", &in); err != nil {
		return nil, err
	}
	if in.ExpiresIn != "" {
		d, err := time.ParseDuration(in.ExpiresIn)
		if err != nil || d <= 0 || !in.ExpiresAt.IsZero() {
			return nil, badField("expires_in must be a positive duration such as 720h, and not given with expires_at")
		}
		in.ExpiresAt = time.Now().Add(d)
	}
	if in.User == "" {
		return nil, badField("user names the token's owner")
	}
	t, secret, err := a.acc.CreateToken(r.Context(), in.User, in.Name, in.ExpiresAt)
	if err != nil {
		return nil, ifNotFound(err, "user "+strconv.Quote(in.User))
	}
	return created(newToken{Token: t, Secret: secret}), nil
}

func (a *api) revokeToken(r *http.Request) (any, error) {
	t, err := a.acc.RevokeToken(r.Context(), r.PathValue("id"))
	return t, ifNotFound(err, "token "+strconv.Quote(r.PathValue("id")))
}

// listAudit answers GET /api/v1/audit: newest first, filtered by actor,
// action, object (a prefix when it ends in /), since and until
// (RFC 3339), paged by limit and cursor (the next_cursor of the page
// before).
func (a *api) listAudit(r *http.Request) (any, error) {
	q := r.URL.Query()
	f := access.AuditFilter{Actor: q.Get("actor"), Action: q.Get("action"), Object: q.Get("object"), Limit: 100}
	for name, t := range map[string]*time.Time{"since": &f.Since, "until": &f.Until} {
		if v := q.Get(name); v != "" {
			var err error
			if *t, err = time.Parse(time.RFC3339, v); err != nil {
				return nil, badField(name + " must be an RFC 3339 time such as 2026-01-02T15:04:05Z")
			}
		}
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 1000 {
			return nil, badField("limit must be 1 to 1000")
		}
		f.Limit = n
	}
	if v := q.Get("cursor"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil || n == 0 {
			return nil, badField("cursor must be a next_cursor value")
		}
		f.Before = n
	}
	es, err := a.acc.Audit(r.Context(), f)
	if err != nil {
		return nil, err
	}
	out := auditPage{Entries: es}
	if es == nil {
		out.Entries = []access.Entry{}
	}
	if len(es) == f.Limit {
		out.NextCursor = strconv.FormatUint(es[len(es)-1].ID, 10)
	}
	return out, nil
}

// OpenAccess opens the store of cfg for `drover user`: its users, tokens
// and audit log, without a server. It takes the store's instance lock, so
// it fails while a server runs on the store (then use the API with the
// admin token, docs/security.md). close closes the store.
func OpenAccess(ctx context.Context, cfg Config) (svc *access.Service, close func() error, err error) {
	if cfg.Persistence == "memory" {
		return nil, nil, errors.New("a memory-mode server keeps no users; create them through the API with the admin token")
	}
	if cfg.DB == "" {
		if err := os.MkdirAll(cfg.DataDir, 0o750); err != nil {
			return nil, nil, err
		}
	}
	st, err := openStore(ctx, cfg.dbDSN())
	if err != nil {
		var held *store.HeldError
		if errors.As(err, &held) {
			return nil, nil, fmt.Errorf("%w\nthe server is running: manage users through the API or the dashboard with the admin token (docs/security.md)", err)
		}
		return nil, nil, err
	}
	return access.New(access.Options{Store: st}), st.Close, nil
}
