package alert

import (
	"cmp"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/drover/drover/internal/fleet"
)

// Options configure an Engine.
type Options struct {
	Fleet      *fleet.Service
	Store      Store // nil: a MemStore
	Logger     *slog.Logger
	Now        func() time.Time
	CheckEvery time.Duration // offline and reboot-expiry checks (default 30 s)
	Retention  time.Duration // cleared events and sync history kept this long (0: forever)
	HTTPClient *http.Client  // for webhooks (default: 10 s timeout)
	// SMTPRootCAs verify the SMTP relay's certificate (nil: the system's
	// roots).
	SMTPRootCAs *x509.CertPool
	Retry       Retry // notification retries
	// SecretKey (32 bytes) seals the SMTP password in the store. Without
	// it the password is kept in memory only and must be set again after
	// a restart.
	SecretKey []byte
	// SMTPPassword, when set (from a file named in the configuration), is
	// the SMTP password: it is never stored, and a password set through the
	// API or dashboard is ignored.
	SMTPPassword string
	// Leading, when set, says whether this server leads a cluster
	// (docs/cluster.md): only the leader evaluates pushes and checks, so
	// that each alert is raised once; every server reloads the rules
	// from the store at each check, as other servers change them.
	Leading func() bool
	// NextRuleID, when set, hands out new rules' IDs: the database's, in
	// a cluster, where other servers create rules at the same moment.
	NextRuleID func(ctx context.Context) (uint64, error)
	// NextEventIDs, when set, hands out n new event IDs no server has
	// used, ascending: the database's, in a cluster, where the leadership
	// moves and two servers may both lead for a moment.
	NextEventIDs func(ctx context.Context, n int) ([]uint64, error)
	// OnChange, when set, runs after a rule or the e-mail settings
	// changed here were stored: in a cluster it tells the other servers,
	// which then call Reload, so that the change holds there at once.
	OnChange func(ctx context.Context)
}

// Engine evaluates rules on every push and periodically, and keeps the
// events. Per-device state is one 8-byte slot (last uptime, sync state)
// plus an entry per (rule, device) only while a condition holds.
type Engine struct {
	opts  Options
	fleet *fleet.Service
	store Store
	log   *slog.Logger
	now   func() time.Time

	rulesMu   sync.Mutex // serialises rule changes
	maxRule   uint64     // highest rule ID ever stored; rulesMu held
	rules     atomic.Pointer[[]*compiled]
	nextGen   atomic.Uint64
	labelsGen atomic.Uint64 // fleet.LabelsGeneration when labels were last resolved

	shards [nShards]shard
	slots  slotTable

	nextEvent atomic.Uint64
	// With Options.NextEventIDs: IDs the database handed out, not used
	// yet (idMu held); topping says a top-up runs.
	idMu    sync.Mutex
	freeIDs []uint64
	topping atomic.Bool

	qmu        sync.Mutex
	qEvents    []Event
	qSync      []SyncEvent
	qSyncSince time.Time // when qSync last became non-empty
	flushMu    sync.Mutex
	storeOK    atomic.Bool

	notify *notifier
}

const nShards = 64

type shard struct {
	mu sync.Mutex
	m  map[cellKey]*cell
}

// cellKey names the state of one rule generation for one device.
type cellKey struct{ gen, dev uint64 }

// cell is the state of a (rule, device) whose condition holds.
type cell struct {
	count  uint32 // consecutive pushes meeting the condition
	until  int64  // reboot: clears at this time (unix ns)
	active *Event // raised and not cleared
}

// compiled is a rule ready for evaluation. Rule changes that keep the
// condition keep gen, and so the per-device state.
type compiled struct {
	Rule
	gen   uint64
	label atomic.Uint32 // resolved Label; 0 matches nothing
	stats *ruleStats
	gone  atomic.Bool // replaced: create no more state for gen
}

type ruleStats struct {
	active          atomic.Int64
	raised, cleared atomic.Uint64
}

