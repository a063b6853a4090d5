package sqlite

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/drover/drover/internal/fleet"
	"github.com/drover/drover/internal/store/internal/timeorder"
)

// History lives in time partitions: one table per partitionPeriod of sample
// time (samples_<start unix ms>), listed in history_parts. A push appends to
// the open partition in the main database, which has no index: no (device,
// time) B-tree insert lands on a random page per push. Once a partition's
// period is over (plus closeGrace) the archiver copies it, sorted by (device,
// time), into a WITHOUT ROWID table of the same name in the history archive
// (<name>-history.db beside the database) on its own connection, so the
// sort never holds the main database's writer, then drops it from the main
// database. Reads by device are range lookups in archived partitions and
// scans of the (at most two) open ones; retention drops whole partitions.
// The table `samples` of schema versions before 40 stays as the legacy
// partition (indexed, read and pruned as before).

var (
	// partitionPeriod is how much sample time one partition covers.
	partitionPeriod = int64(10 * time.Minute / time.Millisecond)
	// closeGrace is how long after its period a partition is archived.
	closeGrace = time.Minute
	// archiveEvery is how often the archiver looks for closed partitions; 0:
	// never by itself (tests call ArchiveClosedPartitions).
	archiveEvery = 30 * time.Second
	// archiveChunkRows is about how many rows one transaction of the
	// archive's copy sorts, archiveStageRows how many one transaction of
	// its first step reads (copyToArchive).
	archiveChunkRows = int64(250_000)
	archiveStageRows = int64(100_000)
)

type part struct {
	name     string
	from, to int64 // unix ms, [from, to)
	archived bool
	// sealed: being archived; new samples of its period go to the legacy
	// table (as they do once it is archived).
	sealed bool
	// leftover: archived, but its table in the main database is not
	// dropped yet (a crash or a stop came between).
	leftover bool
}

// history is the store's cache of history_parts, updated after the writer
// connection's transactions commit, and the archive's connections.
type history struct {
	mu     sync.Mutex
	parts  []part // by from
	legacy bool   // the legacy table may hold samples

	opMu sync.Mutex // serialises archiving and dropping partitions
	aw   *sql.DB    // archive writer (one connection; the main database attached read-only as "live")
	ar   *sql.DB    // archive readers

	stop chan struct{}
	done chan struct{}
}

const sampleColumns = `device_id, at, seq, uptime, cpu, mem_used, mem_total, disk_used, disk_total,
	temperature, rx_bytes, tx_bytes, rssi, rsrp, rsrq, sinr`

func partName(from int64) string {
	return "samples_" + strings.Replace(strconv.FormatInt(from, 10), "-", "m", 1)
}

// archivePath is where the history archive of the database at path lives.
func archivePath(path string) string {
	return strings.TrimSuffix(path, filepath.Ext(path)) + "-history.db"
}

