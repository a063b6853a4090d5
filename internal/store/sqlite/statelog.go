package sqlite

// The state log: a push's state is appended, not written into its device's
// row. Rewriting the row in place costs a random page per push (read, then
// written whole to the WAL and again by the checkpoint) once the devices
// table outgrows the page cache, which a fleet of a million devices does
// many times over; appending fills a few pages in sequence. Each push's
// row goes to the open generation (a table state_log_<gen>, listed in
// state_logs); memory keeps, per device, where its newest row is. The merger
// closes the open generation when it is long or old enough, copies each
// device's newest row of it into `devices` in device order (chunks of
// mergeChunk, one transaction each, resting three times as long after each
// and at most mergeRate devices a second: pushes go on in between), unlists it and deletes its rows the same gentle
// way (drop.go) before it drops the table.
//
// A state is durable when its row is committed, as it was with the update in
// place. After a crash, open reads where each device's newest row is and Load
// returns those rows' values; a generation half merged is merged again. A
// device's state is read from its newest row while it is in the log, else
// from `devices`.

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/drover/drover/internal/fleet"
)

var (
	// A generation is closed and merged once it has logRotateRows rows, or
	// logRotateAge after it opened if it has any, or once its devices have
	// started pushing again: logRotateRewrites rows, and a hundredth of its
	// rows, were rewritten. A rewrite lands on a random page of the
	// generation (a million rows of a kilobyte for a million devices): in
	// the fleet test the pushes of the seconds between the start of the
	// fleet's second round and the check that closed the first generation
	// wrote 50 MB/s instead of 35 and their commits slowed.
	logRotateRows     = int64(1_000_000)
	logRotateAge      = 10 * time.Minute
	logRotateRewrites = int64(1000)
	// logCheckEvery is how often the merger looks; 0: never by itself
	// (tests call MergeStateLog).
	logCheckEvery = time.Second
	// mergeChunk is how many devices one merge transaction updates: 200
	// hold the writer (and the pushes' commits) for about 15 ms.
	mergeChunk = 200
	// mergeRest is how long the merger rests after each transaction, in
	// multiples of the transaction's time: the writer it shares with the
	// pushes' commits is the merger's a quarter of the time at most.
	mergeRest = 3
	// mergeRate caps the devices merged per second. A merged device
	// rewrites its row of `devices` (about a kilobyte with its state), which
	// reaches the disk twice (the WAL, then the checkpoint): unpaced, a
	// million devices wrote 2 GB in 20 s, and the pushes' commits waited for
	// their fsyncs behind it. 10,000/s merges a generation of a million rows
	// in 100 s, half the time a fleet of a million at 200 s takes to fill one.
	mergeRate = 10_000
)

// ref locates a device's newest log row: generation << 40 | rowid; 0: none,
// `devices` is current.
type ref uint64

func mkRef(gen, rowid int64) ref { return ref(uint64(gen)<<40 | uint64(rowid)) }
func (r ref) gen() int64         { return int64(r >> 40) }
func (r ref) rowid() int64       { return int64(r & (1<<40 - 1)) }

type stateLog struct {
	// mu is held by Commit throughout and by the merger to open a
	// generation or drop one: no commit writes to a generation being
	// closed or dropped.
	mu   sync.Mutex
	gens []int64 // listed generations, ascending; the last is open
	rows int64   // rows written to the open generation, rewrites included
	// rewrites of rows of the open generation (a device pushing again)
	rewrites int64
	opened   time.Time
	// unlisted: open found tables of generations merged but not dropped.
	unlisted bool

	refMu  sync.RWMutex
	latest []ref // by device ID

	// kept is the newest logged states read at open, until Load takes them
	// or a commit makes them stale; mu guards it.
	kept *logOverlay

	opMu       sync.Mutex // serialises merges (and Load, loadlog.go)
	stop, done chan struct{}
}

func logTable(gen int64) string { return "state_log_" + strconv.FormatInt(gen, 10) }

const logColumns = `device_id, firmware, last_seen, seq, applied_version, config_error, state`

