-- Firmware artifacts, rollouts, rollout devices and profile revisions
-- (internal/store/internal/sqlcommon/firmware.go, docs/firmware.md).
CREATE TABLE firmware (
	id   INTEGER PRIMARY KEY,
	spec TEXT    NOT NULL -- JSON of fleet.Firmware
);
-- +step
CREATE TABLE rollouts (
	id       INTEGER PRIMARY KEY,
	finished INTEGER NOT NULL, -- 1: aborted or done (its devices are not loaded)
	spec     TEXT    NOT NULL  -- JSON of fleet.Rollout
);
-- +step
CREATE TABLE rollout_devices (
	rollout_id INTEGER NOT NULL,
	device_id  INTEGER NOT NULL,
	wave       INTEGER NOT NULL,
	state      TEXT    NOT NULL,
	progress   INTEGER NOT NULL,
	reason     TEXT    NOT NULL,
	from_fw    TEXT    NOT NULL,
	updated_at INTEGER NOT NULL, -- unix ms
	PRIMARY KEY (rollout_id, device_id)
) WITHOUT ROWID;
-- +step
CREATE TABLE profile_revisions (
	profile_id    INTEGER NOT NULL,
	rev           INTEGER NOT NULL,
	version       INTEGER NOT NULL,
	config        TEXT    NOT NULL,
	push_interval INTEGER NOT NULL,
	by_whom       TEXT    NOT NULL,
	at            INTEGER NOT NULL, -- unix ms
	note          TEXT    NOT NULL,
	PRIMARY KEY (profile_id, rev)
) WITHOUT ROWID;
-- +step
INSERT INTO id_marks (kind, high) VALUES ('firmware', 0);