// loadHistory opens the archive, reads the partition list and starts the
// archiver.
func (s *Store) loadHistory(ctx context.Context, path, sync string, archiver bool) error {
	h := &s.hist
	apath := archivePath(path)
	q := url.Values{}
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "synchronous("+sync+")")
	q.Add("_pragma", "busy_timeout(10000)")
	q.Add("_txlock", "immediate")
	aw, err := sql.Open("sqlite", "file:"+uriPath(apath)+"?"+q.Encode())
	if err != nil {
		return err
	}
	aw.SetMaxOpenConns(1)
	aw.SetMaxIdleConns(1)
	aw.SetConnMaxLifetime(0)
	h.aw = aw
	if _, err := aw.ExecContext(ctx, `ATTACH DATABASE ? AS live`, "file:"+uriPath(path)+"?mode=ro"); err != nil {
		return fmt.Errorf("history archive: %w", err)
	}
	rq := url.Values{}
	rq.Add("_pragma", "busy_timeout(10000)")
	rq.Add("_pragma", "query_only(1)")
	if h.ar, err = sql.Open("sqlite", "file:"+uriPath(apath)+"?"+rq.Encode()); err != nil {
		return err
	}
	h.ar.SetMaxOpenConns(2)

	rows, err := s.w.QueryContext(ctx, `SELECT name, from_ms, to_ms, archived FROM history_parts ORDER BY from_ms`)
	if err != nil {
		return err
	}
	for rows.Next() {
		var p part
		if err := rows.Scan(&p.name, &p.from, &p.to, &p.archived); err != nil {
			rows.Close()
			return err
		}
		h.parts = append(h.parts, p)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	for i, p := range h.parts {
		if p.archived {
			if h.parts[i].leftover, err = s.hasTable(ctx, p.name); err != nil {
				return err
			}
		}
	}
	if err := s.w.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM samples)`).Scan(&h.legacy); err != nil {
		return err
	}
	if archiver && archiveEvery > 0 {
		h.stop, h.done = make(chan struct{}), make(chan struct{})
		go s.archiver(h.stop, h.done)
	}
	return nil
}

// closeHistory stops the archiver and closes the archive.
func (s *Store) closeHistory() error {
	h := &s.hist
	if h.stop != nil {
		close(h.stop)
		<-h.done
		h.stop = nil
	}
	var errs []error
	for _, db := range []*sql.DB{h.ar, h.aw} {
		if db != nil {
			errs = append(errs, db.Close())
		}
	}
	return errors.Join(errs...)
}

// archiver archives closed partitions every archiveEvery, from
// archiveEvery after the fleet's load (loadlog.go).
func (s *Store) archiver(stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	if !s.holdUpkeep(stop) {
		return
	}
	t := time.NewTicker(archiveEvery)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		ctx, cancel := untilStop(stop)
		s.ArchiveClosedPartitions(ctx, time.Now())
		cancel()
	}
}

// ArchiveClosedPartitions moves every partition whose period ended more than
// closeGrace before now into the archive, and finishes dropping the main
// tables of archived ones. Errors are retried on the next call. A crash
// before a partition is marked archived leaves it in the main database, and
// the next call copies it again; after, the next call drops what is left.
func (s *Store) ArchiveClosedPartitions(ctx context.Context, now time.Time) (int, error) {
	cutoff := now.Add(-closeGrace).UnixMilli()
	s.hist.mu.Lock()
	var todo []part
	for _, p := range s.hist.parts {
		if (!p.archived && p.to <= cutoff) || p.leftover {
			todo = append(todo, p)
		}
	}
	s.hist.mu.Unlock()
	n := 0
	for _, p := range todo {
		if err := s.archive(ctx, p); err != nil {
			return n, fmt.Errorf("archiving %s: %w", p.name, err)
		}
		if !p.archived {
			n++
		}
	}
	return n, nil
}

// CompactHistory is ArchiveClosedPartitions: the store's compaction of
// closed partitions (the conformance suite calls it on every backend that
// has one).
func (s *Store) CompactHistory(ctx context.Context, now time.Time) (int, error) {
	return s.ArchiveClosedPartitions(ctx, now)
}

// archive copies p into the archive, marks it archived, then drops its table
// from the main database gently (drop.go). It seals p first: samples of p's
// period committed from then on go to the legacy table, and an empty
// transaction of the writer waits out those that chose p before, so the copy
// is complete without counting p's rows on the writer.
func (s *Store) archive(ctx context.Context, p part) error {
	s.hist.opMu.Lock()
	defer s.hist.opMu.Unlock()
	if !s.listed(p) {
		return nil // dropped meanwhile
	}
	if p = s.current(p); !p.archived {
		s.seal(p, true)
		if err := s.copyToArchive(ctx, p); err != nil {
			s.seal(p, false)
			return err
		}
		if _, err := s.w.ExecContext(ctx, `UPDATE history_parts SET archived = 1 WHERE name = ?`, p.name); err != nil {
			s.seal(p, false)
			return err
		}
		s.hist.mu.Lock()
		if i := s.hist.find(p.from); i >= 0 {
			s.hist.parts[i].archived, s.hist.parts[i].sealed, s.hist.parts[i].leftover = true, false, true
		}
		s.hist.mu.Unlock()
	}
	if err := s.dropGently(ctx, "history_drop", p.name); err != nil {
		return err
	}
	s.hist.mu.Lock()
	if i := s.hist.find(p.from); i >= 0 {
		s.hist.parts[i].leftover = false
	}
	s.hist.mu.Unlock()
	return nil
}

// seal marks p sealed (or not) in the cache.
func (s *Store) seal(p part, sealed bool) {
	s.hist.mu.Lock()
	if i := s.hist.find(p.from); i >= 0 {
		s.hist.parts[i].sealed = sealed
	}
	s.hist.mu.Unlock()
}

// copyToArchive waits out the writer's transactions that may still add to
// p, then copies p, sorted by (device, time) (the B-tree is built by
// appending; n keeps the order of samples with equal times), into the
// archive. The sort of a whole 10-minute partition of a busy fleet (millions
// of rows) took one core for seconds, and sorting it by ranges of device IDs
// scanned the whole unindexed partition for each range (2.7–6.5 s of a core
// each, a dozen times for a million devices). So the copy goes in two steps
// of short transactions, resting as dropGently does after each: it reads p
// once, in rowid ranges of archiveStageRows, into a temporary table of the
// archive's connection keyed by (device range, rowid), which each range
// appends to; then it copies each device range of about archiveChunkRows
// rows, read in key order and sorted, into the archive. A copy cut short
// leaves a partial table in the archive that nothing reads (p is not marked
// archived) and the next attempt replaces; the temporary table goes with the
// connection's next copy or its end.
func (s *Store) copyToArchive(ctx context.Context, p part) error {
	if err := inTx(ctx, s.w, func(*sql.Tx) error { return nil }); err != nil {
		return err
	}
	conn, err := s.hist.aw.Conn(ctx) // the temporary table is the connection's
	if err != nil {
		return err
	}
	defer conn.Close()
	var lo, hi, first, last sql.NullInt64
	var rows int64
	if err := conn.QueryRowContext(ctx, `SELECT min(device_id), max(device_id), min(rowid), max(rowid), count(*) FROM live.`+p.name).
		Scan(&lo, &hi, &first, &last, &rows); err != nil {
		return err
	}
	const cols = `seq, uptime, cpu, mem_used, mem_total, disk_used, disk_total, temperature, rx_bytes, tx_bytes, rssi, rsrp, rsrq, sinr`
	if _, err := conn.ExecContext(ctx, `DROP TABLE IF EXISTS main.`+p.name); err != nil {
		return err
	}
	if _, err := conn.ExecContext(ctx, `CREATE TABLE main.`+p.name+` (
			device_id INTEGER NOT NULL, at INTEGER NOT NULL, n INTEGER NOT NULL, seq INTEGER NOT NULL, uptime INTEGER, cpu REAL,
			mem_used INTEGER, mem_total INTEGER, disk_used INTEGER, disk_total INTEGER, temperature REAL,
			rx_bytes INTEGER, tx_bytes INTEGER, rssi REAL, rsrp REAL, rsrq REAL, sinr REAL,
			PRIMARY KEY (device_id, at, n)) WITHOUT ROWID`); err != nil {
		return err
	}
	if rows == 0 {
		return nil
	}
	if _, err := conn.ExecContext(ctx, `DROP TABLE IF EXISTS temp.archive_stage`); err != nil {
		return err
	}
	if _, err := conn.ExecContext(ctx, `CREATE TEMP TABLE archive_stage (bucket INTEGER NOT NULL, n INTEGER NOT NULL,
			device_id INTEGER NOT NULL, at INTEGER NOT NULL, `+cols+`, PRIMARY KEY (bucket, n)) WITHOUT ROWID`); err != nil {
		return err
	}
	defer conn.ExecContext(context.WithoutCancel(ctx), `DROP TABLE IF EXISTS temp.archive_stage`)
	buckets := (rows + archiveChunkRows - 1) / archiveChunkRows
	step := (hi.Int64 - lo.Int64 + buckets) / buckets
	rest := func(start time.Time) error {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Duration(dropRest) * time.Since(start)):
			return nil
		}
	}
	for from := first.Int64; from <= last.Int64; from += archiveStageRows {
		start := time.Now()
		res, err := conn.ExecContext(ctx, `INSERT INTO temp.archive_stage SELECT (device_id - ?) / ?, rowid, device_id, at, `+cols+`
			FROM live.`+p.name+` WHERE rowid >= ? AND rowid < ?`, lo.Int64, step, from, from+archiveStageRows)
		s.reportUpkeep("history_stage", affected(res, err), start, err)
		if err != nil {
			return err
		}
		if err := rest(start); err != nil {
			return err
		}
	}
	for b := int64(0); b < buckets; b++ {
		start := time.Now()
		res, err := conn.ExecContext(ctx, `INSERT INTO main.`+p.name+` (device_id, at, n, `+cols+`)
			SELECT device_id, at, n, `+cols+` FROM temp.archive_stage WHERE bucket = ? ORDER BY device_id, at, n`, b)
		s.reportUpkeep("history_archive", affected(res, err), start, err)
		if err != nil {
			return err
		}
		if b+1 < buckets {
			if err := rest(start); err != nil {
				return err
			}
		}
	}
	return nil
}

// listed says whether p is still a partition.
func (s *Store) listed(p part) bool {
	s.hist.mu.Lock()
	defer s.hist.mu.Unlock()
	return s.hist.find(p.from) >= 0
}

// current returns p as the cache has it now (archived or not).
func (s *Store) current(p part) part {
	s.hist.mu.Lock()
	defer s.hist.mu.Unlock()
	if i := s.hist.find(p.from); i >= 0 {
		return s.hist.parts[i]
	}
	return p
}

// inTx runs f in a transaction of db and commits it.
func inTx(ctx context.Context, db *sql.DB, f func(*sql.Tx) error) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := f(tx); err != nil {
		tx.Rollback()
		return err
	}
	return tx.Commit()
}

// find returns the index of the partition starting at from, or -1; mu held.
func (h *history) find(from int64) int {
	i, ok := slices.BinarySearchFunc(h.parts, from, func(p part, from int64) int { return cmp.Compare(p.from, from) })
	if !ok {
		return -1
	}
	return i
}

// partStart is the start of the partition holding time at (unix ms).
func partStart(at int64) int64 {
	q := at / partitionPeriod
	if at%partitionPeriod < 0 {
		q--
	}
	return q * partitionPeriod
}

// insertSamples appends samples to their partitions within tx, creating the
// partitions it needs, and returns what committed must know. A late sample
// whose partition is archived already (write-back retrying after an outage)
// goes to the indexed legacy table.
// Rows are written with rowCtx, which cannot be cancelled (see Commit).
func (s *Store) insertSamples(ctx, rowCtx context.Context, conn *sql.Conn, tx *sql.Tx, samples []fleet.Sample) (w written, err error) {
	if len(samples) == 0 {
		return w, nil
	}
	// The partitions first, through tx (a new one is created in it), then
	// the rows, through raw statements on the same connection.
	tables := map[int64]string{}
	for _, m := range samples {
		from := partStart(m.At.UnixMilli())
		if _, ok := tables[from]; ok {
			continue
		}
		if tables[from], err = s.ensurePart(ctx, tx, from, &w); err != nil {
			return w, err
		}
	}
	err = conn.Raw(func(dc any) error {
		if err := txAlive(ctx); err != nil {
			return err
		}
		stmts := map[int64]*rawStmt{}
		defer func() {
			for _, st := range stmts {
				st.close()
			}
		}()
		for i, m := range samples {
			if err := chunkCheck(ctx, i); err != nil {
				return err
			}
			at := m.At.UnixMilli()
			from := partStart(at)
			st := stmts[from]
			if st == nil {
				var err error
				st, err = prepareRaw(ctx, dc, `INSERT INTO `+tables[from]+` (`+sampleColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`, 16)
				if isNoTable(err) { // archived since ensurePart looked
					w.legacy = true
					st, err = prepareRaw(ctx, dc, `INSERT INTO samples (`+sampleColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`, 16)
				}
				if err != nil {
					return err
				}
				stmts[from] = st
			}
			id, err := idValue(m.DeviceID)
			if err != nil {
				return fmt.Errorf("sample of device %d: %w", m.DeviceID, err)
			}
			a := st.args
			a[0].Value, a[1].Value, a[2].Value, a[3].Value = id, at, int64(m.Seq), intValue(m.Uptime)
			a[4].Value, a[5].Value, a[6].Value, a[7].Value = floatValue(m.CPU), intValue(m.MemUsed), intValue(m.MemTotal), intValue(m.DiskUsed)
			a[8].Value, a[9].Value, a[10].Value, a[11].Value = intValue(m.DiskTotal), floatValue(m.Temperature), counterValue(m.RxBytes), counterValue(m.TxBytes)
			a[12].Value, a[13].Value, a[14].Value, a[15].Value = floatValue(m.RSSI), floatValue(m.RSRP), floatValue(m.RSRQ), floatValue(m.SINR)
			if _, err := st.run(rowCtx); err != nil {
				return fmt.Errorf("sample of device %d: %w", m.DeviceID, err)
			}
		}
		return nil
	})
	return w, err
}

// written is what a transaction's samples changed in the partition list.
type written struct {
	created []part
	legacy  bool // samples went to the legacy table
}

// ensurePart returns the table for samples of the partition starting at
// from, creating the partition if needed.
func (s *Store) ensurePart(ctx context.Context, tx *sql.Tx, from int64, w *written) (string, error) {
	name := partName(from)
	s.hist.mu.Lock()
	i := s.hist.find(from)
	archived := i >= 0 && (s.hist.parts[i].archived || s.hist.parts[i].sealed)
	s.hist.mu.Unlock()
	switch {
	case archived:
		w.legacy = true
		return "samples", nil
	case i >= 0 || slices.ContainsFunc(w.created, func(p part) bool { return p.from == from }):
		return name, nil
	}
	if _, err := tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS `+name+` (
		device_id INTEGER NOT NULL, at INTEGER NOT NULL, seq INTEGER NOT NULL, uptime INTEGER, cpu REAL,
		mem_used INTEGER, mem_total INTEGER, disk_used INTEGER, disk_total INTEGER, temperature REAL,
		rx_bytes INTEGER, tx_bytes INTEGER, rssi REAL, rsrp REAL, rsrq REAL, sinr REAL)`); err != nil {
		return "", err
	}
	if _, err := tx.ExecContext(ctx, `INSERT OR IGNORE INTO history_parts (name, from_ms, to_ms, archived) VALUES (?, ?, ?, 0)`,
		name, from, from+partitionPeriod); err != nil {
		return "", err
	}
	w.created = append(w.created, part{name: name, from: from, to: from + partitionPeriod})
	return name, nil
}

