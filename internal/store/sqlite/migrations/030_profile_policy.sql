-- The profile policy (one row, JSON), firmware linked to another firmware's
-- profile, and lifted quotas (internal/store/internal/sqlcommon/policy.go).
CREATE TABLE profile_policy (
	id   INTEGER PRIMARY KEY,
	spec TEXT    NOT NULL
);
-- +step
CREATE TABLE profile_links (
	device_type TEXT    NOT NULL,
	firmware    TEXT    NOT NULL,
	profile_id  INTEGER NOT NULL,
	created_at  INTEGER NOT NULL, -- unix ms
	limited     INTEGER NOT NULL, -- 1: linked because the type's creations were used up
	PRIMARY KEY (device_type, firmware)
) WITHOUT ROWID;
-- +step
CREATE TABLE quota_lifts (
	device_id  INTEGER PRIMARY KEY,
	until_at   INTEGER NOT NULL, -- unix ms, 0: until revoked
	note       TEXT    NOT NULL,
	created_at INTEGER NOT NULL  -- unix ms
);
