-- History in time partitions (history.go): a row holds one sample as a push
-- wrote it, or, once its partition is closed and compacted, a device's
-- samples of the whole partition packed into one value (histcodec).
-- Retention drops whole partitions. The samples table of earlier versions
-- stays readable and is pruned as before until it is empty.
CREATE SEQUENCE history_ids;
-- +step
CREATE TABLE history (
	device_id bigint  NOT NULL,
	first_at  bigint  NOT NULL, -- unix ms of the row's first sample: the partition key
	last_at   bigint  NOT NULL,
	id        bigint  NOT NULL DEFAULT nextval('history_ids'), -- insertion order; a packed row has its last sample's
	n         integer NOT NULL,
	data      bytea   NOT NULL
) PARTITION BY RANGE (first_at);
-- +step
CREATE INDEX history_device ON history (device_id, first_at);
-- +step
-- Partitions whose samples are packed (from_ms: the partition's start).
CREATE TABLE history_compacted (from_ms bigint PRIMARY KEY, at bigint NOT NULL);