// New loads rules and active alerts from the store.
func New(ctx context.Context, opts Options) (*Engine, error) {
	if opts.Fleet == nil {
		return nil, errors.New("alert: Options.Fleet is required")
	}
	if opts.Store == nil {
		opts.Store = NewMemStore()
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.CheckEvery <= 0 {
		opts.CheckEvery = 30 * time.Second
	}
	if opts.HTTPClient == nil {
		opts.HTTPClient = &http.Client{Timeout: 10 * time.Second}
	}
	e := &Engine{opts: opts, fleet: opts.Fleet, store: opts.Store, log: opts.Logger, now: opts.Now}
	e.storeOK.Store(true)
	for i := range e.shards {
		e.shards[i].m = map[cellKey]*cell{}
	}
	rules, err := e.store.LoadRules(ctx)
	if err != nil {
		return nil, fmt.Errorf("alert rules: %w", err)
	}
	list := make([]*compiled, 0, len(rules))
	byID := map[uint64]*compiled{}
	for _, r := range rules {
		c := e.compile(r, nil)
		list = append(list, c)
		byID[r.ID] = c
	}
	e.rules.Store(&list)
	maxRule, err := e.store.MaxRuleID(ctx)
	if err != nil {
		return nil, fmt.Errorf("alert rules: %w", err)
	}
	e.maxRule = maxRule
	maxID, err := e.store.MaxEventID(ctx)
	if err != nil {
		return nil, fmt.Errorf("alert events: %w", err)
	}
	e.nextEvent.Store(maxID)
	e.notify = newNotifier(e)
	if err := e.loadSMTP(ctx); err != nil {
		return nil, err
	}
	if err := e.restoreActive(ctx, byID); err != nil {
		return nil, err
	}
	// Sync history compares each push with the state the fleet has now.
	e.fleet.Scan(func(d fleet.DeviceInfo) {
		e.slots.get(d.ID).Store(uint64(d.SyncState))
	})
	// Subscribed last: the fleet's pushes reach a loaded engine.
	e.fleet.Subscribe(fleet.Events{Pushed: e.OnPush})
	return e, nil
}

func (e *Engine) restoreActive(ctx context.Context, byID map[uint64]*compiled) error {
	q := EventQuery{Active: true, Limit: 1000}
	now := e.now()
	for {
		evs, err := e.store.Events(ctx, q)
		if err != nil {
			return fmt.Errorf("active alerts: %w", err)
		}
		for i := range evs {
			ev := evs[i]
			r := byID[ev.RuleID]
			if r == nil || r.Disabled {
				e.closeEvent(&ev, now, ReasonRuleGone)
				e.enqueue(ev)
				continue
			}
			c := &cell{count: uint32(max(r.Pushes, 1)), active: &ev}
			if r.Kind == Reboot {
				c.until = ev.RaisedAt.Add(time.Duration(r.Seconds) * time.Second).UnixNano()
			}
			e.shards[ev.DeviceID%nShards].m[cellKey{r.gen, ev.DeviceID}] = c
			r.stats.active.Add(1)
		}
		if len(evs) < q.Limit {
			return nil
		}
		q.Before = evs[len(evs)-1].ID
	}
}

// compile prepares r; prev is the rule it replaces (nil: new).
func (e *Engine) compile(r Rule, prev *compiled) *compiled {
	c := &compiled{Rule: r}
	if prev != nil && sameCondition(&prev.Rule, &r) {
		c.gen, c.stats = prev.gen, prev.stats
	} else {
		c.gen, c.stats = e.nextGen.Add(1), &ruleStats{}
	}
	if r.Label != "" {
		c.label.Store(uint32(e.fleet.LabelIDs([]string{r.Label})[0]))
	}
	return c
}

func sameCondition(a, b *Rule) bool {
	return a.Kind == b.Kind && a.Threshold == b.Threshold && a.Pushes == b.Pushes && a.Seconds == b.Seconds &&
		a.Label == b.Label && a.DeviceType == b.DeviceType && a.Disabled == b.Disabled
}

// OnPush evaluates one accepted push; New subscribes it to the fleet's
// pushes (fleet.Events.Pushed), and a cluster's leader passes it the
// pushes other nodes took.
func (e *Engine) OnPush(ev fleet.PushEvent) {
	if e.opts.Leading != nil && !e.opts.Leading() {
		return
	}
	st := ev.State
	syncNow := uint64(fleet.Synchronized)
	switch {
	case ev.ConfigError != "":
		syncNow = uint64(fleet.SyncError)
	case fleet.Behind(ev.ConfigVersion, ev.DesiredVersion):
		syncNow = uint64(fleet.SyncPending)
	}
	// Slot: bits 0-2 sync state, bit 3 uptime known, bits 32-63 uptime.
	slot := e.slots.get(ev.DeviceID)
	var up uint64
	hasUp := st != nil && st.Uptime != nil
	if hasUp {
		up = uint64(min(max(*st.Uptime, 0), math.MaxUint32))
	}
	var old uint64
	for {
		old = slot.Load()
		nv := old&^7 | syncNow
		if hasUp {
			nv = up<<32 | 8 | syncNow
		}
		if slot.CompareAndSwap(old, nv) {
			break
		}
	}
	if old&7 != syncNow {
		e.enqueueSync(SyncEvent{
			DeviceID: ev.DeviceID, At: ev.At.UTC(), State: fleet.SyncState(syncNow).String(),
			Applied: ev.ConfigVersion, Desired: ev.DesiredVersion, Error: ev.ConfigError,
		})
	}
	rules := *e.rules.Load()
	if len(rules) == 0 || st == nil {
		return
	}
	if g := e.fleet.LabelsGeneration(); g != e.labelsGen.Load() {
		e.resolveLabels(g)
	}
	oldUp := old >> 32
	rebooted := hasUp && old&8 != 0 && up < oldUp
	sh := &e.shards[ev.DeviceID%nShards]
	for _, r := range rules {
		if r.Disabled || r.DeviceType != "" && r.DeviceType != ev.DeviceType {
			continue
		}
		if r.Label != "" {
			l := uint16(r.label.Load())
			if l == 0 || !e.fleet.HasLabel(ev.DeviceID, l) {
				continue
			}
		}
		switch r.Kind {
		case TemperatureAbove, CPUAbove, DiskFreeBelow:
			if v, ok := r.Kind.value(st); ok {
				e.observe(sh, r, ev, v)
			}
		case Reboot:
			if rebooted {
				e.rebooted(sh, r, ev, up, oldUp)
			}
		case Offline:
			e.pushed(sh, r, ev.DeviceID, ev.At)
		}
	}
}

func (e *Engine) observe(sh *shard, r *compiled, ev fleet.PushEvent, v float64) {
	k := cellKey{r.gen, ev.DeviceID}
	sh.mu.Lock()
	defer sh.mu.Unlock()
	c := sh.m[k]
	if !r.breached(v) {
		if c != nil {
			if c.active != nil {
				e.clear(r, c.active, ev.At, ReasonConditionEnded)
			}
			delete(sh.m, k)
		}
		return
	}
	if c == nil {
		if r.gone.Load() {
			return
		}
		c = &cell{}
		sh.m[k] = c
	}
	if c.count < math.MaxUint32 {
		c.count++
	}
	if c.active == nil && int(c.count) >= r.Pushes {
		var msg string
		switch r.Kind {
		case TemperatureAbove:
			msg = fmt.Sprintf("temperature %.1f °C above %g °C", v, r.Threshold)
		case CPUAbove:
			msg = fmt.Sprintf("CPU %.1f %% above %g %%", v, r.Threshold)
		case DiskFreeBelow:
			msg = fmt.Sprintf("free disk %.1f %% below %g %%", v, r.Threshold)
		}
		if r.Pushes > 1 {
			msg += fmt.Sprintf(" for %d pushes", r.Pushes)
		}
		c.active = e.raise(r, ev.DeviceID, ev.DeviceType, v, ev.At, msg)
	}
}

func (e *Engine) rebooted(sh *shard, r *compiled, ev fleet.PushEvent, up, was uint64) {
	k := cellKey{r.gen, ev.DeviceID}
	sh.mu.Lock()
	defer sh.mu.Unlock()
	c := sh.m[k]
	if c == nil {
		if r.gone.Load() {
			return
		}
		c = &cell{}
		sh.m[k] = c
	}
	c.until = ev.At.Add(time.Duration(r.Seconds) * time.Second).UnixNano()
	if c.active == nil {
		c.active = e.raise(r, ev.DeviceID, ev.DeviceType, float64(up), ev.At,
			fmt.Sprintf("rebooted: uptime %d s, was %d s at the previous push", up, was))
	}
}

// pushed clears an offline alert.
func (e *Engine) pushed(sh *shard, r *compiled, dev uint64, at time.Time) {
	k := cellKey{r.gen, dev}
	sh.mu.Lock()
	if c := sh.m[k]; c != nil {
		if c.active != nil {
			e.clear(r, c.active, at, ReasonPushedAgain)
		}
		delete(sh.m, k)
	}
	sh.mu.Unlock()
}

// Event IDs from the database (Options.NextEventIDs) are taken in blocks
// of eventIDBlock, topped up in the background below eventIDLow.
const (
	eventIDBlock = 256
	eventIDLow   = 64
)

// newEventID hands out a new event's ID. With Options.NextEventIDs it is
// one the database handed out; when the database cannot hand one out, ok
// is false and no event is raised now: the condition holds at its next
// evaluation (a push, a check) and raises it then, never under an ID
// another server may use.
func (e *Engine) newEventID() (uint64, bool) {
	if e.opts.NextEventIDs == nil {
		return e.nextEvent.Add(1), true
	}
	e.idMu.Lock()
	defer e.idMu.Unlock()
	if len(e.freeIDs) == 0 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		ids, err := e.opts.NextEventIDs(ctx, eventIDBlock)
		cancel()
		if err != nil || len(ids) == 0 {
			e.log.Warn("alert not raised: no event ID from the database", "err", err)
			return 0, false
		}
		e.freeIDs = ids
	}
	id := e.freeIDs[0]
	e.freeIDs = e.freeIDs[1:]
	if len(e.freeIDs) < eventIDLow && e.topping.CompareAndSwap(false, true) {
		go e.topUpIDs()
	}
	return id, true
}

