-- Remote commands (fleet.CommandStore): one row per job, one per targeted
-- device. Times are unix ms; states their names.
CREATE TABLE command_jobs (
	id         bigint PRIMARY KEY,
	kind       text    NOT NULL,
	args       text    NOT NULL, -- JSON array
	timeout    bigint NOT NULL, -- seconds
	target     text    NOT NULL,
	filter     text    NOT NULL,
	device_id  bigint NOT NULL,
	state      text    NOT NULL,
	created_at bigint NOT NULL,
	expires_at bigint NOT NULL,
	total      bigint NOT NULL,
	creating   bigint NOT NULL,
	cursor_id  bigint NOT NULL,
	last_id    bigint NOT NULL
);
-- +step
CREATE TABLE device_commands (
	job_id       bigint NOT NULL,
	device_id    bigint NOT NULL,
	state        text    NOT NULL,
	queued_at    bigint NOT NULL,
	delivered_at bigint NOT NULL,
	finished_at  bigint NOT NULL,
	exit_code    bigint NOT NULL,
	error        text    NOT NULL,
	output       text    NOT NULL, -- JSON array of lines; '' for none
	started_on   bigint NOT NULL, -- device clock, unix s
	finished_on  bigint NOT NULL,
	PRIMARY KEY (job_id, device_id)
);
-- +step
CREATE INDEX device_commands_pending ON device_commands (state) WHERE state IN ('queued', 'delivered');
-- +step
CREATE INDEX device_commands_device ON device_commands (device_id, job_id);
