package sqlite

// Load reads the devices table, and each device's newest state where it
// is in the state log (statelog.go). A row by row lookup in the log costs a
// query per device (about 30 µs of CPU each for a million of them); the log
// is read whole instead, in its storage order, into memory, and each device
// row read is amended from there. A server's open reads the log anyway to
// learn where each device's newest row is, and keeps what Load needs
// (without the state documents) until Load takes it.

import (
	"context"
	"database/sql"
	"runtime"
	"strconv"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/drover/drover/internal/fleet"
	"github.com/drover/drover/internal/store/internal/sqlcommon"
)

// loggedMeta is a device's newest logged state, for Load. fw and cerr index
// the overlay's strings; fw 0: the device has no logged state.
type loggedMeta struct {
	lastSeen, seq, applied int64
	fw, cerr               uint32
}

// logOverlay is every device's newest logged state, by device ID.
type logOverlay struct {
	rows   []loggedMeta
	strs   []string // [0] is unused: fw 0 says "none"
	index  map[string]uint32
	states [][]byte // the documents, by device ID; nil: not read
}

// newLogOverlay returns an empty overlay with room for device IDs up to
// maxID.
func newLogOverlay(states bool, maxID int64) *logOverlay {
	o := &logOverlay{strs: []string{""}, index: map[string]uint32{}, rows: make([]loggedMeta, max(maxID, 0)+1)}
	if states {
		o.states = [][]byte{}
	}
	return o
}

func (o *logOverlay) str(v string) uint32 {
	if i, ok := o.index[v]; ok {
		return i
	}
	i := uint32(len(o.strs))
	o.strs = append(o.strs, v)
	o.index[v] = i
	return i
}

// set records device id's newest logged state; a later call for the same
// device wins.
func (o *logOverlay) set(id uint64, firmware string, lastSeen, seq, applied int64, configError string, state []byte) {
	if id >= uint64(len(o.rows)) {
		n := max(int(id)+1, 2*len(o.rows), 1024)
		grown := make([]loggedMeta, n)
		copy(grown, o.rows)
		o.rows = grown
	}
	o.rows[id] = loggedMeta{lastSeen: lastSeen, seq: seq, applied: applied, fw: o.str(firmware), cerr: o.str(configError)}
	if o.states != nil {
		for uint64(len(o.states)) <= id {
			o.states = append(o.states, nil)
		}
		o.states[id] = state
	}
}

// apply amends a device row with its newest logged state; read only, for
// Load's queries at once.
func (o *logOverlay) apply(r *sqlcommon.DeviceRow) {
	id := uint64(r.ID)
	if id >= uint64(len(o.rows)) || o.rows[id].fw == 0 {
		return
	}
	m := &o.rows[id]
	r.Firmware, r.LastSeen, r.Seq, r.AppliedVersion = o.strs[m.fw], m.lastSeen, m.seq, m.applied
	r.ConfigError = nil
	if c := o.strs[m.cerr]; c != "" {
		r.ConfigError = []byte(c)
	}
	if o.states != nil {
		r.State = o.states[id]
	}
}

// logRange is how many rows of a generation one query of readLog reads.
var logRange = int64(1 << 14)

// logRow is a state log row as readLog reads it.
type logRow struct {
	rowid, lastSeen, seq, applied int64
	id                            uint64
	firmware, configError         string
	state                         []byte
}

// readLog reads generation g's rows: where each device's newest row is
// (set), and into o, if not nil, their states. Several queries read ranges
// of rows at once; their rows are taken in storage order all the same.
func (s *Store) readLog(ctx context.Context, g int64, o *logOverlay, set func(id uint64, r ref)) (int64, error) {
	var maxRow int64
	if err := s.readers().QueryRowContext(ctx, `SELECT COALESCE(MAX(rowid), 0) FROM `+logTable(g)).Scan(&maxRow); err != nil {
		return 0, err
	}
	ranges := int((maxRow + logRange - 1) / logRange)
	workers := min(runtime.GOMAXPROCS(0), 4, max(ranges, 1))
	results := make([]chan []logRow, ranges)
	for i := range results {
		results[i] = make(chan []logRow, 1)
	}
	// A query starts a range at most 2*workers ahead of the one taken.
	ahead := make(chan struct{}, 2*workers)
	gr, gctx := errgroup.WithContext(ctx)
	var next atomic.Int64
	for range workers {
		gr.Go(func() error {
			for {
				select {
				case ahead <- struct{}{}:
				case <-gctx.Done():
					return gctx.Err()
				}
				k := next.Add(1) - 1
				if k >= int64(ranges) {
					return nil
				}
				rows, err := s.readLogRange(gctx, g, k*logRange+1, (k+1)*logRange+1, o != nil, o != nil && o.states != nil)
				if err != nil {
					return err
				}
				results[k] <- rows
			}
		})
	}
	n := int64(0)
	for k := range ranges {
		var rows []logRow
		select {
		case rows = <-results[k]:
		case <-gctx.Done():
		}
		if rows == nil && gctx.Err() != nil {
			break
		}
		for i := range rows {
			r := &rows[i]
			if set != nil {
				set(r.id, mkRef(g, r.rowid))
			}
			if o != nil && (set != nil || s.states.get(r.id) == mkRef(g, r.rowid)) {
				o.set(r.id, r.firmware, r.lastSeen, r.seq, r.applied, r.configError, r.state)
			}
		}
		n += int64(len(rows))
		<-ahead
	}
	if err := gr.Wait(); err != nil {
		return n, err
	}
	return n, nil
}