// committed adds what a committed transaction created.
func (s *Store) committed(w written) {
	h := &s.hist
	if len(w.created) == 0 && !w.legacy {
		return
	}
	h.mu.Lock()
	h.legacy = h.legacy || w.legacy
	for _, p := range w.created {
		if h.find(p.from) < 0 {
			h.parts = append(h.parts, p)
		}
	}
	slices.SortFunc(h.parts, func(a, b part) int { return cmp.Compare(a.from, b.from) })
	h.mu.Unlock()
}

// History implements fleet.Store.
func (s *Store) History(ctx context.Context, deviceID uint64, q fleet.HistoryQuery) ([]fleet.Sample, error) {
	from, to, limit := timeorder.Bounds(q)
	s.hist.mu.Lock()
	legacy := s.hist.legacy
	var parts []part
	for _, p := range s.hist.parts {
		if p.to > from && p.from < to {
			parts = append(parts, p)
		}
	}
	s.hist.mu.Unlock()

	out := []fleet.Sample{}
	for _, p := range parts {
		if len(out) >= limit {
			break
		}
		var err error
		out, err = s.readPart(ctx, out, p, deviceID, from, to, limit-len(out))
		if err != nil {
			return nil, err
		}
	}
	if !legacy {
		return out, nil
	}
	// Legacy samples may have any time: merge, legacy first on equal times
	// (it was written before every partition), unless the legacy sample's
	// time is in a partition sealed or archived already: then it came late,
	// after that partition's samples.
	old, err := s.readSamples(ctx, nil, s.r, "samples", "rowid", deviceID, from, to, limit)
	if err != nil || len(old) == 0 {
		return out, err
	}
	late := func(at time.Time) bool {
		ms := at.UnixMilli()
		s.hist.mu.Lock()
		defer s.hist.mu.Unlock()
		i := s.hist.find(partStart(ms))
		return i >= 0 && s.hist.parts[i].to > ms && (s.hist.parts[i].archived || s.hist.parts[i].sealed)
	}
	merged := make([]fleet.Sample, 0, min(limit, len(old)+len(out)))
	i, j := 0, 0
	for len(merged) < limit && (i < len(old) || j < len(out)) {
		if j == len(out) || (i < len(old) && (old[i].At.Before(out[j].At) || old[i].At.Equal(out[j].At) && !late(old[i].At))) {
			merged = append(merged, old[i])
			i++
		} else {
			merged = append(merged, out[j])
			j++
		}
	}
	return merged, nil
}

