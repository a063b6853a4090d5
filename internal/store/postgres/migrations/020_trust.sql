-- Device admission and trust (fleet.TrustStore). A device without a row
-- here is active and has no device key.
CREATE TABLE device_trust (
	device_id        bigint  PRIMARY KEY,
	admission        text    NOT NULL, -- active, pending, blocked, decommissioned
	key_hash         bytea,            -- SHA-256 of the device key
	request_key_hash bytea,            -- a re-enrollment request: its key's SHA-256 (NULL: none)
	request_at       bigint  NOT NULL DEFAULT 0, -- unix ns
	request_from     text    NOT NULL DEFAULT '',
	request_approved boolean NOT NULL DEFAULT false
);
-- +step
CREATE TABLE enrollment_tokens (
	id         bigint  PRIMARY KEY,
	hash       bytea   NOT NULL, -- SHA-256 of the token
	machine_id text    NOT NULL DEFAULT '',
	note       text    NOT NULL DEFAULT '',
	created_at bigint  NOT NULL, -- unix ms
	expires_at bigint  NOT NULL, -- unix ms
	used_at    bigint  NOT NULL DEFAULT 0, -- unix ms, 0: unused
	device_id  bigint  NOT NULL DEFAULT 0,
	revoked    boolean NOT NULL DEFAULT false
);
-- +step
CREATE TABLE preauthorized (
	machine_id text   PRIMARY KEY,
	added_at   bigint NOT NULL -- unix ms
);
-- +step
-- max_deleted_device_id: device IDs are never handed out again.
CREATE TABLE trust_counters (
	name  text   PRIMARY KEY,
	value bigint NOT NULL
);