// topUpIDs adds a block of event IDs from the database to the free ones.
func (e *Engine) topUpIDs() {
	defer e.topping.Store(false)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ids, err := e.opts.NextEventIDs(ctx, eventIDBlock)
	if err != nil {
		return // the next raise that finds none asks again
	}
	e.idMu.Lock()
	e.freeIDs = append(e.freeIDs, ids...)
	e.idMu.Unlock()
}

// dropIDs forgets the free event IDs, at a change of leadership: the next
// ones come from the database, above every ID handed out before, so that
// a new leader's events sort after the old one's.
func (e *Engine) dropIDs() {
	e.idMu.Lock()
	e.freeIDs = nil
	e.idMu.Unlock()
}

// raise makes a new event; the shard lock is held. It returns nil when no
// event ID can be had (newEventID).
func (e *Engine) raise(r *compiled, dev uint64, devType string, v float64, at time.Time, msg string) *Event {
	id, ok := e.newEventID()
	if !ok {
		return nil // raised at the condition's next evaluation
	}
	ev := &Event{
		ID: id, RuleID: r.ID, Rule: r.Name, Kind: r.Kind, Severity: r.Severity,
		DeviceID: dev, DeviceType: devType, State: Raised, Value: v, Message: msg, RaisedAt: at.UTC(),
	}
	r.stats.active.Add(1)
	r.stats.raised.Add(1)
	e.enqueue(*ev)
	e.notify.send(&r.Rule, *ev)
	return ev
}

