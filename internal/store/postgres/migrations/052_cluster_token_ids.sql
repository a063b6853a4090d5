-- Cluster mode (docs/cluster.md): enrollment token IDs from the database,
-- so that two nodes never give one ID to two tokens; moved past the IDs in
-- use when a node starts (a server without --cluster counts in memory).
CREATE SEQUENCE cluster_token_ids MINVALUE 0 START 0;
