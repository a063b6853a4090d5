-- Remote commands (fleet.CommandStore): one row per job, one per targeted
-- device. Times are unix ms; states their names. MariaDB commits DDL
-- implicitly, so every step may be run again.
CREATE TABLE IF NOT EXISTS command_jobs (
	id         BIGINT UNSIGNED NOT NULL PRIMARY KEY,
	kind       VARBINARY(32)   NOT NULL,
	args       BLOB            NOT NULL, -- JSON array
	timeout    INT             NOT NULL, -- seconds
	target     BLOB            NOT NULL,
	filter     BLOB            NOT NULL,
	device_id  BIGINT UNSIGNED NOT NULL,
	state      VARBINARY(16)   NOT NULL,
	created_at BIGINT          NOT NULL,
	expires_at BIGINT          NOT NULL,
	total      BIGINT          NOT NULL,
	creating   TINYINT         NOT NULL,
	cursor_id  BIGINT UNSIGNED NOT NULL,
	last_id    BIGINT UNSIGNED NOT NULL
) ENGINE=InnoDB;
-- +step
CREATE TABLE IF NOT EXISTS device_commands (
	job_id       BIGINT UNSIGNED NOT NULL,
	device_id    BIGINT UNSIGNED NOT NULL,
	state        VARBINARY(16)   NOT NULL,
	queued_at    BIGINT          NOT NULL,
	delivered_at BIGINT          NOT NULL,
	finished_at  BIGINT          NOT NULL,
	exit_code    INT             NOT NULL,
	error        BLOB            NOT NULL,
	output       MEDIUMBLOB      NOT NULL, -- JSON array of lines; '' for none
	started_on   BIGINT          NOT NULL, -- device clock, unix s
	finished_on  BIGINT          NOT NULL,
	PRIMARY KEY (job_id, device_id),
	KEY device_commands_pending (state),
	KEY device_commands_device (device_id, job_id)
) ENGINE=InnoDB;