// clear closes an active event because its condition ended; shard lock held.
func (e *Engine) clear(r *compiled, ev *Event, at time.Time, reason string) {
	e.closeEvent(ev, at, reason)
	r.stats.active.Add(-1)
	r.stats.cleared.Add(1)
	e.enqueue(*ev)
	e.notify.send(&r.Rule, *ev)
}

func (e *Engine) closeEvent(ev *Event, at time.Time, reason string) {
	t := at.UTC()
	ev.State, ev.ClearedAt, ev.ClearReason = Cleared, &t, reason
}

func (e *Engine) enqueue(ev Event) {
	e.qmu.Lock()
	e.qEvents = append(e.qEvents, ev)
	e.qmu.Unlock()
}

func (e *Engine) enqueueSync(ev SyncEvent) {
	e.qmu.Lock()
	if len(e.qSync) == 0 {
		e.qSyncSince = time.Now()
	}
	e.qSync = append(e.qSync, ev)
	e.qmu.Unlock()
}

// Run checks offline devices and expired reboot alerts every CheckEvery,
// writes events to the store and sends notifications, until ctx ends; then
// it writes what is queued and returns.
func (e *Engine) Run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		e.notify.run(ctx)
	}()
	check := time.NewTicker(e.opts.CheckEvery)
	defer check.Stop()
	flush := time.NewTicker(250 * time.Millisecond)
	defer flush.Stop()
	lastPrune := time.Time{}
	leading := true // as New left it: the first check settles it
	for {
		select {
		case <-ctx.Done():
			fctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			if err := e.Flush(fctx); err != nil {
				e.log.Error("alert events not stored at shutdown", "err", err)
			}
			cancel()
			wg.Wait()
			return
		case <-check.C:
			if e.opts.Leading != nil {
				if !e.follow(ctx, &leading) {
					continue
				}
			}
			e.Check(e.now())
			if e.opts.Retention > 0 && time.Since(lastPrune) > time.Hour {
				lastPrune = time.Now()
				if n, err := e.store.PruneEvents(ctx, e.now().Add(-e.opts.Retention)); err != nil {
					e.log.Warn("alert prune failed", "err", err)
				} else if n > 0 {
					e.log.Info("alert history pruned", "records", n)
				}
			}
		case <-flush.C:
			if err := e.flush(ctx, false); err != nil && ctx.Err() == nil {
				if e.storeOK.Swap(false) {
					e.log.Error("alert events not stored", "err", err)
				}
			} else if err == nil && !e.storeOK.Swap(true) {
				e.log.Info("alert events stored again")
			}
		}
	}
}

