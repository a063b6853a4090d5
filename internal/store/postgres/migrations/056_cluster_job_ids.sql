-- Cluster mode (docs/cluster.md, docs/commands.md): remote command job IDs
-- from the database, so that two nodes making jobs at once never give them
-- one ID; moved past the IDs in use when a node starts.
CREATE SEQUENCE cluster_job_ids MINVALUE 0 START 0;
