package store

import "github.com/drover/drover/internal/fleet"

// Store is the whole store contract, which every backend implements and
// storetest checks on each: what the server takes.
type Store interface {
	fleet.Store
	// LockLost returns an error (wrapping ErrLockLost) once another server
	// took this store's instance lock, else nil. From then on this server
	// must not acknowledge writes: its commits fail.
	LockLost() error
}
