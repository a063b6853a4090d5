package sqlcommon

import (
	"context"
	"database/sql"
	"errors"
)

// Settings implements alert.Store's settings: named values kept for the
// server (the settings table).
type Settings struct{ *Base }

// Setting implements alert.Store.
func (a *Settings) Setting(ctx context.Context, key string) (string, error) {
	var v []byte
	err := a.R.QueryRowContext(ctx, a.D.q(`SELECT value FROM settings WHERE name = ?`), key).Scan(&v)
	if errors.Is(err, sql.ErrNoRows) {
		return "", nil
	}
	return string(v), err
}

// PutSetting implements alert.Store.
func (a *Settings) PutSetting(ctx context.Context, key, value string) error {
	_, err := a.exec(ctx, a.D.q(`INSERT INTO settings (name, value) VALUES (?, ?)`+a.D.upsert("name", "value")), key, value)
	return err
}
