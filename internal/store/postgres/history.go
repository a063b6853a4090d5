package postgres

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/drover/drover/internal/fleet"
	"github.com/drover/drover/internal/store/internal/histcodec"
	"github.com/drover/drover/internal/store/internal/timeorder"
)

// History lives in the table history (migration 120), partitioned by range
// of sample time into partitions of partitionPeriod, created by whoever
// writes first into them (and the next one ahead). A push's sample is one
// row holding it alone (histcodec, n = 1). Once a partition's period is
// over (plus closeGrace), the compactor packs each device's rows of the
// partition into one row (n = all of them), a few bytes a sample instead of
// a row and an index entry each. Reads by device are index range lookups in
// the partitions the range covers, merging packed and single rows; retention
// drops whole partitions, and PruneHistory cuts the older samples out of
// the rows of the partition the cutoff falls in, so that no sample older
// than the cutoff is read back. The samples table of earlier versions
// (legacy) is read and pruned as before while it holds samples.

var (
	// partitionPeriod is how much sample time one partition covers (ms):
	// a packed row holds a device's samples of one period, 72 at 200 s.
	partitionPeriod = int64(4 * time.Hour / time.Millisecond)
	// closeGrace is how long after its period a partition is compacted.
	closeGrace = 2 * time.Minute
	// compactEvery is how often the compactor looks for closed partitions;
	// 0: never by itself (tests call CompactHistory).
	compactEvery = time.Minute
	// compactChunk is about how many rows one compaction transaction reads.
	compactChunk = 20_000
)

// Advisory lock keys: partition DDL, compaction (one node at a time).
const (
	partLockKey    = 7283409600
	compactLockKey = 7283409601
)

type hpart struct{ from, to int64 }

// history is the store's cache of the partition list.
type history struct {
	mu     sync.Mutex
	parts  []hpart // by from
	legacy bool    // the samples table may hold samples
	done   map[int64]bool

	stop chan struct{}
	wait chan struct{}
}

func partName(from int64) string {
	return "history_p" + strings.Replace(strconv.FormatInt(from, 10), "-", "m", 1)
}

func partStart(at int64) int64 {
	q := at / partitionPeriod
	if at%partitionPeriod < 0 {
		q--
	}
	return q * partitionPeriod
}

var boundRE = regexp.MustCompile(`FROM \('?(-?\d+)'?\) TO \('?(-?\d+)'?\)`)

