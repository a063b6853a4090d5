-- Cluster mode (docs/cluster.md): alert event IDs from the database, so
-- that a node that just took the leadership, or two nodes that both lead
-- for a moment, never give two events one ID (the second replaced the
-- first); moved past the IDs in use and the pruned ones when a node starts.
CREATE SEQUENCE cluster_event_ids MINVALUE 0 START 0;