// readPart reads a partition where it is, also when the archiver moves it
// meanwhile.
func (s *Store) readPart(ctx context.Context, out []fleet.Sample, p part, deviceID uint64, from, to int64, limit int) ([]fleet.Sample, error) {
	n := len(out)
	if !p.archived {
		res, err := s.readSamples(ctx, out, s.r, p.name, "rowid", deviceID, from, to, limit)
		if !isNoTable(err) {
			return res, err
		}
		out = out[:n] // archived (or pruned) since we looked
	}
	res, err := s.readSamples(ctx, out, s.hist.ar, p.name, "n", deviceID, from, to, limit)
	if isNoTable(err) { // pruned
		return out[:n], nil
	}
	return res, err
}

func isNoTable(err error) bool { return err != nil && strings.Contains(err.Error(), "no such table") }

// readSamples appends a device's samples of one table in [from, to), oldest
// first (equal times in order of tie), at most limit.
func (s *Store) readSamples(ctx context.Context, out []fleet.Sample, db *sql.DB, table, tie string, deviceID uint64, from, to int64, limit int) ([]fleet.Sample, error) {
	rows, err := db.QueryContext(ctx, `SELECT at, seq, uptime, cpu, mem_used, mem_total, disk_used, disk_total, temperature,
		rx_bytes, tx_bytes, rssi, rsrp, rsrq, sinr FROM `+table+` WHERE device_id = ? AND at >= ? AND at < ?
		ORDER BY at, `+tie+` LIMIT ?`, deviceID, from, to, limit)
	if err != nil {
		return out, err
	}
	defer rows.Close()
	for rows.Next() {
		var m fleet.Sample
		var at, seq int64
		var rx, tx sql.NullInt64
		if err := rows.Scan(&at, &seq, &m.Uptime, &m.CPU, &m.MemUsed, &m.MemTotal, &m.DiskUsed, &m.DiskTotal, &m.Temperature,
			&rx, &tx, &m.RSSI, &m.RSRP, &m.RSRQ, &m.SINR); err != nil {
			return out, err
		}
		m.DeviceID, m.At, m.Seq = deviceID, time.UnixMilli(at).UTC(), uint64(seq)
		if rx.Valid {
			v := uint64(rx.Int64)
			m.RxBytes = &v
		}
		if tx.Valid {
			v := uint64(tx.Int64)
			m.TxBytes = &v
		}
		out = append(out, m)
	}
	return out, rows.Err()
}