// Sync history is written in transactions of syncChunk events. When more
// than that arrive between two flushes (a fleet's first pushes: one event
// per device), they are gathered for up to syncLinger or syncWindow events
// and sorted by device together: each transaction then covers a narrow
// range of the (device, time) index and its rows share leaf pages
// (BenchmarkSyncEvents in internal/store/sqlite: about half the cost per
// event of sorting 250 ms of a million devices' first pushes).
const (
	syncChunk  = 500
	syncWindow = 25_000
	syncLinger = 5 * time.Second
)

// Flush writes every queued event and all sync history to the store, in
// chunks so that the store's single writer is never held long.
func (e *Engine) Flush(ctx context.Context) error { return e.flush(ctx, true) }

// flush writes the queued events; sync history too when all is set, when
// at most syncChunk events wait, or when they fill the window or waited
// syncLinger.
func (e *Engine) flush(ctx context.Context, all bool) error {
	e.flushMu.Lock()
	defer e.flushMu.Unlock()
	e.qmu.Lock()
	evs := e.qEvents
	e.qEvents = nil
	var syncs []SyncEvent
	if n := len(e.qSync); all || n <= syncChunk || n >= syncWindow || time.Since(e.qSyncSince) >= syncLinger {
		syncs, e.qSync = e.qSync, nil
	}
	e.qmu.Unlock()
	const chunk = 2000
	for len(evs) > 0 {
		n := min(len(evs), chunk)
		if err := e.store.SaveEvents(ctx, evs[:n]); err != nil {
			e.requeue(evs, syncs)
			return err
		}
		evs = evs[n:]
	}
	// Sync events in smaller transactions (the database's writer is
	// shared with the pushes' commits), all sorted by device first; a
	// stable sort keeps each device's events in order.
	slices.SortStableFunc(syncs, func(a, b SyncEvent) int { return cmp.Compare(a.DeviceID, b.DeviceID) })
	for len(syncs) > 0 {
		n := min(len(syncs), syncChunk)
		if err := e.store.SaveSyncEvents(ctx, syncs[:n]); err != nil {
			e.requeue(nil, syncs)
			return err
		}
		syncs = syncs[n:]
	}
	return nil
}

// requeue puts unwritten records back before newer ones.
func (e *Engine) requeue(evs []Event, syncs []SyncEvent) {
	e.qmu.Lock()
	e.qEvents = append(slices.Clip(evs), e.qEvents...)
	if len(syncs) > 0 && len(e.qSync) == 0 {
		e.qSyncSince = time.Now()
	}
	e.qSync = append(slices.Clip(syncs), e.qSync...)
	e.qmu.Unlock()
}

// resolveLabels maps the rules' label names to IDs again.
func (e *Engine) resolveLabels(gen uint64) {
	for _, r := range *e.rules.Load() {
		if r.Label != "" {
			r.label.Store(uint32(e.fleet.LabelIDs([]string{r.Label})[0]))
		}
	}
	e.labelsGen.Store(gen)
}

// Check raises offline alerts, clears offline alerts of devices that came
// back and reboot alerts that expired. Run calls it every CheckEvery.
func (e *Engine) Check(now time.Time) {
	e.resolveLabels(e.fleet.LabelsGeneration())
	rules := *e.rules.Load()
	var offline []*compiled
	for _, r := range rules {
		if r.Kind == Offline && !r.Disabled {
			offline = append(offline, r)
		}
	}
	e.checkQuota(rules, now)
	if len(offline) > 0 {
		nowNs := now.UnixNano()
		e.fleet.Scan(func(d fleet.DeviceInfo) {
			if d.LastSeen == 0 {
				return
			}
			sh := &e.shards[d.ID%nShards]
			silent := time.Duration(nowNs - d.LastSeen)
			for _, r := range offline {
				if !targets(r, d) {
					continue
				}
				k := cellKey{r.gen, d.ID}
				limit := time.Duration(r.Seconds) * time.Second
				sh.mu.Lock()
				c := sh.m[k]
				switch {
				case silent > limit && c == nil && !r.gone.Load():
					if ev := e.raise(r, d.ID, d.DeviceType, silent.Seconds(), now,
						fmt.Sprintf("no push for %s (limit %s)", silent.Round(time.Second), limit)); ev != nil {
						sh.m[k] = &cell{active: ev} // else raised at the next check
					}
				case silent <= limit && c != nil:
					if c.active != nil {
						e.clear(r, c.active, now, ReasonPushedAgain)
					}
					delete(sh.m, k)
				}
				sh.mu.Unlock()
			}
		})
	}
	byGen := map[uint64]*compiled{}
	for _, r := range rules {
		if r.Kind == Reboot {
			byGen[r.gen] = r
		}
	}
	nowNs := now.UnixNano()
	for i := range e.shards {
		sh := &e.shards[i]
		sh.mu.Lock()
		for k, c := range sh.m {
			if c.until != 0 && c.until <= nowNs {
				if r := byGen[k.gen]; r != nil && c.active != nil {
					e.clear(r, c.active, now, ReasonNoReboot)
				}
				delete(sh.m, k)
			}
		}
		sh.mu.Unlock()
	}
}

