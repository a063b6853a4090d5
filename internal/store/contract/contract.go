// Package contract is the whole store contract in one interface, composed
// of the domain packages' small ones: every backend (internal/store/sqlite,
// postgres, mariadb) implements all of it, and internal/store/storetest
// checks it on each. It is a leaf package so that the adapters' tests and
// the server can name it without import cycles.
package contract

import (
	"github.com/drover/drover/internal/alert"
	"github.com/drover/drover/internal/fleet"
	"github.com/drover/drover/internal/web/sessions"
)

// Store is what the server takes.
type Store interface {
	fleet.Store         // devices, states, history, profiles
	fleet.StateReader   // one device's current state
	fleet.LabelStore    // labels and their assignments
	fleet.TrustStore    // admission, device keys, enrollment tokens, deleted device IDs
	fleet.PolicyStore   // profile policy, firmware links, lifted quotas
	fleet.FirmwareStore // firmware artifacts, rollouts, profile revisions
	alert.Store         // alert rules, alert and sync events, settings
	sessions.Store      // dashboard sessions
	// LockLost returns an error (wrapping instlock.ErrLost) once another
	// server took this store's instance lock, else nil. From then on this
	// server must not acknowledge writes: its commits fail.
	LockLost() error
}
