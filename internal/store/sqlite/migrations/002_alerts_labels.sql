CREATE TABLE labels (
	id   INTEGER PRIMARY KEY,
	name TEXT    NOT NULL UNIQUE
);
-- +step
CREATE TABLE device_labels (
	label_id  INTEGER NOT NULL,
	device_id INTEGER NOT NULL,
	PRIMARY KEY (label_id, device_id)
) WITHOUT ROWID;
-- +step
CREATE TABLE alert_rules (
	id   INTEGER PRIMARY KEY,
	spec TEXT    NOT NULL -- the rule as JSON
);
-- +step
CREATE TABLE alert_events (
	id         INTEGER PRIMARY KEY,
	rule_id    INTEGER NOT NULL,
	device_id  INTEGER NOT NULL,
	cleared_at INTEGER, -- unix ms, NULL while active
	body       TEXT    NOT NULL -- the event as JSON
);
-- +step
CREATE INDEX alert_events_active ON alert_events (id) WHERE cleared_at IS NULL;
-- +step
CREATE INDEX alert_events_device ON alert_events (device_id, id);
-- +step
CREATE INDEX alert_events_cleared ON alert_events (cleared_at) WHERE cleared_at IS NOT NULL;
-- +step
CREATE TABLE sync_events (
	device_id INTEGER NOT NULL,
	at        INTEGER NOT NULL, -- unix ms
	state     TEXT    NOT NULL,
	applied   INTEGER NOT NULL,
	desired   INTEGER NOT NULL,
	error     TEXT    NOT NULL DEFAULT ''
);
-- +step
CREATE INDEX sync_events_device ON sync_events (device_id, at);
-- +step
CREATE INDEX sync_events_at ON sync_events (at);
-- +step
CREATE TABLE settings (
	key   TEXT PRIMARY KEY,
	value TEXT NOT NULL
);
