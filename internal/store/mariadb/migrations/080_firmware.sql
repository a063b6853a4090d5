-- Firmware artifacts, rollouts, rollout devices and profile revisions
-- (internal/store/internal/sqlcommon/firmware.go, docs/firmware.md).
CREATE TABLE IF NOT EXISTS firmware (
	id   BIGINT UNSIGNED NOT NULL PRIMARY KEY,
	spec LONGBLOB        NOT NULL -- JSON of fleet.Firmware
) ENGINE=InnoDB;
-- +step
CREATE TABLE IF NOT EXISTS rollouts (
	id       BIGINT UNSIGNED NOT NULL PRIMARY KEY,
	finished BOOLEAN         NOT NULL, -- aborted or done (its devices are not loaded)
	spec     LONGBLOB        NOT NULL  -- JSON of fleet.Rollout
) ENGINE=InnoDB;
-- +step
CREATE TABLE IF NOT EXISTS rollout_devices (
	rollout_id BIGINT UNSIGNED NOT NULL,
	device_id  BIGINT UNSIGNED NOT NULL,
	wave       INT             NOT NULL,
	state      VARBINARY(32)   NOT NULL,
	progress   BIGINT          NOT NULL,
	reason     VARBINARY(1024) NOT NULL,
	from_fw    VARBINARY(255)  NOT NULL,
	updated_at BIGINT          NOT NULL, -- unix ms
	PRIMARY KEY (rollout_id, device_id)
) ENGINE=InnoDB;
-- +step
CREATE TABLE IF NOT EXISTS profile_revisions (
	profile_id    BIGINT UNSIGNED NOT NULL,
	rev           INT             NOT NULL,
	version       BIGINT          NOT NULL,
	config        LONGBLOB        NOT NULL,
	push_interval INT             NOT NULL,
	by_whom       VARBINARY(255)  NOT NULL,
	at            BIGINT          NOT NULL, -- unix ms
	note          VARBINARY(1024) NOT NULL,
	PRIMARY KEY (profile_id, rev)
) ENGINE=InnoDB;
-- +step
INSERT IGNORE INTO id_marks (kind, high) VALUES ('firmware', 0);
