-- Device admission and trust (fleet.TrustStore). A device without a row
-- here is active and has no device key.
CREATE TABLE device_trust (
	device_id        INTEGER PRIMARY KEY,
	admission        TEXT    NOT NULL, -- active, pending, blocked, decommissioned
	key_hash         BLOB,             -- SHA-256 of the device key
	request_key_hash BLOB,             -- a re-enrollment request: its key's SHA-256 (NULL: none)
	request_at       INTEGER NOT NULL DEFAULT 0, -- unix ns
	request_from     TEXT    NOT NULL DEFAULT '',
	request_approved INTEGER NOT NULL DEFAULT 0
);
-- +step
CREATE TABLE enrollment_tokens (
	id         INTEGER PRIMARY KEY,
	hash       BLOB    NOT NULL, -- SHA-256 of the token
	machine_id TEXT    NOT NULL DEFAULT '',
	note       TEXT    NOT NULL DEFAULT '',
	created_at INTEGER NOT NULL, -- unix ms
	expires_at INTEGER NOT NULL, -- unix ms
	used_at    INTEGER NOT NULL DEFAULT 0, -- unix ms, 0: unused
	device_id  INTEGER NOT NULL DEFAULT 0,
	revoked    INTEGER NOT NULL DEFAULT 0
);
-- +step
CREATE TABLE preauthorized (
	machine_id TEXT    PRIMARY KEY,
	added_at   INTEGER NOT NULL -- unix ms
);
-- +step
-- max_deleted_device_id: device IDs are never handed out again.
CREATE TABLE trust_counters (
	name  TEXT    PRIMARY KEY,
	value INTEGER NOT NULL
);