// loadParts reads the partition list from the database.
func (s *Store) loadParts(ctx context.Context) error {
	rows, err := s.pool.Query(ctx, `SELECT pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i
		JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = 'history'::regclass`)
	if err != nil {
		return err
	}
	var parts []hpart
	for rows.Next() {
		var bound *string // NULL: a partition being swapped in by the compactor
		if err := rows.Scan(&bound); err != nil {
			rows.Close()
			return err
		}
		if bound == nil {
			continue
		}
		m := boundRE.FindStringSubmatch(*bound)
		if m == nil {
			rows.Close()
			return fmt.Errorf("history partition bound %q", *bound)
		}
		from, _ := strconv.ParseInt(m[1], 10, 64)
		to, _ := strconv.ParseInt(m[2], 10, 64)
		parts = append(parts, hpart{from, to})
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	slices.SortFunc(parts, func(a, b hpart) int { return cmp.Compare(a.from, b.from) })
	s.hist.mu.Lock()
	s.hist.parts = parts
	s.hist.mu.Unlock()
	return nil
}

// openHistory loads the partition list and whether the legacy table holds
// samples.
func (s *Store) openHistory(ctx context.Context) error {
	if err := s.loadParts(ctx); err != nil {
		return err
	}
	return s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM samples)`).Scan(&s.hist.legacy)
}

// covering returns the partition holding at, if listed; mu held.
func (h *history) covering(at int64) (hpart, bool) {
	i, _ := slices.BinarySearchFunc(h.parts, at, func(p hpart, at int64) int { return cmp.Compare(p.from, at) })
	if i < len(h.parts) && h.parts[i].from == at {
		return h.parts[i], true
	}
	if i > 0 && h.parts[i-1].to > at {
		return h.parts[i-1], true
	}
	return hpart{}, false
}

// ensureParts creates the partitions samples at the times ats need (and,
// for the present one, the next), unless listed.
func (s *Store) ensureParts(ctx context.Context, ats []int64) error {
	var need []int64
	now := partStart(time.Now().UnixMilli())
	s.hist.mu.Lock()
	for _, at := range ats {
		p := partStart(at)
		if _, ok := s.hist.covering(at); !ok && !slices.Contains(need, p) {
			need = append(need, p)
		}
		if p == now { // the next partition is ready before its first push
			if _, ok := s.hist.covering(now + partitionPeriod); !ok && !slices.Contains(need, now+partitionPeriod) {
				need = append(need, now+partitionPeriod)
			}
		}
	}
	s.hist.mu.Unlock()
	if len(need) == 0 {
		return nil
	}
	for _, from := range need {
		if err := s.createPart(ctx, from); err != nil {
			return fmt.Errorf("history partition %s: %w", partName(from), err)
		}
	}
	return s.loadParts(ctx)
}

// createPart creates the partition starting at from unless it exists: an
// empty table attached to history, which takes a lock that lets reads and
// writes of the other partitions go on (CREATE TABLE ... PARTITION OF
// would block them). A partition overlapping one of another period (the
// period changed) is left to the other: its samples go there.
func (s *Store) createPart(ctx context.Context, from int64) error {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1 # `+schemaSalt+`)`, int64(partLockKey)); err != nil {
		return err
	}
	to := from + partitionPeriod
	var overlap bool
	err = tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
		WHERE i.inhparent = 'history'::regclass AND c.relname = $1)`, partName(from)).Scan(&overlap)
	if err != nil || overlap {
		return err
	}
	name := pgx.Identifier{partName(from)}.Sanitize()
	if _, err := tx.Exec(ctx, `CREATE TABLE `+name+` (LIKE history INCLUDING DEFAULTS)`); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, fmt.Sprintf(`ALTER TABLE history ATTACH PARTITION %s FOR VALUES FROM (%d) TO (%d)`, name, from, to)); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42P17" { // overlaps another partition
			return nil
		}
		return err
	}
	return tx.Commit(ctx)
}

// forgetParts drops the cached list: a write met a partition dropped
// meanwhile (by another node's retention).
func (s *Store) forgetParts() {
	s.hist.mu.Lock()
	s.hist.parts = nil
	s.hist.mu.Unlock()
}

const insertHistory = `INSERT INTO history (device_id, first_at, last_at, n, data)
	SELECT d, a, a, 1, x FROM unnest($1::bigint[], $2::bigint[], $3::bytea[]) AS u(d, a, x)`

// queueSamples queues the samples' rows, one each, into q.
func queueSamples(q *pgx.Batch, samples []fleet.Sample) {
	q.Queue(insertHistory, sampleArgs(samples)...)
}

// sampleArgs are insertHistory's arrays for samples: device IDs, times
// (unix ms) and each sample encoded.
func sampleArgs(samples []fleet.Sample) []any {
	n := len(samples)
	dev, at, data := make([]int64, n), make([]int64, n), make([][]byte, n)
	for i := range samples {
		m := &samples[i]
		dev[i], at[i], data[i] = int64(m.DeviceID), m.At.UnixMilli(), histcodec.Encode(samples[i:i+1])
	}
	return []any{dev, at, data}
}

// sampleTimes are the samples' times (unix ms), for ensureParts.
func sampleTimes(samples []fleet.Sample) []int64 {
	ats := make([]int64, len(samples))
	for i := range samples {
		ats[i] = samples[i].At.UnixMilli()
	}
	return ats
}

// keyed is a sample with what orders it among equal times: the row's
// insertion order, then its place in the row.
type keyed struct {
	fleet.Sample
	row int64
	idx int
}

func sortKeyed(ks []keyed) {
	slices.SortFunc(ks, func(a, b keyed) int {
		if c := a.At.Compare(b.At); c != 0 {
			return c
		}
		if c := cmp.Compare(a.row, b.row); c != 0 {
			return c
		}
		return cmp.Compare(a.idx, b.idx)
	})
}

// History implements fleet.Store: the legacy table's samples, then the
// partitions' rows the range covers, in time order, until limit.
func (s *Store) History(ctx context.Context, deviceID uint64, q fleet.HistoryQuery) ([]fleet.Sample, error) {
	from, to, limit := timeorder.Bounds(q)
	var out []fleet.Sample
	s.hist.mu.Lock()
	legacy := s.hist.legacy
	low := from
	if p, ok := s.hist.covering(from); ok {
		low = p.from
	} else if from > math.MinInt64+partitionPeriod {
		low = partStart(from) // a partition created since by another node has the period
	}
	s.hist.mu.Unlock()
	if legacy {
		old, err := s.Samples.History(ctx, deviceID, q)
		if err != nil {
			return nil, err
		}
		out = old
	}
	rows, err := s.pool.Query(ctx, `SELECT first_at, id, data FROM history
		WHERE device_id = $1 AND first_at >= $2 AND first_at < $3 AND last_at >= $4 ORDER BY first_at, id`,
		int64(deviceID), low, to, from)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var ks []keyed
	flush := func() {
		sortKeyed(ks)
		for _, k := range ks {
			out = append(out, k.Sample)
		}
		ks = ks[:0]
	}
	part := int64(math.MinInt64)
	for rows.Next() {
		var first, id int64
		var data []byte
		if err := rows.Scan(&first, &id, &data); err != nil {
			return nil, err
		}
		if p := partStart(first); p != part {
			flush()
			if len(out) >= limit {
				break // the partitions after hold later samples only
			}
			part = p
		}
		ss, err := histcodec.Decode(data, deviceID)
		if err != nil {
			return nil, fmt.Errorf("history of device %d at %d: %w", deviceID, first, err)
		}
		for i, m := range ss {
			if at := m.At.UnixMilli(); at >= from && at < to {
				ks = append(ks, keyed{m, id, i})
			}
		}
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	flush()
	if legacy {
		slices.SortStableFunc(out, func(a, b fleet.Sample) int { return a.At.Compare(b.At) })
	}
	if len(out) > limit {
		out = out[:limit]
	}
	if out == nil {
		out = []fleet.Sample{}
	}
	return out, nil
}

// DropHistory implements fleet.HistoryDropper: it drops every partition
// whose period ended at or before before and returns how many samples they
// held.
func (s *Store) DropHistory(ctx context.Context, before time.Time) (int64, error) {
	if err := s.LockLost(); err != nil {
		return 0, err
	}
	if err := s.loadParts(ctx); err != nil {
		return 0, err
	}
	cut := before.UnixMilli()
	s.hist.mu.Lock()
	var old []hpart
	for _, p := range s.hist.parts {
		if p.to <= cut {
			old = append(old, p)
		}
	}
	s.hist.mu.Unlock()
	var total int64
	for _, p := range old {
		n, err := s.dropPart(ctx, p)
		total += n
		if err != nil {
			return total, err
		}
	}
	if len(old) > 0 {
		return total, s.loadParts(ctx)
	}
	return total, nil
}

// dropPart counts and drops one partition. A short lock timeout keeps the
// drop from queueing reads behind it for long: it is retried next time.
func (s *Store) dropPart(ctx context.Context, p hpart) (int64, error) {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '5s'`); err != nil {
		return 0, err
	}
	name := pgx.Identifier{partName(p.from)}.Sanitize()
	// Lock the partition first, so that the count is what the drop removes.
	if _, err := tx.Exec(ctx, `LOCK TABLE `+name+` IN ACCESS EXCLUSIVE MODE`); err != nil {
		return 0, err
	}
	var n int64
	if err := tx.QueryRow(ctx, `SELECT coalesce(sum(n), 0) FROM `+name).Scan(&n); err != nil {
		return 0, err
	}
	if _, err := tx.Exec(ctx, `DROP TABLE `+name); err != nil {
		return 0, err
	}
	if _, err := tx.Exec(ctx, `DELETE FROM history_compacted WHERE from_ms = $1`, p.from); err != nil {
		return 0, err
	}
	return n, tx.Commit(ctx)
}

