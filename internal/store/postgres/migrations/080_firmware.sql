-- Firmware artifacts, rollouts, rollout devices and profile revisions
-- (internal/store/internal/sqlcommon/firmware.go, docs/firmware.md).
CREATE TABLE firmware (
	id   bigint PRIMARY KEY,
	spec text   NOT NULL -- JSON of fleet.Firmware
);
-- +step
CREATE TABLE rollouts (
	id       bigint  PRIMARY KEY,
	finished boolean NOT NULL, -- aborted or done (its devices are not loaded)
	spec     text    NOT NULL  -- JSON of fleet.Rollout
);
-- +step
CREATE TABLE rollout_devices (
	rollout_id bigint  NOT NULL,
	device_id  bigint  NOT NULL,
	wave       integer NOT NULL,
	state      text    NOT NULL,
	progress   bigint  NOT NULL,
	reason     text    NOT NULL,
	from_fw    text    NOT NULL,
	updated_at bigint  NOT NULL, -- unix ms
	PRIMARY KEY (rollout_id, device_id)
);
-- +step
CREATE TABLE profile_revisions (
	profile_id    bigint  NOT NULL,
	rev           integer NOT NULL,
	version       bigint  NOT NULL,
	config        text    NOT NULL,
	push_interval integer NOT NULL,
	by_whom       text    NOT NULL,
	at            bigint  NOT NULL, -- unix ms
	note          text    NOT NULL,
	PRIMARY KEY (profile_id, rev)
);
-- +step
INSERT INTO id_marks (kind, high) VALUES ('firmware', 0);
