-- Cluster mode (docs/cluster.md, docs/firmware.md): rollouts run on every
-- node. Rollout IDs come from the database, so that two nodes creating
-- rollouts at once never give them one ID; every node reads back, every
-- --rollout-interval, the rollout devices other nodes changed lately
-- (rollout_id, written): an index scan of what changed, not of the
-- rollout's devices.
CREATE SEQUENCE cluster_rollout_ids MINVALUE 0 START 0;
-- +step
-- written: when a cluster node wrote the row, by the database's clock (the
-- read-back's position; updated_at is the node's clock, when the device
-- reported). Servers without --cluster leave it 0.
ALTER TABLE rollout_devices ADD COLUMN written bigint NOT NULL DEFAULT 0;
-- +step
CREATE INDEX rollout_devices_written ON rollout_devices (rollout_id, written);