// PruneHistory implements fleet.Store: it deletes at most limit samples
// older than before, first from the legacy table, then from the rows
// starting before it (those of the partition before falls in, once
// DropHistory dropped the older ones): a row wholly older is deleted, a
// packed row reaching past before is rewritten without its older samples.
func (s *Store) PruneHistory(ctx context.Context, before time.Time, limit int) (int64, error) {
	if err := s.LockLost(); err != nil {
		return 0, err
	}
	var total int64
	s.hist.mu.Lock()
	legacy := s.hist.legacy
	s.hist.mu.Unlock()
	if legacy {
		n, err := s.Samples.PruneHistory(ctx, before, limit)
		if err != nil || n >= int64(limit) {
			return n, err
		}
		total = n
		var left bool
		if err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM samples)`).Scan(&left); err != nil {
			return total, err
		}
		s.hist.mu.Lock()
		s.hist.legacy = left
		s.hist.mu.Unlock()
	}
	cut := before.UnixMilli()
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return total, err
	}
	defer tx.Rollback(ctx)
	rows, err := tx.Query(ctx, `SELECT device_id, first_at, id, n, last_at, data FROM history
		WHERE first_at < $1 LIMIT $2 FOR UPDATE`, cut, int64(limit)-total)
	if err != nil {
		return total, err
	}
	type row struct {
		dev, first, id, last int64
		n                    int32
		data                 []byte
	}
	var rs []row
	for rows.Next() {
		var r row
		if err := rows.Scan(&r.dev, &r.first, &r.id, &r.n, &r.last, &r.data); err != nil {
			rows.Close()
			return total, err
		}
		rs = append(rs, r)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return total, err
	}
	var q pgx.Batch
	for _, r := range rs {
		left := int64(limit) - total
		if left <= 0 {
			break
		}
		if r.last < cut && int64(r.n) <= left {
			q.Queue(`DELETE FROM history WHERE device_id = $1 AND first_at = $2 AND id = $3`, r.dev, r.first, r.id)
			total += int64(r.n)
			continue
		}
		ss, err := histcodec.Decode(r.data, uint64(r.dev))
		if err != nil {
			return total, fmt.Errorf("history of device %d at %d: %w", r.dev, r.first, err)
		}
		k := 0 // samples are in time order within a row
		for k < len(ss) && int64(k) < left && ss[k].At.UnixMilli() < cut {
			k++
		}
		total += int64(k)
		if k == len(ss) {
			q.Queue(`DELETE FROM history WHERE device_id = $1 AND first_at = $2 AND id = $3`, r.dev, r.first, r.id)
			continue
		}
		rest := ss[k:]
		q.Queue(`UPDATE history SET first_at = $4, n = $5, data = $6 WHERE device_id = $1 AND first_at = $2 AND id = $3`,
			r.dev, r.first, r.id, rest[0].At.UnixMilli(), int32(len(rest)), histcodec.Encode(rest))
	}
	if q.Len() > 0 {
		if err := tx.SendBatch(ctx, &q).Close(); err != nil {
			return 0, err
		}
	}
	return total, tx.Commit(ctx)
}

// CompactHistory packs every partition whose period ended more than
// closeGrace before now and returns how many it packed. A partition is
// packed into a new table, not attached, that nothing reads: each device's
// rows into one row, in chunks of devices, then its index is built. One
// transaction then swaps it in for the partition, with the rows written to
// the partition meanwhile (late samples) copied as they are, and records
// the partition as compacted. A crash before the swap leaves a partial new
// table that the next call replaces; so a crash loses and duplicates
// nothing. One node compacts at a time; while a partition is packed,
// retention leaves it alone.
func (s *Store) CompactHistory(ctx context.Context, now time.Time) (int, error) {
	if err := s.LockLost(); err != nil {
		return 0, err
	}
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return 0, err
	}
	defer conn.Release()
	var ok bool
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1 # `+schemaSalt+`)`, int64(compactLockKey)).Scan(&ok); err != nil || !ok {
		return 0, err // another node is at it
	}
	defer conn.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock($1 # `+schemaSalt+`)`, int64(compactLockKey))
	if err := s.loadParts(ctx); err != nil {
		return 0, err
	}
	done := map[int64]bool{}
	rows, err := s.pool.Query(ctx, `SELECT from_ms FROM history_compacted`)
	if err != nil {
		return 0, err
	}
	for rows.Next() {
		var f int64
		if err := rows.Scan(&f); err != nil {
			rows.Close()
			return 0, err
		}
		done[f] = true
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, err
	}
	cutoff := now.Add(-closeGrace).UnixMilli()
	s.hist.mu.Lock()
	var todo []hpart
	for _, p := range s.hist.parts {
		if p.to <= cutoff && !done[p.from] {
			todo = append(todo, p)
		}
	}
	s.hist.mu.Unlock()
	n := 0
	for _, p := range todo {
		if err := s.compactPart(ctx, p); err != nil {
			return n, fmt.Errorf("compacting %s: %w", partName(p.from), err)
		}
		n++
	}
	return n, nil
}

