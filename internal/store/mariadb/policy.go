package mariadb

import (
	"database/sql"

	"github.com/drover/drover/internal/fleet"
	"github.com/drover/drover/internal/store/internal/sqlcommon"
)

// policyStore gives the Store fleet.PolicyStore (migration
// 030_profile_policy.sql).
type policyStore = sqlcommon.Policy

var _ fleet.PolicyStore = (*Store)(nil)

func newPolicyStore(db *sql.DB) policyStore { return sqlcommon.Policy{DB: db, D: sqlcommon.MariaDB} }
