-- Cluster mode (docs/cluster.md): the leader prunes the change log by age
-- every second; without this index that was a sequential scan of the whole
-- log (an hour of changes) every second. Change log rows are written only
-- on changes (registrations, profiles, trust), so the index costs pushes
-- nothing.
CREATE INDEX cluster_changes_at ON cluster_changes (at);
