-- The profile policy (one row, JSON), firmware linked to another firmware's
-- profile, and lifted quotas (internal/store/internal/sqlcommon/policy.go).
CREATE TABLE profile_policy (
	id   integer PRIMARY KEY,
	spec text    NOT NULL
);
-- +step
CREATE TABLE profile_links (
	device_type text    NOT NULL,
	firmware    text    NOT NULL,
	profile_id  bigint  NOT NULL,
	created_at  bigint  NOT NULL, -- unix ms
	limited     boolean NOT NULL, -- linked because the type's creations were used up
	PRIMARY KEY (device_type, firmware)
);
-- +step
CREATE TABLE quota_lifts (
	device_id  bigint PRIMARY KEY,
	until_at   bigint NOT NULL, -- unix ms, 0: until revoked
	note       text   NOT NULL,
	created_at bigint NOT NULL  -- unix ms
);
