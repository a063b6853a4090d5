-- Users, their API tokens, the audit log (internal/access,
-- internal/store/internal/sqlcommon/access.go, docs/security.md); the user
-- of each dashboard session. Times are unix ms, 0 for none.
CREATE TABLE users (
	name          TEXT    PRIMARY KEY,
	role          TEXT    NOT NULL,
	password_hash TEXT    NOT NULL, -- bcrypt; '' for none
	created_at    INTEGER NOT NULL,
	updated_at    INTEGER NOT NULL
) WITHOUT ROWID;
-- +step
CREATE TABLE api_tokens (
	id         TEXT    PRIMARY KEY,
	user_name  TEXT    NOT NULL,
	name       TEXT    NOT NULL,
	hash       BLOB    NOT NULL UNIQUE, -- SHA-256 of the secret
	created_at INTEGER NOT NULL,
	expires_at INTEGER NOT NULL,
	last_used  INTEGER NOT NULL,
	revoked_at INTEGER NOT NULL
) WITHOUT ROWID;
-- +step
CREATE TABLE audit_log (
	id          INTEGER PRIMARY KEY,
	at          INTEGER NOT NULL,
	actor       TEXT    NOT NULL,
	credential  TEXT    NOT NULL,
	remote      TEXT    NOT NULL,
	action      TEXT    NOT NULL,
	object      TEXT    NOT NULL,
	before_json TEXT    NOT NULL, -- '' for none
	after_json  TEXT    NOT NULL
);
-- +step
CREATE INDEX audit_log_at ON audit_log (at);
-- +step
ALTER TABLE sessions ADD COLUMN user_name TEXT NOT NULL DEFAULT '';
-- +step
ALTER TABLE sessions ADD COLUMN credential TEXT NOT NULL DEFAULT '';
