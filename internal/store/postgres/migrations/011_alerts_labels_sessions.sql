-- Alerts, labels, settings and dashboard sessions, as on SQLite (times in
-- unix ms). Text from devices (sync errors) is bytea: stored exactly.
CREATE TABLE labels (
	id   integer PRIMARY KEY,
	name text    NOT NULL UNIQUE
);
-- +step
CREATE TABLE device_labels (
	label_id  integer NOT NULL,
	device_id bigint  NOT NULL,
	PRIMARY KEY (label_id, device_id)
);
-- +step
CREATE TABLE alert_rules (
	id   bigint PRIMARY KEY,
	spec text   NOT NULL -- the rule as JSON
);
-- +step
CREATE TABLE alert_events (
	id         bigint PRIMARY KEY,
	rule_id    bigint NOT NULL,
	device_id  bigint NOT NULL,
	cleared_at bigint, -- NULL while active
	body       text   NOT NULL -- the event as JSON
);
-- +step
CREATE INDEX alert_events_active ON alert_events (id) WHERE cleared_at IS NULL;
-- +step
CREATE INDEX alert_events_device ON alert_events (device_id, id);
-- +step
CREATE INDEX alert_events_cleared ON alert_events (cleared_at) WHERE cleared_at IS NOT NULL;
-- +step
CREATE TABLE sync_events (
	id        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	device_id bigint NOT NULL,
	at        bigint NOT NULL,
	state     text   NOT NULL,
	applied   bigint NOT NULL,
	desired   bigint NOT NULL,
	error     bytea  NOT NULL
);
-- +step
CREATE INDEX sync_events_device ON sync_events (device_id, at);
-- +step
CREATE INDEX sync_events_at ON sync_events (at);
-- +step
CREATE TABLE settings (
	name  text PRIMARY KEY,
	value text NOT NULL
);
-- +step
-- The highest ID ever handed out per kind, raised when rows are deleted.
CREATE TABLE id_marks (
	kind text   PRIMARY KEY,
	high bigint NOT NULL
);
-- +step
INSERT INTO id_marks (kind, high) VALUES ('rule', 0), ('event', 0), ('label', 0);
-- +step
CREATE TABLE sessions (
	id_hash bytea  PRIMARY KEY, -- SHA-256 of the session ID
	csrf    text   NOT NULL,
	expires bigint NOT NULL
);
