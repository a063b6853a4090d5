package store

import "github.com/drover/drover/internal/store/contract"

// Store is the whole store contract (see package contract): what Open
// returns and the server takes.
type Store = contract.Store

// Extras are a backend's capabilities beyond the contract (Store.Extras).
type Extras = contract.Extras
