package sqlcommon

import (
	"context"
	"database/sql"
	"errors"
	"strconv"
	"time"

	"github.com/drover/drover/internal/access"
)

// Users, API tokens and the audit log (access.Store) on the tables of each
// adapter's 090_access migration.

// Access implements access.Store.
type Access struct{ *Base }

var _ access.Store = (*Access)(nil)

// SaveUser implements access.Store.
func (a *Access) SaveUser(ctx context.Context, u access.User) error {
	_, err := a.exec(ctx, a.D.q(`INSERT INTO users (name, role, password_hash, created_at, updated_at) VALUES (?, ?, ?, ?, ?)`+
		a.D.upsert("name", "role", "password_hash", "created_at", "updated_at")),
		u.Name, u.Role.String(), u.PasswordHash, ms(u.CreatedAt), ms(u.UpdatedAt))
	return err
}

// DeleteUser implements access.Store.
func (a *Access) DeleteUser(ctx context.Context, name string) error {
	return a.tx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, a.D.q(`DELETE FROM users WHERE name = ?`), name)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil {
			return err
		} else if n == 0 {
			return access.ErrNotFound
		}
		_, err = tx.ExecContext(ctx, a.D.q(`DELETE FROM api_tokens WHERE user_name = ?`), name)
		return err
	})
}

const userCols = `name, role, password_hash, created_at, updated_at`

func scanUser(sc interface{ Scan(...any) error }) (access.User, error) {
	var name, role, hash []byte
	var created, updated int64
	if err := sc.Scan(&name, &role, &hash, &created, &updated); err != nil {
		return access.User{}, err
	}
	r, err := access.ParseRole(string(role))
	return access.User{Name: string(name), Role: r, PasswordHash: string(hash), CreatedAt: fromMS(created), UpdatedAt: fromMS(updated)}, err
}

// User implements access.Store.
func (a *Access) User(ctx context.Context, name string) (access.User, error) {
	u, err := scanUser(a.R.QueryRowContext(ctx, a.D.q(`SELECT `+userCols+` FROM users WHERE name = ?`), name))
	if errors.Is(err, sql.ErrNoRows) {
		return access.User{}, access.ErrNotFound
	}
	return u, err
}

