-- Cluster mode (docs/cluster.md): label and alert rule IDs from the
-- database, so that two nodes making a label or a rule at once never give
-- them one ID (a label insert failed; a rule replaced the other's); moved
-- past the IDs in use when a node starts.
CREATE SEQUENCE cluster_label_ids MINVALUE 0 START 0;
-- +step
CREATE SEQUENCE cluster_rule_ids MINVALUE 0 START 0;