// readLogRange reads generation g's rows of rowids [lo, hi).
func (s *Store) readLogRange(ctx context.Context, g, lo, hi int64, meta, states bool) ([]logRow, error) {
	cols := `rowid, device_id`
	if meta {
		cols += `, firmware, last_seen, seq, applied_version, config_error`
		if states {
			cols += `, state`
		}
	}
	query := `SELECT ` + cols + ` FROM ` + logTable(g) + ` WHERE rowid >= ` + strconv.FormatInt(lo, 10) +
		` AND rowid < ` + strconv.FormatInt(hi, 10) + ` ORDER BY rowid`
	out := make([]logRow, 0, hi-lo)
	err := streamRaw(s.readers())(ctx, query, func(rows sqlcommon.Rows) error {
		var r logRow
		dest := []any{&r.rowid, &r.id}
		if meta {
			dest = append(dest, &r.firmware, &r.lastSeen, &r.seq, &r.applied, &r.configError)
			if states {
				dest = append(dest, &r.state)
			}
		}
		for rows.Next() {
			r.state = nil
			if err := rows.Scan(dest...); err != nil {
				return err
			}
			out = append(out, r)
		}
		return rows.Err()
	})
	return out, err
}

// overlay returns the newest logged states: those kept since open if still
// current and the documents are not wanted, else read now. l.opMu is held:
// no merge moves rows meanwhile.
func (s *Store) overlay(ctx context.Context, states bool) (*logOverlay, error) {
	l := &s.states
	l.mu.Lock()
	o := l.kept
	l.kept = nil
	gens := append([]int64(nil), l.gens...)
	l.mu.Unlock()
	if o != nil && !states {
		return o, nil
	}
	maxID, err := s.maxDeviceID(ctx)
	if err != nil {
		return nil, err
	}
	o = newLogOverlay(states, maxID)
	for _, g := range gens {
		if _, err := s.readLog(ctx, g, o, nil); err != nil {
			return nil, err
		}
	}
	return o, nil
}

// maxDeviceID is the highest device ID (0: none), read from the end of
// the table's B-tree.
func (s *Store) maxDeviceID(ctx context.Context) (int64, error) {
	var id int64
	err := s.r.QueryRowContext(ctx, `SELECT COALESCE(MAX(id), 0) FROM devices`).Scan(&id)
	return id, err
}

// Load implements fleet.Store. A device's newest state may be in the
// state log. Merges wait until it returns.
func (s *Store) Load(ctx context.Context, opts fleet.LoadOptions, each func(fleet.DeviceRecord) error) (fleet.LoadResult, error) {
	defer s.loadDone.Do(func() {
		s.closeLoadReaders()
		close(s.loaded)
	})
	l := &s.states
	l.opMu.Lock()
	defer l.opMu.Unlock()
	o, err := s.overlay(ctx, !opts.NoStates)
	if err != nil {
		return fleet.LoadResult{}, err
	}
	db := s.readers()
	return sqlcommon.Loader{Query: sqlcommon.QuerySQL(db), Stream: streamRaw(db), Newest: o.apply}.Load(ctx, opts, each)
}

// loadMmapSize is how much of the file the load's readers map: SQLite's
// most on 64-bit Linux; pages beyond are read as usual.
const loadMmapSize = 0x7fff0000

// readers are the load's readers until the first Load ended, then the
// store's.
func (s *Store) readers() *sql.DB {
	if db := s.loadR.Load(); db != nil {
		return db
	}
	return s.r
}

// closeLoadReaders closes the load's readers, unmapping the file.
func (s *Store) closeLoadReaders() error {
	if db := s.loadR.Swap(nil); db != nil {
		return db.Close()
	}
	return nil
}

// upkeepHold is how long the background work (the history archiver, the
// state log's merger) waits for the first Load to end before it starts: at
// a server's start they would take the CPU and the disk the load needs.
var upkeepHold = time.Minute

// holdUpkeep waits until the first Load ended, or upkeepHold passed; false
// if stop closed first.
func (s *Store) holdUpkeep(stop <-chan struct{}) bool {
	t := time.NewTimer(upkeepHold)
	defer t.Stop()
	select {
	case <-stop:
		return false
	case <-s.loaded:
	case <-t.C:
	}
	return true
}