// Users implements access.Store.
func (a *Access) Users(ctx context.Context) ([]access.User, error) {
	rows, err := a.R.QueryContext(ctx, `SELECT `+userCols+` FROM users ORDER BY name`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var us []access.User
	for rows.Next() {
		u, err := scanUser(rows)
		if err != nil {
			return nil, err
		}
		us = append(us, u)
	}
	return us, rows.Err()
}

const tokenCols = `id, user_name, name, hash, created_at, expires_at, last_used, revoked_at`

// SaveToken implements access.Store.
func (a *Access) SaveToken(ctx context.Context, t access.Token) error {
	_, err := a.exec(ctx, a.D.q(`INSERT INTO api_tokens (`+tokenCols+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?)`+
		a.D.upsert("id", "user_name", "name", "hash", "created_at", "expires_at", "last_used", "revoked_at")),
		t.ID, t.User, t.Name, t.Hash, ms(t.CreatedAt), ms(t.ExpiresAt), ms(t.LastUsed), ms(t.RevokedAt))
	return err
}

func scanToken(sc interface{ Scan(...any) error }) (access.Token, error) {
	var id, user, name, hash []byte
	var created, expires, used, revoked int64
	if err := sc.Scan(&id, &user, &name, &hash, &created, &expires, &used, &revoked); err != nil {
		return access.Token{}, err
	}
	return access.Token{ID: string(id), User: string(user), Name: string(name), Hash: hash,
		CreatedAt: fromMS(created), ExpiresAt: fromMS(expires), LastUsed: fromMS(used), RevokedAt: fromMS(revoked)}, nil
}

// Tokens implements access.Store.
func (a *Access) Tokens(ctx context.Context) ([]access.Token, error) {
	rows, err := a.R.QueryContext(ctx, `SELECT `+tokenCols+` FROM api_tokens ORDER BY created_at, id`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var ts []access.Token
	for rows.Next() {
		t, err := scanToken(rows)
		if err != nil {
			return nil, err
		}
		ts = append(ts, t)
	}
	return ts, rows.Err()
}

// TokenByHash implements access.Store.
func (a *Access) TokenByHash(ctx context.Context, hash []byte) (access.Token, error) {
	t, err := scanToken(a.R.QueryRowContext(ctx, a.D.q(`SELECT `+tokenCols+` FROM api_tokens WHERE hash = ?`), hash))
	if errors.Is(err, sql.ErrNoRows) {
		return access.Token{}, access.ErrNotFound
	}
	return t, err
}

// TouchToken implements access.Store.
func (a *Access) TouchToken(ctx context.Context, id string, at time.Time) error {
	_, err := a.exec(ctx, a.D.q(`UPDATE api_tokens SET last_used = ? WHERE id = ?`), ms(at), id)
	return err
}

// AddAudit implements access.Store.
func (a *Access) AddAudit(ctx context.Context, e access.Entry) error {
	_, err := a.exec(ctx, a.D.q(`INSERT INTO audit_log (at, actor, credential, remote, action, object, before_json, after_json) VALUES (?, ?, ?, ?, ?, ?, ?, ?)`),
		ms(e.At), e.Actor, e.Credential, e.Remote, e.Action, e.Object, string(e.Before), string(e.After))
	return err
}

// Audit implements access.Store; its conditions are access.AuditFilter.Matches.
func (a *Access) Audit(ctx context.Context, f access.AuditFilter) ([]access.Entry, error) {
	q := `SELECT id, at, actor, credential, remote, action, object, before_json, after_json FROM audit_log WHERE 1 = 1`
	var args []any
	if f.Actor != "" {
		q += ` AND actor = ?`
		args = append(args, f.Actor)
	}
	if f.Action != "" {
		q += ` AND action = ?`
		args = append(args, f.Action)
	}
	if f.Object != "" {
		if f.Object[len(f.Object)-1] == '/' {
			q += ` AND substr(object, 1, ` + strconv.Itoa(len(f.Object)) + `) = ?`
		} else {
			q += ` AND object = ?`
		}
		args = append(args, f.Object)
	}
	if !f.Since.IsZero() {
		q += ` AND at >= ?`
		args = append(args, f.Since.UnixMilli())
	}
	if !f.Until.IsZero() {
		q += ` AND at < ?`
		args = append(args, f.Until.UnixMilli())
	}
	if f.Before != 0 {
		q += ` AND id < ?`
		args = append(args, int64(f.Before))
	}
	q += ` ORDER BY id DESC LIMIT ` + strconv.Itoa(max(f.Limit, 1))
	rows, err := a.R.QueryContext(ctx, a.D.q(q), args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []access.Entry
	for rows.Next() {
		var e access.Entry
		var id, at int64
		var actor, cred, remote, action, object, before, after []byte
		if err := rows.Scan(&id, &at, &actor, &cred, &remote, &action, &object, &before, &after); err != nil {
			return nil, err
		}
		e.ID, e.At = uint64(id), time.UnixMilli(at).UTC()
		e.Actor, e.Credential, e.Remote, e.Action, e.Object = string(actor), string(cred), string(remote), string(action), string(object)
		if len(before) > 0 {
			e.Before = before
		}
		if len(after) > 0 {
			e.After = after
		}
		out = append(out, e)
	}
	return out, rows.Err()
}

// PruneAudit implements access.Store.
func (a *Access) PruneAudit(ctx context.Context, before time.Time) (int64, error) {
	res, err := a.exec(ctx, a.D.q(`DELETE FROM audit_log WHERE at < ?`), before.UnixMilli())
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}
