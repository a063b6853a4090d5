-- Cluster mode (docs/cluster.md): push summaries through the database
-- while some node cannot reach NATS. A row is one batch of a node's push
-- summaries (JSON), written every half second only while the cluster is
-- degraded; the others read the rows past the last they read, by seq. The
-- leader prunes rows older than two minutes.
CREATE TABLE cluster_pushes (
	seq  bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	node text   NOT NULL,
	at   bigint NOT NULL, -- unix ms
	body bytea  NOT NULL
);
-- +step
-- Whether the node's NATS connection is up, with its heartbeat: while any
-- live node says no, every node writes and reads push summaries here.
ALTER TABLE cluster_nodes ADD COLUMN nats_up boolean NOT NULL DEFAULT true;
