-- Alerts, labels, settings and dashboard sessions, as on SQLite (times in
-- unix ms). Binary columns, as in 001: compared and stored byte for byte.
-- Every step may run again (MariaDB commits DDL implicitly).
CREATE TABLE IF NOT EXISTS labels (
	id   INT            NOT NULL PRIMARY KEY,
	name VARBINARY(255) NOT NULL,
	UNIQUE KEY labels_name (name)
) ENGINE=InnoDB;
-- +step
CREATE TABLE IF NOT EXISTS device_labels (
	label_id  INT             NOT NULL,
	device_id BIGINT UNSIGNED NOT NULL,
	PRIMARY KEY (label_id, device_id)
) ENGINE=InnoDB;
-- +step
CREATE TABLE IF NOT EXISTS alert_rules (
	id   BIGINT UNSIGNED NOT NULL PRIMARY KEY,
	spec LONGBLOB        NOT NULL
) ENGINE=InnoDB;
-- +step
CREATE TABLE IF NOT EXISTS alert_events (
	id         BIGINT UNSIGNED NOT NULL PRIMARY KEY,
	rule_id    BIGINT UNSIGNED NOT NULL,
	device_id  BIGINT UNSIGNED NOT NULL,
	cleared_at BIGINT          NULL,
	body       LONGBLOB        NOT NULL,
	KEY alert_events_active (cleared_at, id),
	KEY alert_events_device (device_id, id)
) ENGINE=InnoDB;
-- +step
CREATE TABLE IF NOT EXISTS sync_events (
	id        BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY,
	device_id BIGINT UNSIGNED NOT NULL,
	at        BIGINT          NOT NULL,
	state     VARBINARY(32)   NOT NULL,
	applied   BIGINT          NOT NULL,
	desired   BIGINT          NOT NULL,
	error     BLOB            NOT NULL,
	KEY sync_events_device (device_id, at),
	KEY sync_events_at (at)
) ENGINE=InnoDB;
-- +step
CREATE TABLE IF NOT EXISTS settings (
	name  VARBINARY(191) NOT NULL PRIMARY KEY,
	value LONGBLOB       NOT NULL
) ENGINE=InnoDB;
-- +step
CREATE TABLE IF NOT EXISTS id_marks (
	kind VARBINARY(16) NOT NULL PRIMARY KEY,
	high BIGINT        NOT NULL
) ENGINE=InnoDB;
-- +step
INSERT IGNORE INTO id_marks (kind, high) VALUES ('rule', 0), ('event', 0), ('label', 0);
-- +step
CREATE TABLE IF NOT EXISTS sessions (
	id_hash VARBINARY(32) NOT NULL PRIMARY KEY,
	csrf    VARBINARY(64) NOT NULL,
	expires BIGINT        NOT NULL
) ENGINE=InnoDB;
