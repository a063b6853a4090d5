-- Rollout policies: named rollout plans, JSON of fleet.RolloutPolicy
-- (internal/store/internal/sqlcommon/policy.go).
CREATE TABLE rollout_policies (
	name text PRIMARY KEY,
	spec text NOT NULL
);
