-- Rollout policies: named rollout plans, JSON of fleet.RolloutPolicy
-- (internal/store/internal/sqlcommon/policy.go).
CREATE TABLE rollout_policies (
	name TEXT PRIMARY KEY,
	spec TEXT NOT NULL
) WITHOUT ROWID;
