CREATE TABLE profiles (
	id            INTEGER PRIMARY KEY,
	device_type   TEXT    NOT NULL,
	firmware      TEXT    NOT NULL,
	version       INTEGER NOT NULL,
	config        TEXT    NOT NULL,
	push_interval INTEGER NOT NULL,
	created_at    INTEGER NOT NULL, -- unix ms
	updated_at    INTEGER NOT NULL,
	UNIQUE (device_type, firmware)
);
-- +step
CREATE TABLE devices (
	id              INTEGER PRIMARY KEY,
	machine_id      TEXT    NOT NULL, -- unique: enforced by the in-memory registry, no index to keep random inserts off the write path
	device_type     TEXT    NOT NULL,
	model           TEXT    NOT NULL DEFAULT '',
	firmware        TEXT    NOT NULL,
	serial          TEXT    NOT NULL DEFAULT '',
	token_hash      BLOB    NOT NULL,
	registered_at   INTEGER NOT NULL, -- unix s
	last_seen       INTEGER NOT NULL DEFAULT 0, -- unix ns, 0: never
	seq             INTEGER NOT NULL DEFAULT 0,
	applied_version INTEGER NOT NULL DEFAULT 0,
	config_error    TEXT    NOT NULL DEFAULT '',
	state           BLOB
);
-- +step
CREATE TABLE samples (
	device_id   INTEGER NOT NULL,
	at          INTEGER NOT NULL, -- unix ms
	seq         INTEGER NOT NULL,
	uptime      INTEGER,
	cpu         REAL,
	mem_used    INTEGER,
	mem_total   INTEGER,
	disk_used   INTEGER,
	disk_total  INTEGER,
	temperature REAL,
	rx_bytes    INTEGER,
	tx_bytes    INTEGER,
	rssi        REAL,
	rsrp        REAL,
	rsrq        REAL,
	sinr        REAL
);
-- +step
CREATE INDEX samples_device_at ON samples (device_id, at);