func createLogTable(ctx context.Context, tx *sql.Tx, gen int64) error {
	if _, err := tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS `+logTable(gen)+` (device_id INTEGER NOT NULL,
		firmware TEXT NOT NULL, last_seen INTEGER NOT NULL, seq INTEGER NOT NULL, applied_version INTEGER NOT NULL,
		config_error TEXT NOT NULL, state BLOB)`); err != nil {
		return err
	}
	_, err := tx.ExecContext(ctx, `INSERT OR IGNORE INTO state_logs (gen) VALUES (?)`, gen)
	return err
}

// loadStateLog lists the generations, opens one if there is none, reads
// where each device's newest row is, and starts the merger.
func (s *Store) loadStateLog(ctx context.Context, merger bool) error {
	l := &s.states
	rows, err := s.w.QueryContext(ctx, `SELECT gen FROM state_logs ORDER BY gen`)
	if err != nil {
		return err
	}
	for rows.Next() {
		var g int64
		if err := rows.Scan(&g); err != nil {
			rows.Close()
			return err
		}
		l.gens = append(l.gens, g)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	// A server's open keeps the newest states for Load (loadlog.go).
	var kept *logOverlay
	if merger {
		maxID, err := s.maxDeviceID(ctx)
		if err != nil {
			return err
		}
		kept = newLogOverlay(false, maxID)
	}
	for _, g := range l.gens {
		n, err := s.readLog(ctx, g, kept, l.set)
		if err != nil {
			return err
		}
		l.rows = n // the last one's count remains: the open generation
	}
	l.kept = kept
	if len(l.gens) == 0 {
		if err := inTx(ctx, s.w, func(tx *sql.Tx) error { return createLogTable(ctx, tx, 1) }); err != nil {
			return err
		}
		l.gens, l.rows, l.rewrites = []int64{1}, 0, 0
	}
	l.opened = time.Now()
	names, err := s.tablesLike(ctx, "state_log_")
	if err != nil {
		return err
	}
	l.unlisted = len(names) > len(l.gens)
	if merger && logCheckEvery > 0 {
		l.stop, l.done = make(chan struct{}), make(chan struct{})
		go s.merger(l.stop, l.done)
	}
	return nil
}

// set records id's newest row; refMu is taken.
func (l *stateLog) set(id uint64, r ref) {
	l.refMu.Lock()
	l.setLocked(id, r)
	l.refMu.Unlock()
}

func (l *stateLog) setLocked(id uint64, r ref) {
	if id >= uint64(len(l.latest)) {
		if r == 0 {
			return
		}
		n := max(int(id)+1, 2*len(l.latest), 1024)
		grown := make([]ref, n)
		copy(grown, l.latest)
		l.latest = grown
	}
	l.latest[id] = r
}

func (l *stateLog) get(id uint64) ref {
	l.refMu.RLock()
	defer l.refMu.RUnlock()
	if id >= uint64(len(l.latest)) {
		return 0
	}
	return l.latest[id]
}

func (s *Store) stopStateLog() {
	l := &s.states
	if l.stop != nil {
		close(l.stop)
		<-l.done
		l.stop = nil
	}
}

// appendStates writes a batch's states to the open generation within tx and
// returns their rows; l.mu is held. A device whose newest row is already in
// the open generation has that row rewritten: the log holds one row per
// device and generation, so a device pushing often (or a hostile one within
// its quota) does not grow it.
func (s *Store) appendStates(ctx context.Context, conn *sql.Conn, states []fleet.StateRecord) ([]ref, error) {
	if len(states) == 0 {
		return nil, nil
	}
	l := &s.states
	gen := l.gens[len(l.gens)-1]
	refs := make([]ref, len(states))
	rowCtx := context.WithoutCancel(ctx)
	err := conn.Raw(func(dc any) error {
		if err := txAlive(ctx); err != nil {
			return err
		}
		ins, err := prepareRaw(ctx, dc, `INSERT INTO `+logTable(gen)+` (`+logColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?)`, 7)
		if err != nil {
			return err
		}
		defer ins.close()
		var upd *rawStmt
		defer func() { upd.close() }()
		for i, r := range states {
			if err := chunkCheck(ctx, i); err != nil {
				return err
			}
			if old := l.get(r.DeviceID); old != 0 && old.gen() == gen {
				if upd == nil {
					if upd, err = prepareRaw(ctx, dc, `UPDATE `+logTable(gen)+` SET firmware = ?, last_seen = ?, seq = ?,
						applied_version = ?, config_error = ?, state = ? WHERE rowid = ?`, 7); err != nil {
						return err
					}
				}
				setStateArgs(upd.args[:6], r)
				upd.args[6].Value = old.rowid()
				if _, err := upd.run(rowCtx); err != nil {
					return fmt.Errorf("state of device %d: %w", r.DeviceID, err)
				}
				refs[i] = old
				continue
			}
			id, err := idValue(r.DeviceID)
			if err != nil {
				return fmt.Errorf("state of device %d: %w", r.DeviceID, err)
			}
			ins.args[0].Value = id
			setStateArgs(ins.args[1:], r)
			res, err := ins.run(rowCtx)
			if err != nil {
				return fmt.Errorf("state of device %d: %w", r.DeviceID, err)
			}
			rowid, err := res.LastInsertId()
			if err != nil {
				return err
			}
			refs[i] = mkRef(gen, rowid)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return refs, nil
}

// setStateArgs sets a state row's columns after device_id, in logColumns'
// order.
func setStateArgs(a []driver.NamedValue, r fleet.StateRecord) {
	a[0].Value, a[1].Value, a[2].Value = r.Firmware, lastSeen(r.LastSeen), int64(r.Seq)
	a[3].Value, a[4].Value, a[5].Value = r.AppliedVersion, r.ConfigError, []byte(r.State)
}

// patchFirmware keeps a re-registered device's newest log row in step with
// the firmware its registration wrote to `devices`, so that merging or
// replaying that row does not bring the older firmware back; l.mu is held.
func (s *Store) patchFirmware(ctx context.Context, tx *sql.Tx, devices []fleet.DeviceRecord) error {
	for _, d := range devices {
		if r := s.states.get(d.ID); r != 0 {
			if _, err := tx.ExecContext(ctx, `UPDATE `+logTable(r.gen())+` SET firmware = ? WHERE rowid = ?`, d.Firmware, r.rowid()); err != nil {
				return fmt.Errorf("device %d: %w", d.ID, err)
			}
		}
	}
	return nil
}

// committed records the rows of a committed batch; l.mu is held.
func (l *stateLog) committed(states []fleet.StateRecord, refs []ref) {
	l.kept = nil
	if len(refs) == 0 {
		return
	}
	l.refMu.Lock()
	for i, r := range states {
		if r.DeviceID < uint64(len(l.latest)) && l.latest[r.DeviceID] == refs[i] {
			l.rewrites++
		}
		l.setLocked(r.DeviceID, refs[i])
	}
	l.refMu.Unlock()
	l.rows += int64(len(refs))
}

// due says whether the merger has work: a generation to close, closed ones
// to merge, or unlisted tables to drop; l.mu is held.
func (l *stateLog) due() bool {
	return l.unlisted || len(l.gens) > 1 || l.rows >= logRotateRows ||
		(l.rewrites >= logRotateRewrites && l.rewrites*100 >= l.rows) ||
		(l.rows > 0 && time.Since(l.opened) >= logRotateAge)
}

// logged reads the columns of a device's newest log row; ok is false when it
// has none (or its generation was dropped meanwhile: `devices` has it then).
func (s *Store) logged(ctx context.Context, id uint64, cols string, dest ...any) (bool, error) {
	r := s.states.get(id)
	if r == 0 {
		return false, nil
	}
	err := s.r.QueryRowContext(ctx, `SELECT `+cols+` FROM `+logTable(r.gen())+` WHERE rowid = ?`, r.rowid()).Scan(dest...)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, sql.ErrNoRows), strings.Contains(err.Error(), "no such table"):
		return false, nil
	}
	return false, err
}