func targets(r *compiled, d fleet.DeviceInfo) bool {
	if r.DeviceType != "" && r.DeviceType != d.DeviceType {
		return false
	}
	if r.Label != "" {
		l := uint16(r.label.Load())
		if _, ok := slices.BinarySearch(d.Labels, l); l == 0 || !ok {
			return false
		}
	}
	return true
}

// Rules returns the rules ordered by ID.
func (e *Engine) Rules() []Rule {
	list := *e.rules.Load()
	out := make([]Rule, len(list))
	for i, c := range list {
		out[i] = c.Rule
		out[i].Email = slices.Clone(c.Email)
	}
	return out
}

// Rule returns one rule.
func (e *Engine) Rule(id uint64) (Rule, bool) {
	for _, c := range *e.rules.Load() {
		if c.ID == id {
			r := c.Rule
			r.Email = slices.Clone(r.Email)
			return r, true
		}
	}
	return Rule{}, false
}

// Errors of rule changes.
var (
	ErrDuplicateName = errors.New("another rule has this name")
	ErrInvalid       = errors.New("invalid rule")
)

// CreateRule validates and stores a new rule.
func (e *Engine) CreateRule(ctx context.Context, r Rule) (Rule, error) {
	return e.putRule(ctx, 0, r, false)
}

// CheckRule checks what CreateRule (id 0) or UpdateRule would, and
// changes nothing: the rule as it would be stored (without its ID when
// new), or their error.
func (e *Engine) CheckRule(ctx context.Context, id uint64, r Rule) (Rule, error) {
	return e.putRule(ctx, id, r, true)
}

// UpdateRule replaces rule id. A change of the condition or target clears
// the rule's active alerts (without notification); they raise again when
// the new condition holds.
func (e *Engine) UpdateRule(ctx context.Context, id uint64, r Rule) (Rule, error) {
	return e.putRule(ctx, id, r, false)
}

