-- Remote commands (fleet.CommandStore): one row per job, one per targeted
-- device. Times are unix ms; states their names.
CREATE TABLE command_jobs (
	id         INTEGER PRIMARY KEY,
	kind       TEXT    NOT NULL,
	args       TEXT    NOT NULL, -- JSON array
	timeout    INTEGER NOT NULL, -- seconds
	target     TEXT    NOT NULL,
	filter     TEXT    NOT NULL,
	device_id  INTEGER NOT NULL,
	state      TEXT    NOT NULL,
	created_at INTEGER NOT NULL,
	expires_at INTEGER NOT NULL,
	total      INTEGER NOT NULL,
	creating   INTEGER NOT NULL,
	cursor_id  INTEGER NOT NULL,
	last_id    INTEGER NOT NULL
);
-- +step
CREATE TABLE device_commands (
	job_id       INTEGER NOT NULL,
	device_id    INTEGER NOT NULL,
	state        TEXT    NOT NULL,
	queued_at    INTEGER NOT NULL,
	delivered_at INTEGER NOT NULL,
	finished_at  INTEGER NOT NULL,
	exit_code    INTEGER NOT NULL,
	error        TEXT    NOT NULL,
	output       TEXT    NOT NULL, -- JSON array of lines; '' for none
	started_on   INTEGER NOT NULL, -- device clock, unix s
	finished_on  INTEGER NOT NULL,
	PRIMARY KEY (job_id, device_id)
);
-- +step
CREATE INDEX device_commands_pending ON device_commands (state) WHERE state IN ('queued', 'delivered');
-- +step
CREATE INDEX device_commands_device ON device_commands (device_id, job_id);
