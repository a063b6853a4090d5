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
	"time"

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

func newLogOverlay(states bool) *logOverlay {
	o := &logOverlay{strs: []string{""}, index: map[string]uint32{}}
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

// readLog reads generation g's rows in storage order: where each device's
// newest row is (set), and into o, if not nil, their states.
func (s *Store) readLog(ctx context.Context, g int64, o *logOverlay, set func(id uint64, r ref)) (int64, error) {
	cols := `rowid, device_id`
	if o != nil {
		cols += `, firmware, last_seen, seq, applied_version, config_error`
		if o.states != nil {
			cols += `, state`
		}
	}
	rows, err := s.r.QueryContext(ctx, `SELECT `+cols+` FROM `+logTable(g)+` ORDER BY rowid`)
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	var rowid, lastSeen, seq, applied int64
	var id uint64
	var firmware, configError string
	var state []byte
	dest := []any{&rowid, &id}
	if o != nil {
		dest = append(dest, &firmware, &lastSeen, &seq, &applied, &configError)
		if o.states != nil {
			dest = append(dest, &state)
		}
	}
	n := int64(0)
	for rows.Next() {
		state = nil
		if err := rows.Scan(dest...); err != nil {
			return n, err
		}
		n++
		if set != nil {
			set(id, mkRef(g, rowid))
		}
		if o != nil && (set != nil || s.states.get(id) == mkRef(g, rowid)) {
			o.set(id, firmware, lastSeen, seq, applied, configError, state)
		}
	}
	return n, rows.Err()
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
	o = newLogOverlay(states)
	for _, g := range gens {
		if _, err := s.readLog(ctx, g, o, nil); err != nil {
			return nil, err
		}
	}
	return o, nil
}

// Load implements fleet.Store. A device's newest state may be in the
// state log. Merges wait until it returns.
func (s *Store) Load(ctx context.Context, opts fleet.LoadOptions, each func(fleet.DeviceRecord) error) (fleet.LoadResult, error) {
	defer s.loadDone.Do(func() { close(s.loaded) })
	l := &s.states
	l.opMu.Lock()
	defer l.opMu.Unlock()
	o, err := s.overlay(ctx, !opts.NoStates)
	if err != nil {
		return fleet.LoadResult{}, err
	}
	return sqlcommon.Loader{Query: sqlcommon.QuerySQL(s.r), Newest: o.apply}.Load(ctx, opts, each)
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
