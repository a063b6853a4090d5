-- Cluster mode (docs/cluster.md): configuration versions from the
-- database, so that two nodes changing two profiles at once never give
-- them one version (versions are unique across profiles); moved past the
-- versions in use when a node starts.
CREATE SEQUENCE cluster_profile_versions MINVALUE 0 START 0;
