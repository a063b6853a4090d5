-- The profile policy (one row, JSON), firmware linked to another firmware's
-- profile, and lifted quotas (internal/store/internal/sqlcommon/policy.go).
CREATE TABLE IF NOT EXISTS profile_policy (
	id   INT      NOT NULL PRIMARY KEY,
	spec LONGBLOB NOT NULL
) ENGINE=InnoDB;
-- +step
CREATE TABLE IF NOT EXISTS profile_links (
	device_type VARBINARY(255)  NOT NULL,
	firmware    VARBINARY(255)  NOT NULL,
	profile_id  BIGINT UNSIGNED NOT NULL,
	created_at  BIGINT          NOT NULL, -- unix ms
	limited     BOOLEAN         NOT NULL, -- linked because the type's creations were used up
	PRIMARY KEY (device_type, firmware)
) ENGINE=InnoDB;
-- +step
CREATE TABLE IF NOT EXISTS quota_lifts (
	device_id  BIGINT UNSIGNED NOT NULL PRIMARY KEY,
	until_at   BIGINT          NOT NULL, -- unix ms, 0: until revoked
	note       VARBINARY(1024) NOT NULL,
	created_at BIGINT          NOT NULL  -- unix ms
) ENGINE=InnoDB;
