package postgres

import (
	"database/sql"

	"github.com/drover/drover/internal/fleet"
	"github.com/drover/drover/internal/store/internal/policysql"
)

// policyStore gives the Store fleet.PolicyStore (migration
// 030_profile_policy.sql), through database/sql on the same pool.
type policyStore = policysql.Store

var _ fleet.PolicyStore = (*Store)(nil)

func newPolicyStore(db *sql.DB) policyStore { return policysql.New(db, policysql.Postgres) }