// packedName is the table partition from is packed into before the swap.
func packedName(from int64) string {
	return "history_packing_" + strings.TrimPrefix(partName(from), "history_")
}

// compactStopAfter, if positive, stops a compaction after that many chunks
// as a crash would (tests).
var compactStopAfter = 0

var errCompactStopped = errors.New("compaction stopped")

// compactPart packs partition p into a new table and swaps it in. Each
// step reports to the upkeep observer: history_pack (a chunk; items: rows
// read), history_index, history_swap (items: rows replaced).
func (s *Store) compactPart(ctx context.Context, p hpart) error {
	old, packed := pgx.Identifier{partName(p.from)}.Sanitize(), pgx.Identifier{packedName(p.from)}.Sanitize()
	if _, err := s.pool.Exec(ctx, `DROP TABLE IF EXISTS `+packed); err != nil {
		return err
	}
	if _, err := s.pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE %s (LIKE history INCLUDING DEFAULTS,
		CHECK (first_at >= %d AND first_at < %d))`, packed, p.from, p.to)); err != nil {
		return err
	}
	// What the copy reads: the rows up to the last ID now.
	var maxID, count, samples int64
	if err := s.pool.QueryRow(ctx, `SELECT coalesce(max(id), 0), count(*), coalesce(sum(n), 0) FROM `+old).Scan(&maxID, &count, &samples); err != nil {
		return err
	}
	last := int64(math.MinInt64)
	for chunk := 1; ; chunk++ {
		if compactStopAfter > 0 && chunk > compactStopAfter {
			return errCompactStopped
		}
		start := time.Now()
		more, next, rows, err := s.packChunk(ctx, old, packed, last, maxID)
		s.reportUpkeep("history_pack", rows, start, err)
		if err != nil {
			return err
		}
		if !more {
			break
		}
		last = next
	}
	start := time.Now()
	_, err := s.pool.Exec(ctx, `CREATE INDEX ON `+packed+` (device_id, first_at)`)
	s.reportUpkeep("history_index", 0, start, err)
	if err != nil {
		return err
	}
	start = time.Now()
	err = s.swapPacked(ctx, p, old, packed, maxID, count, samples)
	s.reportUpkeep("history_swap", count, start, err)
	return err
}

// packChunk packs the rows (up to maxID) of about compactChunk rows' worth
// of devices after last into packed, in one transaction. It returns whether
// devices remain, the chunk's last device and how many rows it read.
func (s *Store) packChunk(ctx context.Context, old, packed string, last, maxID int64) (more bool, hi, read int64, err error) {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return false, 0, read, err
	}
	defer tx.Rollback(ctx)
	hi = math.MaxInt64
	err = tx.QueryRow(ctx, `SELECT device_id FROM `+old+` WHERE device_id > $1 ORDER BY device_id OFFSET $2 LIMIT 1`,
		last, compactChunk).Scan(&hi)
	if more = err == nil; err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return false, 0, read, err
	}
	rows, err := tx.Query(ctx, `SELECT device_id, id, data FROM `+old+` WHERE device_id > $1 AND device_id <= $2 AND id <= $3
		ORDER BY device_id, first_at, id`, last, hi, maxID)
	if err != nil {
		return false, 0, read, err
	}
	var (
		pDev, pFirst, pLast, pID []int64
		pN                       []int32
		pData                    [][]byte
		cur                      = int64(math.MinInt64)
		group                    []keyed
		maxRow                   int64
	)
	pack := func() {
		if len(group) > 0 {
			sortKeyed(group)
			ss := make([]fleet.Sample, len(group))
			for i := range group {
				ss[i] = group[i].Sample
			}
			pDev, pFirst, pLast = append(pDev, cur), append(pFirst, ss[0].At.UnixMilli()), append(pLast, ss[len(ss)-1].At.UnixMilli())
			pID, pN, pData = append(pID, maxRow), append(pN, int32(len(ss))), append(pData, histcodec.Encode(ss))
		}
		group, maxRow = group[:0], 0
	}
	for rows.Next() {
		var dev, id int64
		var data []byte
		if err := rows.Scan(&dev, &id, &data); err != nil {
			rows.Close()
			return false, 0, read, err
		}
		read++
		if dev != cur {
			pack()
			cur = dev
		}
		ss, err := histcodec.Decode(data, uint64(dev))
		if err != nil {
			rows.Close()
			return false, 0, read, fmt.Errorf("device %d row %d: %w", dev, id, err)
		}
		for i, m := range ss {
			group = append(group, keyed{m, id, i})
		}
		maxRow = max(maxRow, id)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return false, 0, read, err
	}
	pack()
	if len(pDev) > 0 {
		if _, err := tx.Exec(ctx, `INSERT INTO `+packed+` (device_id, first_at, last_at, id, n, data)
			SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::bigint[], $4::bigint[], $5::integer[], $6::bytea[])`,
			pDev, pFirst, pLast, pID, pN, pData); err != nil {
			return false, 0, read, err
		}
	}
	return more, hi, read, tx.Commit(ctx)
}

// swapPacked replaces partition old by packed in one transaction, once no
// row the copy read has changed (else it fails, and the next call packs
// again): writes to old wait for it, reads go on until the swap itself.
func (s *Store) swapPacked(ctx context.Context, p hpart, old, packed string, maxID, count, samples int64) error {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '5s'`); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `LOCK TABLE `+old+` IN EXCLUSIVE MODE`); err != nil {
		return err
	}
	var c, n int64
	if err := tx.QueryRow(ctx, `SELECT count(*), coalesce(sum(n), 0) FROM `+old+` WHERE id <= $1`, maxID).Scan(&c, &n); err != nil {
		return err
	}
	if c != count || n != samples {
		return fmt.Errorf("rows changed while packing (%d rows of %d samples, now %d of %d)", count, samples, c, n)
	}
	steps := []string{
		`INSERT INTO ` + packed + ` SELECT * FROM ` + old + ` WHERE id > ` + strconv.FormatInt(maxID, 10),
		`ALTER TABLE history DETACH PARTITION ` + old,
		`DROP TABLE ` + old,
		`ALTER TABLE ` + packed + ` RENAME TO ` + old,
		fmt.Sprintf(`ALTER TABLE history ATTACH PARTITION %s FOR VALUES FROM (%d) TO (%d)`, old, p.from, p.to),
	}
	for _, q := range steps {
		if _, err := tx.Exec(ctx, q); err != nil {
			return err
		}
	}
	if _, err := tx.Exec(ctx, `INSERT INTO history_compacted (from_ms, at) VALUES ($1, $2) ON CONFLICT DO NOTHING`,
		p.from, time.Now().UnixMilli()); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// startCompactor runs CompactHistory now and every compactEvery; errors are
// reported to the upkeep observer and retried next time.
func (s *Store) startCompactor() {
	if compactEvery <= 0 {
		return
	}
	h := &s.hist
	h.stop, h.wait = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(h.wait)
		t := time.NewTicker(compactEvery)
		defer t.Stop()
		for {
			ctx, cancel := context.WithCancel(context.Background())
			go func() {
				select {
				case <-h.stop:
					cancel()
				case <-ctx.Done():
				}
			}()
			s.CompactHistory(ctx, time.Now()) // steps and errors go to the upkeep observer
			cancel()
			select {
			case <-h.stop:
				return
			case <-t.C:
			}
		}
	}()
}

// stopCompactor stops the compactor and waits for it.
func (s *Store) stopCompactor() {
	if s.hist.stop != nil {
		close(s.hist.stop)
		<-s.hist.wait
		s.hist.stop = nil
	}
}
