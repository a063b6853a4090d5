-- Times are integers as in every Drover backend: profiles in unix ms,
-- registered_at in unix s, last_seen in unix ns (0: never), samples in ms.
-- Bytes that come from devices or operators and are not protocol-checked
-- text (token hash, state JSON, profile config, config error) are bytea:
-- stored and returned exactly.
CREATE TABLE profiles (
	id            bigint  PRIMARY KEY,
	device_type   text    NOT NULL,
	firmware      text    NOT NULL,
	version       bigint  NOT NULL,
	config        bytea   NOT NULL,
	push_interval integer NOT NULL,
	created_at    bigint  NOT NULL,
	updated_at    bigint  NOT NULL,
	UNIQUE (device_type, firmware)
);
-- +step
-- fillfactor leaves room on each page so that state updates are HOT
-- (no index touched: no indexed column changes).
CREATE TABLE devices (
	id              bigint PRIMARY KEY,
	machine_id      text   NOT NULL UNIQUE,
	device_type     text   NOT NULL,
	model           text   NOT NULL DEFAULT '',
	firmware        text   NOT NULL,
	serial          text   NOT NULL DEFAULT '',
	token_hash      bytea  NOT NULL,
	registered_at   bigint NOT NULL,
	last_seen       bigint NOT NULL DEFAULT 0,
	seq             bigint NOT NULL DEFAULT 0,
	applied_version bigint NOT NULL DEFAULT 0,
	config_error    bytea  NOT NULL DEFAULT '',
	state           bytea
) WITH (fillfactor = 70);
-- +step
-- id grows with insertion, hence with time: retention deletes by id range.
CREATE TABLE samples (
	id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	device_id   bigint NOT NULL,
	at          bigint NOT NULL,
	seq         bigint NOT NULL,
	uptime      bigint,
	cpu         double precision,
	mem_used    bigint,
	mem_total   bigint,
	disk_used   bigint,
	disk_total  bigint,
	temperature double precision,
	rx_bytes    bigint,
	tx_bytes    bigint,
	rssi        double precision,
	rsrp        double precision,
	rsrq        double precision,
	sinr        double precision
);
-- +step
CREATE INDEX samples_device_at ON samples (device_id, at);
