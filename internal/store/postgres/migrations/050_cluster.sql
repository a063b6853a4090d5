-- Cluster mode (docs/cluster.md): several servers share this database.
-- The nodes, each with its heartbeat (unix ms).
CREATE TABLE cluster_nodes (
	name       text   PRIMARY KEY,
	host       text   NOT NULL,
	pid        bigint NOT NULL,
	address    text   NOT NULL DEFAULT '',
	started_at bigint NOT NULL,
	heartbeat  bigint NOT NULL
);
-- +step
-- The change log: a row per device or profile a commit changed, written in
-- that commit's transaction; every node applies it by seq. kind: 1 device
-- (identity, token, trust, deletion), 2 profile.
CREATE TABLE cluster_changes (
	seq  bigint   GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	kind smallint NOT NULL,
	id   bigint   NOT NULL,
	node text     NOT NULL,
	at   bigint   NOT NULL -- unix ms
);
-- +step
-- Device and profile IDs in cluster mode; moved past the IDs in use when a
-- node starts (a server without --cluster allocates in memory).
CREATE SEQUENCE cluster_device_ids MINVALUE 0 START 0;
-- +step
CREATE SEQUENCE cluster_profile_ids MINVALUE 0 START 0;