func (e *Engine) putRule(ctx context.Context, id uint64, r Rule, check bool) (Rule, error) {
	r.Email = slices.Clone(r.Email)
	if err := r.Normalize(); err != nil {
		return Rule{}, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	e.rulesMu.Lock()
	defer e.rulesMu.Unlock()
	list := *e.rules.Load()
	var prev *compiled
	for _, c := range list {
		if c.ID == id && id != 0 {
			prev = c
		} else if c.Name == r.Name {
			return Rule{}, ErrDuplicateName
		}
	}
	if id != 0 && prev == nil {
		return Rule{}, ErrNotFound
	}
	if check {
		if prev != nil {
			r.ID, r.CreatedAt, r.UpdatedAt = id, prev.CreatedAt, prev.UpdatedAt
		}
		return r, nil
	}
	now := e.now().UTC().Truncate(time.Millisecond)
	if id == 0 {
		// Never a deleted rule's ID: its events would show as this one's.
		r.ID, r.CreatedAt = e.maxRule+1, now
		switch {
		case e.opts.NextRuleID != nil: // other servers create rules at the same moment
			next, err := e.opts.NextRuleID(ctx)
			if err != nil {
				return Rule{}, err
			}
			r.ID = next
		case e.opts.Leading != nil: // other servers create rules too
			m, err := e.store.MaxRuleID(ctx)
			if err != nil {
				return Rule{}, err
			}
			e.maxRule = max(e.maxRule, m)
			r.ID = e.maxRule + 1
		}
	} else {
		if prev == nil {
			return Rule{}, ErrNotFound
		}
		r.ID, r.CreatedAt = id, prev.CreatedAt
	}
	r.UpdatedAt = now
	if err := e.store.SaveRule(ctx, r); err != nil {
		return Rule{}, err
	}
	e.maxRule = max(e.maxRule, r.ID)
	c := e.compile(r, prev)
	next := make([]*compiled, 0, len(list)+1)
	for _, o := range list {
		if o != prev {
			next = append(next, o)
		}
	}
	next = append(next, c)
	sort.Slice(next, func(i, j int) bool { return next[i].ID < next[j].ID })
	e.rules.Store(&next)
	if prev != nil && prev.gen != c.gen {
		e.retire(prev, changeReason(&prev.Rule, &r))
	}
	e.changed(ctx)
	return r, nil
}

// changed tells the other servers of a change stored here
// (Options.OnChange).
func (e *Engine) changed(ctx context.Context) {
	if e.opts.OnChange != nil {
		e.opts.OnChange(ctx)
	}
}

// Reload reads the rules and the e-mail settings back from the store:
// another server of a cluster changed them. Rules whose condition did not
// change keep their state, as after a change made here.
func (e *Engine) Reload(ctx context.Context) error {
	if err := e.reloadRules(ctx); err != nil {
		return err
	}
	return e.loadSMTP(ctx)
}

// DeleteRule deletes a rule and clears its active alerts.
func (e *Engine) DeleteRule(ctx context.Context, id uint64) error {
	e.rulesMu.Lock()
	defer e.rulesMu.Unlock()
	list := *e.rules.Load()
	i := slices.IndexFunc(list, func(c *compiled) bool { return c.ID == id })
	if i < 0 {
		return ErrNotFound
	}
	if err := e.store.DeleteRule(ctx, id); err != nil {
		return err
	}
	prev := list[i]
	next := slices.Delete(slices.Clone(list), i, i+1)
	e.rules.Store(&next)
	e.retire(prev, ReasonRuleGone)
	e.changed(ctx)
	return nil
}

// changeReason is why a rule's change from prev to next clears its
// alerts: disabling it ends them as deleting it does.
func changeReason(prev, next *Rule) string {
	if next.Disabled && !prev.Disabled {
		return ReasonRuleGone
	}
	return ReasonRuleChanged
}

// retire drops a rule generation's state and clears its active alerts.
func (e *Engine) retire(r *compiled, reason string) {
	r.gone.Store(true)
	now := e.now()
	for i := range e.shards {
		sh := &e.shards[i]
		sh.mu.Lock()
		for k, c := range sh.m {
			if k.gen != r.gen {
				continue
			}
			if c.active != nil {
				e.closeEvent(c.active, now, reason)
				r.stats.active.Add(-1)
				e.enqueue(*c.active)
			}
			delete(sh.m, k)
		}
		sh.mu.Unlock()
	}
}

// Active returns up to limit active alerts, newest first, optionally of one
// device (dev 0: all), and how many are active in all.
func (e *Engine) Active(dev uint64, limit int) ([]Event, int) {
	if e.opts.Leading != nil && !e.opts.Leading() {
		return e.storedActive(dev, limit)
	}
	var out []Event
	shards := e.shards[:]
	if dev != 0 {
		shards = e.shards[dev%nShards : dev%nShards+1]
	}
	for i := range shards {
		sh := &shards[i]
		sh.mu.Lock()
		for k, c := range sh.m {
			if c.active != nil && (dev == 0 || k.dev == dev) {
				out = append(out, *c.active)
			}
		}
		sh.mu.Unlock()
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID > out[j].ID })
	total := len(out)
	if limit > 0 && len(out) > limit {
		out = out[:limit]
	}
	return out, total
}

// storedActive is Active read from the store, on a cluster node that does
// not lead (the leader holds the alert state): at most 1000 counted.
func (e *Engine) storedActive(dev uint64, limit int) ([]Event, int) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	out, err := e.store.Events(ctx, EventQuery{Active: true, DeviceID: dev, Limit: 1000})
	if err != nil {
		e.log.Warn("active alerts not read", "err", err)
		return nil, 0
	}
	total := len(out)
	if limit > 0 && len(out) > limit {
		out = out[:limit]
	}
	return out, total
}

// ActiveCount is the number of active alerts (on a cluster node that does
// not lead: in the store, at most 1000 counted).
func (e *Engine) ActiveCount() int {
	if e.opts.Leading != nil && !e.opts.Leading() {
		_, n := e.storedActive(0, 1)
		return n
	}
	n := int64(0)
	for _, c := range *e.rules.Load() {
		n += c.stats.active.Load()
	}
	return int(n)
}

// ActiveByRule counts active alerts per rule ID.
func (e *Engine) ActiveByRule() map[uint64]int {
	out := map[uint64]int{}
	for _, c := range *e.rules.Load() {
		out[c.ID] = int(c.stats.active.Load())
	}
	return out
}

