-- Device admission and trust (fleet.TrustStore). A device without a row
-- here is active and has no device key. MariaDB commits DDL implicitly, so
-- every step may be run again.
CREATE TABLE IF NOT EXISTS device_trust (
	device_id        BIGINT UNSIGNED NOT NULL PRIMARY KEY,
	admission        VARBINARY(32)   NOT NULL, -- active, pending, blocked, decommissioned
	key_hash         VARBINARY(64)   NULL,     -- SHA-256 of the device key
	request_key_hash VARBINARY(64)   NULL,     -- a re-enrollment request: its key's SHA-256 (NULL: none)
	request_at       BIGINT          NOT NULL DEFAULT 0, -- unix ns
	request_from     VARBINARY(255)  NOT NULL DEFAULT '',
	request_approved BOOLEAN         NOT NULL DEFAULT FALSE
) ENGINE=InnoDB;
-- +step
CREATE TABLE IF NOT EXISTS enrollment_tokens (
	id         BIGINT UNSIGNED NOT NULL PRIMARY KEY,
	hash       VARBINARY(64)   NOT NULL, -- SHA-256 of the token
	machine_id VARBINARY(512)  NOT NULL DEFAULT '',
	note       VARBINARY(1024) NOT NULL DEFAULT '',
	created_at BIGINT          NOT NULL, -- unix ms
	expires_at BIGINT          NOT NULL, -- unix ms
	used_at    BIGINT          NOT NULL DEFAULT 0, -- unix ms, 0: unused
	device_id  BIGINT UNSIGNED NOT NULL DEFAULT 0,
	revoked    BOOLEAN         NOT NULL DEFAULT FALSE
) ENGINE=InnoDB;
-- +step
CREATE TABLE IF NOT EXISTS preauthorized (
	machine_id VARBINARY(512) NOT NULL PRIMARY KEY,
	added_at   BIGINT         NOT NULL -- unix ms
) ENGINE=InnoDB;
-- +step
-- max_deleted_device_id: device IDs are never handed out again.
CREATE TABLE IF NOT EXISTS trust_counters (
	name  VARBINARY(64) NOT NULL PRIMARY KEY,
	value BIGINT UNSIGNED NOT NULL
) ENGINE=InnoDB;
