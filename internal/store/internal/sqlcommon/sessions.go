package sqlcommon

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"github.com/drover/drover/internal/sessions"
)

// Sessions implements sessions.Store, the dashboard's logins, on the
// sessions table.
type Sessions struct{ *Base }

var _ sessions.Store = (*Sessions)(nil)

// SaveSession implements sessions.Store.
func (a *Sessions) SaveSession(ctx context.Context, s sessions.Session) error {
	_, err := a.exec(ctx, a.D.q(`INSERT INTO sessions (id_hash, csrf, expires, user_name, credential) VALUES (?, ?, ?, ?, ?)`+
		a.D.upsert("id_hash", "csrf", "expires", "user_name", "credential")),
		s.Hash, s.CSRF, s.Expires.UnixMilli(), s.User, s.Credential)
	return err
}

// LoadSession implements sessions.Store.
func (a *Sessions) LoadSession(ctx context.Context, hash []byte) (sessions.Session, error) {
	s := sessions.Session{Hash: hash}
	var csrf, user, cred []byte
	var expires int64
	err := a.R.QueryRowContext(ctx, a.D.q(`SELECT csrf, expires, user_name, credential FROM sessions WHERE id_hash = ?`), hash).Scan(&csrf, &expires, &user, &cred)
	if errors.Is(err, sql.ErrNoRows) {
		return sessions.Session{}, sessions.ErrNotFound
	}
	s.CSRF, s.Expires, s.User, s.Credential = string(csrf), time.UnixMilli(expires).UTC(), string(user), string(cred)
	return s, err
}

// DeleteSession implements sessions.Store.
func (a *Sessions) DeleteSession(ctx context.Context, hash []byte) error {
	_, err := a.exec(ctx, a.D.q(`DELETE FROM sessions WHERE id_hash = ?`), hash)
	return err
}

// PruneSessions implements sessions.Store.
func (a *Sessions) PruneSessions(ctx context.Context, now time.Time) (int64, error) {
	res, err := a.exec(ctx, a.D.q(`DELETE FROM sessions WHERE expires < ?`), now.UnixMilli())
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}