// Events reads stored events (queued ones are written first).
func (e *Engine) Events(ctx context.Context, q EventQuery) ([]Event, error) {
	if err := e.Flush(ctx); err != nil {
		return nil, err
	}
	return e.store.Events(ctx, q)
}

// SyncHistory reads a device's sync history, newest first.
func (e *Engine) SyncHistory(ctx context.Context, dev uint64, limit int) ([]SyncEvent, error) {
	if err := e.Flush(ctx); err != nil {
		return nil, err
	}
	return e.store.SyncEvents(ctx, dev, limit)
}

// StoreOK reports whether the last write of events succeeded.
func (e *Engine) StoreOK() bool { return e.storeOK.Load() }

// slotTable is a growable array of per-device slots, indexed by device ID,
// read without locks.
type slotTable struct {
	mu     sync.Mutex
	chunks atomic.Pointer[[]*slotChunk]
}

const chunkBits = 12

type slotChunk [1 << chunkBits]atomic.Uint64

func (t *slotTable) get(id uint64) *atomic.Uint64 {
	ci, off := id>>chunkBits, id&(1<<chunkBits-1)
	if p := t.chunks.Load(); p != nil && ci < uint64(len(*p)) && (*p)[ci] != nil {
		return &(*p)[ci][off]
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	var cur []*slotChunk
	if p := t.chunks.Load(); p != nil {
		cur = *p
	}
	if ci < uint64(len(cur)) && cur[ci] != nil {
		return &cur[ci][off]
	}
	next := make([]*slotChunk, max(uint64(len(cur)), ci+1+ci/4))
	copy(next, cur)
	next[ci] = new(slotChunk)
	t.chunks.Store(&next)
	return &next[ci][off]
}

// follow keeps a cluster node's engine in step (Options.Leading): it
// reloads the rules, and on a change of leadership takes over the stored
// active alerts and event IDs (a new leader) or drops its alert state (no
// longer leader). It says whether this node leads.
func (e *Engine) follow(ctx context.Context, leading *bool) bool {
	if err := e.reloadRules(ctx); err != nil {
		e.log.Warn("alert rules not reloaded", "err", err)
	}
	now := e.opts.Leading()
	if now == *leading {
		return now
	}
	*leading = now
	for i := range e.shards {
		sh := &e.shards[i]
		sh.mu.Lock()
		clear(sh.m)
		sh.mu.Unlock()
	}
	for _, r := range *e.rules.Load() {
		r.stats.active.Store(0)
	}
	e.dropIDs()
	if !now {
		return false
	}
	maxID, err := e.store.MaxEventID(ctx)
	if err == nil {
		for cur := e.nextEvent.Load(); maxID > cur && !e.nextEvent.CompareAndSwap(cur, maxID); cur = e.nextEvent.Load() {
		}
		byID := map[uint64]*compiled{}
		for _, r := range *e.rules.Load() {
			byID[r.ID] = r
		}
		err = e.restoreActive(ctx, byID)
	}
	if err != nil {
		e.log.Error("alert state not taken over", "err", err)
		*leading = false // try again at the next check
		return false
	}
	e.log.Info("alert engine leads the cluster")
	return true
}

// reloadRules replaces the rules with the stored ones, keeping the state
// of rules whose condition did not change.
func (e *Engine) reloadRules(ctx context.Context) error {
	stored, err := e.store.LoadRules(ctx)
	if err != nil {
		return err
	}
	maxRule, err := e.store.MaxRuleID(ctx)
	if err != nil {
		return err
	}
	e.rulesMu.Lock()
	defer e.rulesMu.Unlock()
	e.maxRule = max(e.maxRule, maxRule)
	list := *e.rules.Load()
	byID := make(map[uint64]*compiled, len(list))
	for _, c := range list {
		byID[c.ID] = c
	}
	next := make([]*compiled, 0, len(stored))
	changed := len(stored) != len(list)
	for _, r := range stored {
		prev := byID[r.ID]
		delete(byID, r.ID)
		if prev != nil && prev.UpdatedAt.Equal(r.UpdatedAt) {
			next = append(next, prev)
			continue
		}
		changed = true
		c := e.compile(r, prev)
		next = append(next, c)
		if prev != nil && prev.gen != c.gen {
			e.retire(prev, changeReason(&prev.Rule, &r))
		}
	}
	if !changed {
		return nil
	}
	sort.Slice(next, func(i, j int) bool { return next[i].ID < next[j].ID })
	e.rules.Store(&next)
	for _, gone := range byID {
		e.retire(gone, ReasonRuleGone)
	}
	return nil
}
