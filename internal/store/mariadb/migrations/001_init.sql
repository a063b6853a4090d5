-- Times are integers as in every Drover backend: profiles in unix ms,
-- registered_at in unix s, last_seen in unix ns (0: never), samples in ms.
-- Text is VARBINARY/BLOB: compared and returned byte for byte, where a
-- character collation would make 'm-1', 'M-1' and 'm-1 ' the same machine.
-- MariaDB commits DDL implicitly, so every step may be run again.
CREATE TABLE IF NOT EXISTS profiles (
	id            BIGINT UNSIGNED NOT NULL PRIMARY KEY,
	device_type   VARBINARY(255)  NOT NULL,
	firmware      VARBINARY(255)  NOT NULL,
	version       BIGINT          NOT NULL,
	config        LONGBLOB        NOT NULL,
	push_interval INT             NOT NULL,
	created_at    BIGINT          NOT NULL,
	updated_at    BIGINT          NOT NULL,
	UNIQUE KEY profiles_key (device_type, firmware)
) ENGINE=InnoDB;
-- +step
CREATE TABLE IF NOT EXISTS devices (
	id              BIGINT UNSIGNED NOT NULL PRIMARY KEY,
	machine_id      VARBINARY(512)  NOT NULL,
	device_type     VARBINARY(255)  NOT NULL,
	model           VARBINARY(255)  NOT NULL DEFAULT '',
	firmware        VARBINARY(255)  NOT NULL,
	serial          VARBINARY(512)  NOT NULL DEFAULT '',
	token_hash      VARBINARY(64)   NOT NULL,
	registered_at   BIGINT          NOT NULL,
	last_seen       BIGINT          NOT NULL DEFAULT 0,
	seq             BIGINT          NOT NULL DEFAULT 0,
	applied_version BIGINT          NOT NULL DEFAULT 0,
	config_error    VARBINARY(4096) NOT NULL DEFAULT '',
	state           MEDIUMBLOB      NULL,
	UNIQUE KEY devices_machine_id (machine_id)
) ENGINE=InnoDB;
-- +step
-- id grows with insertion, hence with time: retention deletes by id range.
CREATE TABLE IF NOT EXISTS samples (
	id          BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY,
	device_id   BIGINT UNSIGNED NOT NULL,
	at          BIGINT          NOT NULL,
	seq         BIGINT          NOT NULL,
	uptime      BIGINT          NULL,
	cpu         DOUBLE          NULL,
	mem_used    BIGINT          NULL,
	mem_total   BIGINT          NULL,
	disk_used   BIGINT          NULL,
	disk_total  BIGINT          NULL,
	temperature DOUBLE          NULL,
	rx_bytes    BIGINT          NULL,
	tx_bytes    BIGINT          NULL,
	rssi        DOUBLE          NULL,
	rsrp        DOUBLE          NULL,
	rsrq        DOUBLE          NULL,
	sinr        DOUBLE          NULL,
	KEY samples_device_at (device_id, at)
) ENGINE=InnoDB;
