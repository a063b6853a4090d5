-- Rollout policies: named rollout plans, JSON of fleet.RolloutPolicy
-- (internal/store/internal/sqlcommon/policy.go).
CREATE TABLE IF NOT EXISTS rollout_policies (
	name VARBINARY(64) NOT NULL PRIMARY KEY,
	spec LONGBLOB      NOT NULL
) ENGINE=InnoDB;
