package server

import "context"

// From largeFleet devices on, PostgreSQL's default max_wal_size (1 GB) is
// full within tens of seconds of pushes, and each checkpoint's writes stall
// commits (docs/persistence.md, docs/performance.md "The fleet test on
// PostgreSQL").
const (
	largeFleet = 100_000
	roomyWAL   = 4 << 30
)

// poolPerDevice is the buffer pool a device needs on MariaDB: its row in
// devices (about 1.5 KB with a 750-byte state, index included, measured at
// 1,000,000 devices) and a share of the newest history pages. A pool
// smaller than the devices table makes most pushes read their row from
// disk (docs/performance.md "The fleet test on MariaDB").
const poolPerDevice = 2 << 10

// roomyRedoLog is the InnoDB redo log a large fleet wants: on the default
// 96 MiB, a million devices' pushes made InnoDB flush pages to free log
// space all the time (14,147 pushes dropped in 5 minutes; with 2 GiB none).
const roomyRedoLog = 2 << 30

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

// needsRedoLog says whether a fleet of devices wants a larger InnoDB redo
// log than redoLog bytes.
func needsRedoLog(devices int, redoLog int64) bool {
	return devices >= largeFleet && redoLog < roomyRedoLog
}

// adviseDatabase warns at start when the database is set up too small for
// the fleet it holds: PostgreSQL checkpointing too often, MariaDB's buffer
// pool smaller than the devices or its redo log short.
func (s *Server) adviseDatabase(ctx context.Context, devices int) {
	if s.store == nil {
		return
	}
	x := s.store.Extras()
	if x.CheckpointRoom != nil {
		wal, timeout, err := x.CheckpointRoom(ctx)
		if err != nil {
			s.log.Debug("checkpoint settings not read", "err", err)
		} else if needsCheckpointRoom(devices, wal) {
			s.log.Warn("PostgreSQL checkpoints too often for this fleet", "devices", devices,
				"max_wal_size_mb", wal>>20, "checkpoint_timeout", timeout, "advice", "max_wal_size 16GB, checkpoint_timeout 15min (docs/persistence.md)")
		}
	}
	if x.InnoDBSizes != nil {
		pool, redoLog, err := x.InnoDBSizes(ctx)
		if err != nil {
			s.log.Debug("InnoDB sizes not read", "err", err)
			return
		}
		if needsBufferPool(devices, pool) {
			s.log.Warn("MariaDB buffer pool too small for this fleet", "devices", devices,
				"innodb_buffer_pool_size_mb", pool>>20, "advice_mb", int64(devices)*poolPerDevice>>20,
				"advice", "innodb_buffer_pool_size at least 2 KiB per device (docs/persistence.md)")
		}
		if needsRedoLog(devices, redoLog) {
			s.log.Warn("MariaDB redo log too small for this fleet", "devices", devices,
				"innodb_log_file_size_mb", redoLog>>20, "advice", "innodb_log_file_size 2G (docs/persistence.md)")
		}
	}
}