// PruneHistory implements fleet.Store: the legacy table first, then whole
// partitions that end at or before before and hold no more than what is left
// of limit are dropped; a larger one, or the one holding before, loses its
// oldest rows.
func (s *Store) PruneHistory(ctx context.Context, before time.Time, limit int) (int64, error) {
	cut := before.UnixMilli()
	var total int64
	s.hist.mu.Lock()
	legacy := s.hist.legacy
	s.hist.mu.Unlock()
	if legacy {
		n, err := s.pruneTable(ctx, "samples", cut, limit)
		if err != nil {
			return n, err
		}
		total = n
	}
	for _, p := range s.partsBefore(cut) {
		left := limit - int(total)
		if left <= 0 {
			break
		}
		if p.to <= cut {
			n, err := s.countPart(ctx, p)
			if err != nil {
				return total, err
			}
			if n <= int64(left) {
				if err := s.dropPart(ctx, p); err != nil {
					return total, err
				}
				total += n
				continue
			}
		}
		var n int64
		var err error
		if p.archived {
			n, err = s.pruneArchived(ctx, p.name, cut, left)
		} else {
			n, err = s.prunePart(ctx, p, cut, left)
		}
		total += n
		if err != nil {
			return total, err
		}
	}
	return total, nil
}

// DropHistory implements fleet.HistoryDropper: it drops every partition that
// ends at or before before, whatever its size.
func (s *Store) DropHistory(ctx context.Context, before time.Time) (int64, error) {
	cut := before.UnixMilli()
	var total int64
	for _, p := range s.partsBefore(cut) {
		if p.to > cut {
			break
		}
		n, err := s.countPart(ctx, p)
		if err != nil {
			return total, err
		}
		if err := s.dropPart(ctx, p); err != nil {
			return total, err
		}
		total += n
	}
	return total, nil
}

