package server

import (
	"context"
	"time"
)

// checkpointRoomer is a store whose database checkpoints by WAL volume and
// time (PostgreSQL: postgres.Store.CheckpointRoom).
type checkpointRoomer interface {
	CheckpointRoom(ctx context.Context) (maxWAL int64, timeout time.Duration, err error)
}

// bufferPooler is a store whose database caches its pages in a buffer pool
// of a set size (MariaDB: mariadb.Store.BufferPool).
type bufferPooler interface {
	BufferPool(ctx context.Context) (bytes int64, err error)
}

// From largeFleet devices on, PostgreSQL's default max_wal_size (1 GB) is
// full within tens of seconds of pushes, and each checkpoint's writes stall
// commits (docs/persistence.md, docs/performance.md "Session 11: PostgreSQL
// with room for its checkpoints").
const (
	largeFleet = 100_000
	roomyWAL   = 4 << 30
)

// poolPerDevice is the buffer pool a device needs on MariaDB: its row in
// devices (about 1.5 KB with a 750-byte state, index included, measured at
// 1,000,000 devices) and a share of the newest history pages. A pool
// smaller than the devices table makes most pushes read their row from
// disk (docs/performance.md "Session 14: MariaDB and the million").
const poolPerDevice = 2 << 10

// needsCheckpointRoom says whether a fleet of devices wants a larger
// max_wal_size than maxWAL bytes.
func needsCheckpointRoom(devices int, maxWAL int64) bool {
	return devices >= largeFleet && maxWAL < roomyWAL
}

// needsBufferPool says whether a fleet of devices wants a larger buffer
// pool than pool bytes.
func needsBufferPool(devices int, pool int64) bool {
	return devices >= largeFleet && pool < int64(devices)*poolPerDevice
}

// adviseDatabase warns at start when the database is set up too small for
// the fleet it holds: PostgreSQL checkpointing too often, MariaDB's buffer
// pool smaller than the devices.
func (s *Server) adviseDatabase(ctx context.Context, devices int) {
	if c, ok := s.store.(checkpointRoomer); ok {
		wal, timeout, err := c.CheckpointRoom(ctx)
		if err != nil {
			s.log.Debug("checkpoint settings not read", "err", err)
		} else if needsCheckpointRoom(devices, wal) {
			s.log.Warn("PostgreSQL checkpoints too often for this fleet", "devices", devices,
				"max_wal_size_mb", wal>>20, "checkpoint_timeout", timeout, "advice", "max_wal_size 16GB, checkpoint_timeout 15min (docs/persistence.md)")
		}
	}
	if b, ok := s.store.(bufferPooler); ok {
		pool, err := b.BufferPool(ctx)
		if err != nil {
			s.log.Debug("buffer pool size not read", "err", err)
		} else if needsBufferPool(devices, pool) {
			s.log.Warn("MariaDB buffer pool too small for this fleet", "devices", devices,
				"innodb_buffer_pool_size_mb", pool>>20, "advice_mb", int64(devices)*poolPerDevice>>20,
				"advice", "innodb_buffer_pool_size at least 2 KiB per device (docs/persistence.md)")
		}
	}
}
