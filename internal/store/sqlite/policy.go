package sqlite

import (
	"database/sql"

	"github.com/drover/drover/internal/fleet"
	"github.com/drover/drover/internal/store/internal/sqlcommon"
)

// policyStore gives the Store fleet.PolicyStore (migration
// 030_profile_policy.sql), on the writer connection.
type policyStore = sqlcommon.Policy

var _ fleet.PolicyStore = (*Store)(nil)

func newPolicyStore(w *sql.DB) policyStore { return sqlcommon.Policy{DB: w, D: sqlcommon.SQLite} }