// merger merges closed generations every logCheckEvery.
func (s *Store) merger(stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	if !s.holdUpkeep(stop) {
		return
	}
	t := time.NewTicker(logCheckEvery)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		l := &s.states
		l.mu.Lock()
		due := l.due()
		l.mu.Unlock()
		if !due {
			continue
		}
		ctx, cancel := untilStop(stop)
		// A failed merge leaves the generation listed: the next tick
		// merges it again (as the archiver does with partitions).
		s.MergeStateLog(ctx)
		cancel()
	}
}

// MergeStateLog closes the open generation if it has rows, then merges every
// closed one into `devices` and drops it.
func (s *Store) MergeStateLog(ctx context.Context) error {
	l := &s.states
	l.opMu.Lock()
	defer l.opMu.Unlock()
	l.mu.Lock()
	if l.rows > 0 {
		next := l.gens[len(l.gens)-1] + 1
		if err := inTx(ctx, s.w, func(tx *sql.Tx) error { return createLogTable(ctx, tx, next) }); err != nil {
			l.mu.Unlock()
			return err
		}
		l.gens, l.rows, l.rewrites, l.opened = append(l.gens, next), 0, 0, time.Now()
	}
	closed := l.gens[: len(l.gens)-1 : len(l.gens)-1]
	l.mu.Unlock()
	for _, g := range closed {
		if err := s.mergeGen(ctx, g); err != nil {
			return fmt.Errorf("state log %d: %w", g, err)
		}
	}
	return s.dropUnlistedLogs(ctx)
}

