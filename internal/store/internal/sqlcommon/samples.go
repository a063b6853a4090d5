package sqlcommon

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"time"

	"github.com/drover/drover/internal/fleet"
	"github.com/drover/drover/internal/store/internal/batchutil"
	"github.com/drover/drover/internal/store/internal/timeorder"
)

// Samples implements the read side of fleet.Store that PostgreSQL and
// MariaDB share — History, fleet.StateReader and PruneHistory — on
// migration 001's devices and samples (whose id grows with time). SQLite
// keeps its own (partitioned history).
type Samples struct {
	DB *sql.DB
	D  Dialect
	// Writable, if set, is asked before pruning: the instance lock.
	Writable func() error
}

// History implements fleet.Store.
func (s *Samples) History(ctx context.Context, deviceID uint64, q fleet.HistoryQuery) ([]fleet.Sample, error) {
	from, to, limit := timeorder.Bounds(q)
	rows, err := s.DB.QueryContext(ctx, s.D.q(`SELECT at, seq, uptime, cpu, mem_used, mem_total, disk_used, disk_total, temperature,
		rx_bytes, tx_bytes, rssi, rsrp, rsrq, sinr FROM samples WHERE device_id = ? AND at >= ? AND at < ?
		ORDER BY at, id LIMIT ?`), deviceID, from, to, limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []fleet.Sample{}
	for rows.Next() {
		var m fleet.Sample
		var at, seq int64
		var rx, tx *int64
		if err := rows.Scan(&at, &seq, &m.Uptime, &m.CPU, &m.MemUsed, &m.MemTotal, &m.DiskUsed, &m.DiskTotal, &m.Temperature,
			&rx, &tx, &m.RSSI, &m.RSRP, &m.RSRQ, &m.SINR); err != nil {
			return nil, err
		}
		m.DeviceID, m.At, m.Seq = deviceID, time.UnixMilli(at).UTC(), uint64(seq)
		m.RxBytes, m.TxBytes = batchutil.UnclampU(rx), batchutil.UnclampU(tx)
		out = append(out, m)
	}
	return out, rows.Err()
}

// DeviceState implements fleet.StateReader.
func (s *Samples) DeviceState(ctx context.Context, deviceID uint64) (json.RawMessage, error) {
	var st []byte
	err := s.DB.QueryRowContext(ctx, s.D.q(`SELECT state FROM devices WHERE id = ?`), deviceID).Scan(&st)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	return st, err
}

// DropHistory implements fleet.HistoryDropper: one table, no partitions to
// drop; PruneHistory deletes old samples.
func (s *Samples) DropHistory(context.Context, time.Time) (int64, error) { return 0, nil }

// PruneHistory implements fleet.Store. Samples are appended in time order,
// so ids grow with time: the first id at or after before is found by binary
// search on the primary key, with no index on time to maintain.
func (s *Samples) PruneHistory(ctx context.Context, before time.Time, limit int) (int64, error) {
	if s.Writable != nil {
		if err := s.Writable(); err != nil {
			return 0, err
		}
	}
	var lo, hi sql.NullInt64
	if err := s.DB.QueryRowContext(ctx, `SELECT min(id), max(id) FROM samples`).Scan(&lo, &hi); err != nil || !lo.Valid {
		return 0, err
	}
	next := s.D.q(`SELECT id, at FROM samples WHERE id >= ? ORDER BY id LIMIT 1`)
	cutoff, err := timeorder.FirstFrom(lo.Int64, hi.Int64, before.UnixMilli(), func(m int64) (id, t int64, ok bool, err error) {
		err = s.DB.QueryRowContext(ctx, next, m).Scan(&id, &t)
		if errors.Is(err, sql.ErrNoRows) {
			return 0, 0, false, nil
		}
		return id, t, err == nil, err
	})
	if err != nil {
		return 0, err
	}
	res, err := s.DB.ExecContext(ctx, s.D.q(s.D.deleteSome("samples", "id < ?", limit)), cutoff)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}
