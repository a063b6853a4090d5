-- Cluster mode (docs/cluster.md): firmware artifact IDs from the database,
-- so that two nodes adding artifacts at once never give them one ID (an
-- artifact is stored by ID: one would replace the other); moved past the
-- IDs in use and deleted when a node starts.
CREATE SEQUENCE cluster_firmware_ids MINVALUE 0 START 0;
