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

// From largeFleet devices on, PostgreSQL's default max_wal_size (1 GB) is
// full within tens of seconds of pushes, and each checkpoint's writes stall
// commits (docs/persistence.md, docs/performance.md "Session 11: PostgreSQL
// with room for its checkpoints").
const (
	largeFleet = 100_000
	roomyWAL   = 4 << 30
)

// needsCheckpointRoom says whether a fleet of devices wants a larger
// max_wal_size than maxWAL bytes.
func needsCheckpointRoom(devices int, maxWAL int64) bool {
	return devices >= largeFleet && maxWAL < roomyWAL
}

// adviseCheckpoints warns at start when the database checkpoints too often
// for the fleet it holds.
func (s *Server) adviseCheckpoints(ctx context.Context, devices int) {
	c, ok := s.store.(checkpointRoomer)
	if !ok {
		return
	}
	wal, timeout, err := c.CheckpointRoom(ctx)
	if err != nil {
		s.log.Debug("checkpoint settings not read", "err", err)
		return
	}
	if needsCheckpointRoom(devices, wal) {
		s.log.Warn("PostgreSQL checkpoints too often for this fleet", "devices", devices,
			"max_wal_size_mb", wal>>20, "checkpoint_timeout", timeout, "advice", "max_wal_size 16GB, checkpoint_timeout 15min (docs/persistence.md)")
	}
}