func (s *Store) partsBefore(cut int64) []part {
	s.hist.mu.Lock()
	defer s.hist.mu.Unlock()
	var parts []part
	for _, p := range s.hist.parts {
		if p.from < cut {
			parts = append(parts, p)
		}
	}
	return parts
}

func (s *Store) countPart(ctx context.Context, p part) (n int64, err error) {
	db := s.r
	if p.archived {
		db = s.hist.ar
	}
	err = db.QueryRowContext(ctx, `SELECT count(*) FROM `+p.name).Scan(&n)
	if isNoTable(err) { // a crash between dropping it from the archive and from history_parts
		return 0, nil
	}
	return n, err
}

// dropPart drops a partition: from the archive first, then from the list
// (a crash between leaves a listed partition without a table, read as empty).
func (s *Store) dropPart(ctx context.Context, p part) error {
	s.hist.opMu.Lock()
	defer s.hist.opMu.Unlock()
	if !s.listed(p) {
		return nil
	}
	p = s.current(p)
	if p.archived {
		if _, err := s.hist.aw.ExecContext(ctx, `DROP TABLE IF EXISTS main.`+p.name); err != nil {
			return err
		}
	}
	if err := inTx(ctx, s.w, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `DROP TABLE IF EXISTS `+p.name); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, `DELETE FROM history_parts WHERE name = ?`, p.name)
		return err
	}); err != nil {
		return err
	}
	s.hist.mu.Lock()
	if i := s.hist.find(p.from); i >= 0 {
		s.hist.parts = slices.Delete(s.hist.parts, i, i+1)
	}
	s.hist.mu.Unlock()
	return nil
}

