// Package contract is the whole store contract in one interface, composed
// of the domain packages' small ones: every backend (internal/store/sqlite,
// postgres, mariadb) implements all of it, and internal/store/storetest
// checks it on each. It is a leaf package so that the adapters' tests and
// the server can name it without import cycles.
package contract

import (
	"context"
	"io"
	"time"

	"github.com/drover/drover/internal/access"
	"github.com/drover/drover/internal/alert"
	"github.com/drover/drover/internal/fleet"
	"github.com/drover/drover/internal/sessions"
)

// Store is what the server takes.
type Store interface {
	fleet.Backend  // devices, states, history, profiles, labels, trust, policy, firmware, commands
	alert.Store    // alert rules, alert and sync events, settings
	sessions.Store // dashboard sessions
	access.Store   // users, API tokens, audit log
	// LockLost returns an error (wrapping instlock.ErrLost) once another
	// server took this store's instance lock, else nil. From then on this
	// server must not acknowledge writes: its commits fail.
	LockLost() error
	// Extras returns what the backend offers beyond the contract.
	Extras() Extras
}

// Extras are a backend's capabilities beyond the contract, each nil where
// the backend has none: what the server watches and advises on.
type Extras struct {
	// ObserveUpkeep has f told about each step of the store's background
	// work from now on (SQLite: checkpoints, state log merges, history
	// archiving and their drops).
	ObserveUpkeep func(f fleet.UpkeepObserver)
	// CheckpointRoom reads PostgreSQL's max_wal_size (bytes) and
	// checkpoint_timeout.
	CheckpointRoom func(ctx context.Context) (maxWAL int64, timeout time.Duration, err error)
	// InnoDBSizes reads InnoDB's buffer pool and redo log sizes in bytes
	// (MariaDB, MySQL).
	InnoDBSizes func(ctx context.Context) (pool, redoLog int64, err error)
}

// Cluster is a store that serves one node of a cluster (PostgreSQL only,
// docs/cluster.md): the whole contract, the fleet's cluster needs, and
// what the node's own loops use.
type Cluster interface {
	Store
	fleet.ClusterStore
	fleet.RolloutCluster
	// PutFirmwareBlob stores an uploaded firmware file under its SHA-256
	// (in one transaction; content stored already is kept),
	// GetFirmwareBlob writes it out, DeleteFirmwareBlob forgets it: the
	// nodes' shared copy (docs/firmware.md).
	PutFirmwareBlob(ctx context.Context, sum string, r io.Reader) error
	GetFirmwareBlob(ctx context.Context, sum string, w io.Writer) (int64, error)
	DeleteFirmwareBlob(ctx context.Context, sum string) error
	// OnChange sets what runs after each commit that wrote change log rows.
	OnChange(func())
	// TryLeader says whether this node leads, taking the leader lock when
	// it is free.
	TryLeader(ctx context.Context) (bool, error)
	// NextRuleID hands out an alert rule ID no node has used.
	NextRuleID(ctx context.Context) (uint64, error)
	// NextEventIDs hands out n alert event IDs no node has used, ascending.
	NextEventIDs(ctx context.Context, n int) ([]uint64, error)
	// ClusterID names the cluster (its database), for NATS subjects.
	ClusterID(ctx context.Context) (string, error)
	// ClusterSecret is the secret called name the nodes share: fresh
	// when no node stored one yet, else the stored one.
	ClusterSecret(ctx context.Context, name, fresh string) (string, error)
	LastChange(ctx context.Context) (int64, error)
	// ChangesAfter reads change log entries after seq or among holes.
	ChangesAfter(ctx context.Context, seq int64, holes []int64, limit int) ([]fleet.Change, error)
	PruneChanges(ctx context.Context, before time.Time) (int64, error)
	// SavePushes stores a batch of this node's push summaries, LastPushes
	// and PushesAfter read them back by sequence number (while some node
	// cannot reach NATS); PrunePushes drops old ones.
	SavePushes(ctx context.Context, body []byte) error
	LastPushes(ctx context.Context) (int64, error)
	PushesAfter(ctx context.Context, seq int64, limit int) ([]fleet.PushSummaries, error)
	PrunePushes(ctx context.Context, before time.Time) (int64, error)
	Heartbeat(ctx context.Context, n fleet.ClusterNode) error
	Leave(ctx context.Context, name string) error
	Nodes(ctx context.Context) ([]fleet.ClusterNode, error)
}