// mergeGen copies the newest row of each device whose newest row is in
// generation g into `devices`, in device order, then drops g.
func (s *Store) mergeGen(ctx context.Context, g int64) error {
	l := &s.states
	type item struct {
		id    uint64
		rowid int64
	}
	upd := `UPDATE devices SET (firmware, last_seen, seq, applied_version, config_error, state) =
		(SELECT firmware, last_seen, seq, applied_version, config_error, state FROM ` + logTable(g) + ` WHERE rowid = ?) WHERE id = ?`
	var next uint64
	began, merged := time.Now(), 0
	for {
		var chunk []item
		l.refMu.RLock()
		for ; next < uint64(len(l.latest)) && len(chunk) < mergeChunk; next++ {
			if r := l.latest[next]; r != 0 && r.gen() == g {
				chunk = append(chunk, item{next, r.rowid()})
			}
		}
		more := next < uint64(len(l.latest))
		l.refMu.RUnlock()
		if len(chunk) > 0 {
			start := time.Now()
			err := inTx(ctx, s.w, func(tx *sql.Tx) error {
				st, err := tx.PrepareContext(ctx, upd)
				if err != nil {
					return err
				}
				defer st.Close()
				for _, it := range chunk {
					if _, err := st.ExecContext(context.WithoutCancel(ctx), it.rowid, it.id); err != nil {
						return err
					}
				}
				return nil
			})
			s.reportUpkeep("state_log_merge", int64(len(chunk)), start, err)
			if err != nil {
				return err
			}
			merged += len(chunk)
			if more {
				rest := time.Duration(mergeRest) * time.Since(start)
				if mergeRate > 0 {
					rest = max(rest, time.Until(began.Add(time.Duration(merged)*time.Second/time.Duration(mergeRate))))
				}
				select {
				case <-ctx.Done():
				case <-time.After(rest):
				}
			}
		}
		if !more {
			break
		}
		if err := ctx.Err(); err != nil {
			return err
		}
	}
	// Every device whose newest row is in g has it in `devices` now; rows
	// that commits added to g meanwhile cannot exist (g was closed before).
	// Unlisting g is one small transaction; its rows are deleted after,
	// gently (a crash meanwhile leaves an unlisted table that the next
	// merge drops: open does not read it).
	start := time.Now()
	l.mu.Lock()
	err := inTx(ctx, s.w, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `DELETE FROM state_logs WHERE gen = ?`, g)
		return err
	})
	if err != nil {
		l.mu.Unlock()
		s.reportUpkeep("state_log_unlist", 0, start, err)
		return err
	}
	l.refMu.Lock()
	for i, r := range l.latest {
		if r != 0 && r.gen() == g {
			l.latest[i] = 0
		}
	}
	l.refMu.Unlock()
	i := 0
	for ; i < len(l.gens) && l.gens[i] != g; i++ {
	}
	if i < len(l.gens) {
		l.gens = append(l.gens[:i:i], l.gens[i+1:]...)
	}
	l.mu.Unlock()
	s.reportUpkeep("state_log_unlist", int64(merged), start, nil)
	return s.dropGently(ctx, "state_log_drop", logTable(g))
}

// dropUnlistedLogs drops the tables of generations that were merged and
// unlisted but not dropped yet (a crash or a stop came between).
func (s *Store) dropUnlistedLogs(ctx context.Context) error {
	names, err := s.tablesLike(ctx, "state_log_")
	if err != nil {
		return err
	}
	l := &s.states
	l.mu.Lock()
	listed := map[string]bool{}
	for _, g := range l.gens {
		listed[logTable(g)] = true
	}
	l.mu.Unlock()
	for _, n := range names {
		if !listed[n] {
			if err := s.dropGently(ctx, "state_log_drop", n); err != nil {
				return err
			}
		}
	}
	l.mu.Lock()
	l.unlisted = false
	l.mu.Unlock()
	return nil
}