// prunePart prunes a partition not archived when it was listed; the archiver
// does not copy it meanwhile.
func (s *Store) prunePart(ctx context.Context, p part, cut int64, limit int) (int64, error) {
	s.hist.opMu.Lock()
	defer s.hist.opMu.Unlock()
	if p = s.current(p); p.archived {
		return s.pruneArchived(ctx, p.name, cut, limit)
	}
	return s.pruneTable(ctx, p.name, cut, limit)
}

// pruneArchived deletes at most limit samples of an archived partition older
// than cut, oldest first.
func (s *Store) pruneArchived(ctx context.Context, table string, cut int64, limit int) (int64, error) {
	res, err := s.hist.aw.ExecContext(ctx, `DELETE FROM main.`+table+` WHERE (device_id, at, n) IN
		(SELECT device_id, at, n FROM main.`+table+` WHERE at < ? ORDER BY at, n LIMIT ?)`, cut, limit)
	if isNoTable(err) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// pruneTable deletes at most limit samples of table older than cut (unix ms).
// Samples are appended in time order, so rowids grow with time: it finds the
// first rowid at or after cut by binary search on the primary key, with no
// index on time to maintain.
func (s *Store) pruneTable(ctx context.Context, table string, cut int64, limit int) (int64, error) {
	cutoff, err := s.firstRowidFrom(ctx, table, cut)
	if err != nil {
		return 0, err
	}
	res, err := s.w.ExecContext(ctx, `DELETE FROM `+table+` WHERE rowid IN (SELECT rowid FROM `+table+` WHERE rowid < ? ORDER BY rowid LIMIT ?)`,
		cutoff, limit)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// firstRowidFrom returns the smallest rowid of table whose sample is at or
// after at (max rowid + 1 when there is none).
func (s *Store) firstRowidFrom(ctx context.Context, table string, at int64) (int64, error) {
	var lo, hi sql.NullInt64
	if err := s.r.QueryRowContext(ctx, `SELECT min(rowid), max(rowid) FROM `+table).Scan(&lo, &hi); err != nil {
		return 0, err
	}
	if !lo.Valid {
		return 0, nil
	}
	return timeorder.FirstFrom(lo.Int64, hi.Int64, at, func(m int64) (rowid, t int64, ok bool, err error) {
		err = s.r.QueryRowContext(ctx, `SELECT rowid, at FROM `+table+` WHERE rowid >= ? ORDER BY rowid LIMIT 1`, m).Scan(&rowid, &t)
		if errors.Is(err, sql.ErrNoRows) {
			return 0, 0, false, nil
		}
		return rowid, t, err == nil, err
	})
}
