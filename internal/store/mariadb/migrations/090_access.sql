-- Users, their API tokens, the audit log (internal/access,
-- internal/store/internal/sqlcommon/access.go, docs/security.md); the user
-- of each dashboard session. Times are unix ms, 0 for none. Every step may
-- run again (MariaDB commits DDL implicitly).
CREATE TABLE IF NOT EXISTS users (
	name          VARBINARY(255) NOT NULL PRIMARY KEY,
	role          VARBINARY(16)  NOT NULL,
	password_hash VARBINARY(100) NOT NULL, -- bcrypt; '' for none
	created_at    BIGINT         NOT NULL,
	updated_at    BIGINT         NOT NULL
) ENGINE=InnoDB;
-- +step
CREATE TABLE IF NOT EXISTS api_tokens (
	id         VARBINARY(32)  NOT NULL PRIMARY KEY,
	user_name  VARBINARY(255) NOT NULL,
	name       VARBINARY(255) NOT NULL,
	hash       VARBINARY(32)  NOT NULL, -- SHA-256 of the secret
	created_at BIGINT         NOT NULL,
	expires_at BIGINT         NOT NULL,
	last_used  BIGINT         NOT NULL,
	revoked_at BIGINT         NOT NULL,
	UNIQUE KEY api_tokens_hash (hash)
) ENGINE=InnoDB;
-- +step
CREATE TABLE IF NOT EXISTS audit_log (
	id          BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY,
	at          BIGINT          NOT NULL,
	actor       VARBINARY(255)  NOT NULL,
	credential  VARBINARY(300)  NOT NULL,
	remote      VARBINARY(64)   NOT NULL,
	action      VARBINARY(255)  NOT NULL,
	object      VARBINARY(300)  NOT NULL,
	before_json MEDIUMBLOB      NOT NULL, -- '' for none
	after_json  MEDIUMBLOB      NOT NULL,
	KEY audit_log_at (at)
) ENGINE=InnoDB;
-- +step
ALTER TABLE sessions ADD COLUMN IF NOT EXISTS user_name VARBINARY(255) NOT NULL DEFAULT '';
-- +step
ALTER TABLE sessions ADD COLUMN IF NOT EXISTS credential VARBINARY(300) NOT NULL DEFAULT '';
