package fleet

// Per-device quotas (docs/operations.md, "Quotas"). Each device holds two
// 32-bit clocks and nothing else:
//
//   - pushTAT, the theoretical arrival time of a generic cell rate algorithm
//     (GCRA, a token bucket kept as one number): pushes refill at
//     PushRate per profile push interval, and a device that has been quiet
//     may make PushBurst pushes back to back. A push beyond that is refused
//     with ErrQuota (HTTP 429 with Retry-After) and nothing of it is
//     written.
//   - lastSample, when the device's last history sample was kept: an
//     accepted push stores a sample only when at least the sample spacing
//     passed since, which bounds history in samples per interval and in
//     bytes per device.
//
// Both count quota ticks (1/8 s) since the Service started; quotas start
// fresh when the server restarts.
//
// Only the pushes a device chose to send count (docs/protocol.md, "Push
// quota"). A push the server asked for is never refused and leaves pushTAT
// as it was: device.asked counts the pushes the server asked for and did
// not have yet, one per nudge written to the device's connection, per
// command delivered in an answer (its result must follow) and per
// configuration version sent (the agent pushes again once it applied it),
// each known before the body is read; the next pushes take them, whatever
// they carry (a free start takes none). A device cannot earn any itself: a
// version sent again (its tag is in device.marks) owes nothing. The first
// push after the device booted (state.uptime) or after its agent started
// ("started") is not counted either, unless the push before it was such a
// start too (a restart loop counts) or the device is over its quota with
// pushes of its own already.
//
// Devices that hit a quota are listed (bounded) for operators, who can lift
// the quotas of one device (persisted through a PolicyStore).

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"
)

// ErrQuota is returned by Push for a push beyond the device's quota.
var ErrQuota = errors.New("push quota exceeded")

// ErrTooManyLifts is returned when 10,000 devices already have lifted quotas.
var ErrTooManyLifts = errors.New("too many devices with lifted quotas (10000): revoke some first")

// QuotaOptions configure per-device quotas. The zero value has no quotas.
type QuotaOptions struct {
	// PushRate is how many pushes per push interval of its profile a
	// device may make on average; 0 turns the push quota off.
	PushRate float64
	// PushBurst is how many pushes a device that has been quiet may make
	// back to back (at least 1).
	PushBurst int
	// HistorySamples is how many history samples per push interval a
	// device keeps at most; 0: one per accepted push.
	HistorySamples int
	// HistoryBytes bounds a device's history over HistoryRetention, counted
	// as SampleBytes per sample; 0: no byte bound. Without a retention the
	// bound cannot hold and is not applied.
	HistoryBytes     int64
	HistoryRetention time.Duration
}

// DefaultQuotas are the quotas of `drover serve`.
func DefaultQuotas() QuotaOptions {
	return QuotaOptions{PushRate: 2, PushBurst: 6, HistorySamples: 2, HistoryBytes: 1 << 20, HistoryRetention: 7 * 24 * time.Hour}
}

// SampleBytes is what one history sample costs on disk at most, row and
// index, on the largest of the three backends (measured: docs/operations.md).
const SampleBytes = 192

// Reasons a device hits a quota.
const (
	QuotaPushRate      = "push_rate"      // pushed faster than its quota: 429
	QuotaHistory       = "history"        // push accepted, its sample not kept: more samples per interval than allowed
	QuotaProfileCreate = "profile_create" // reported a firmware while its type's profile creations were used up
)

// QuotaReasons lists the reasons in a fixed order.
var QuotaReasons = []string{QuotaPushRate, QuotaHistory, QuotaProfileCreate}

func reasonIndex(r string) int { return slices.Index(QuotaReasons, r) }

// QuotaError says which device is over its quota and when it may push again.
type QuotaError struct {
	DeviceID   uint64
	RetryAfter time.Duration
}

func (e *QuotaError) Error() string { return ErrQuota.Error() }
func (e *QuotaError) Unwrap() error { return ErrQuota }

const (
	ticksPerSecond = 8
	tickNS         = int64(time.Second) / ticksPerSecond
	// maxTracked bounds the devices listed as having hit a quota and the
	// devices with a lifted quota.
	maxTracked = 10000
)

// QuotaHit is a device that hit a quota: counts by reason (QuotaReasons
// order) and when.
type QuotaHit struct {
	DeviceID uint64            `json:"device_id,string"`
	Counts   map[string]uint64 `json:"counts"`
	First    time.Time         `json:"first"`
	Last     time.Time         `json:"last"`
	Lifted   bool              `json:"lifted"`
	// LiftedUntil is when a lift ends; nil: until revoked.
	LiftedUntil *time.Time `json:"lifted_until,omitempty"`
}

type hitRecord struct {
	counts      [3]uint64
	first, last int64 // unix ns
}

// QuotaLift exempts one device from its quotas; zero Until: until revoked.
type QuotaLift struct {
	DeviceID uint64    `json:"device_id,string"`
	Until    time.Time `json:"until,omitzero"`
	Note     string    `json:"note,omitempty"`
	At       time.Time `json:"at"`
}

// quota is the quotas room: the quota state besides the per-device
// clocks, the hits and the lifts. The Service embeds it, so that its
// exported methods are the Service's.
type quota struct {
	opts  QuotaOptions
	epoch int64 // unix ns of tick 0
	// minSpacing is the byte bound's sample spacing, in ticks.
	minSpacing uint32

	hits [3]atomic.Uint64 // by reason, since start
	// thinned counts samples not kept: by the per-interval bound, by the
	// byte bound.
	thinned [2]atomic.Uint64

	mu     sync.Mutex
	hit    map[uint64]*hitRecord
	lifted map[uint64]QuotaLift
	// anyLifted is len(lifted) > 0, read without the lock.
	anyLifted atomic.Bool

	// Set by New: what the room needs of the others.
	devs deviceFinder
	// lifts runs fn under the policy room's lock with its store (nil:
	// memory only), where lifts are stored (policy.go).
	lifts     func(fn func(st PolicyStore) error) error
	now       func() time.Time
	log       *slog.Logger
	logChange func(ctx context.Context, kind ChangeKind, id uint64) // cluster glue, cluster.go
}

// wire gives the room what it needs of the others (New).
func (q *quota) wire(s *Service) {
	q.devs, q.lifts, q.now, q.log, q.logChange = s, s.policy.locked, s.now, s.log, s.noteChange
}

func newQuotas(o QuotaOptions, now time.Time) *quota {
	q := &quota{opts: o, epoch: now.UnixNano() - int64(time.Second), hit: map[uint64]*hitRecord{}, lifted: map[uint64]QuotaLift{}}
	if o.PushBurst < 1 {
		q.opts.PushBurst = 1
	}
	if o.HistoryBytes > 0 && o.HistoryRetention > 0 {
		samples := max(o.HistoryBytes/SampleBytes, 1)
		sp := float64(o.HistoryRetention) / float64(samples) / float64(tickNS)
		q.minSpacing = uint32(min(math.Ceil(sp), math.MaxUint32/2))
	}
	return q
}

// ticks is now in quota ticks; 0 when the clock ran out of range (after 17
// years), which turns quotas off.
func (q *quota) ticks(now int64) uint32 {
	t := (now - q.epoch) / tickNS
	if t <= 0 || t >= math.MaxUint32/2 {
		return 0
	}
	return uint32(t)
}

// pushCheck decides a push of d at now (d.mu held): ok, or how long to wait.
// It returns the push clock to store when the push is accepted.
func (q *quota) pushCheck(d *device, now int64, interval int) (tat uint32, wait time.Duration, ok bool) {
	if q.opts.PushRate <= 0 {
		return 0, 0, true
	}
	n := q.ticks(now)
	if n == 0 {
		return 0, 0, true
	}
	e := uint32(max(math.Round(float64(interval)*ticksPerSecond/q.opts.PushRate), 1))
	tau := e * uint32(q.opts.PushBurst-1)
	t := max(d.pushTAT, n)
	// A shorter interval than when tat was set: never hold the device to
	// the old, slower rate (tat stays within tau+e of its last push).
	if d.lastSeen != 0 {
		if ls := q.ticks(d.lastSeen); ls != 0 && t > ls+tau+e {
			t = max(ls+tau+e, n)
		}
	}
	if t-n > tau {
		return 0, time.Duration(int64(t-n-tau) * tickNS), false
	}
	return t + e, 0, true
}

// maxAsked bounds the pushes a device may be owed: the server asks for
// them, so a device that never answers keeps at most this many.
const maxAsked = 16

// Bits of device.marks: the last push accepted was a start (isStart), and
// the tag of the configuration version last sent (versionTag).
const (
	markStart = 0x80
	markTag   = 0x7f
)

// versionTag is a configuration version's tag in device.marks: 1..127,
// different for consecutive versions. Versions 127 apart share it: the
// push after such an apply then counts, as any push did before.
func versionTag(v int64) uint8 { return uint8(uint64(v)%127) + 1 }

// owe notes that the server asked device d for n more pushes (d.mu held).
func (d *device) owe(n int) { d.asked = uint8(min(int(d.asked)+n, maxAsked)) }

// oweConfig notes that an answer sends d configuration version v (d.mu
// held): the push reporting it is owed, once per version.
func (d *device) oweConfig(v int64) {
	if t := versionTag(v); d.marks&markTag != t {
		d.marks = d.marks&^markTag | t
		d.owe(1)
	}
}

// isStart says whether a push is the first after the device booted (its
// uptime began after its last accepted push, with 2 s for network jitter)
// or after its agent started.
func isStart(started bool, uptime *int64, lastSeen, now int64) bool {
	return started || uptime != nil && lastSeen != 0 && *uptime < (now-lastSeen)/int64(time.Second)-2
}

// Why a push is free (pushFree), or not.
const (
	counted   = iota // one of the device's own
	freeStart        // the first after a start (isStart), not right after another
	freeAsked        // the server asked for it (device.asked)
)

// pushFree decides a push of d at now (d.mu held) as pushCheck does, and
// says whether it is free and why (start: isStart; false before the body
// is read). A free push keeps the push clock: tat is d.pushTAT then. A
// start takes no push the server asked for: they stay for the pushes it
// asks for.
func (q *quota) pushFree(d *device, now int64, interval int, start bool) (tat uint32, wait time.Duration, ok bool, free uint8) {
	tat, wait, ok = q.pushCheck(d, now, interval)
	switch {
	case ok && start && d.marks&markStart == 0:
		return d.pushTAT, 0, true, freeStart
	case d.asked > 0:
		return d.pushTAT, 0, true, freeAsked
	}
	return tat, wait, ok, counted
}

// took records an accepted push of d (d.mu held).
func (d *device) took(free uint8, start bool) {
	if free == freeAsked {
		d.asked--
	}
	if start {
		d.marks |= markStart
	} else {
		d.marks &^= markStart
	}
}

// Nudged notes that the server asked device id to push at once over its
// persistent connection: that push does not count against its quota.
func (q *quota) Nudged(id uint64) {
	if d := q.devs.get(id); d != nil {
		d.mu.Lock()
		d.owe(1)
		d.mu.Unlock()
	}
}

// keepSample says whether an accepted push at now stores a history sample
// (d.mu held), and returns the sample clock to store. A sample dropped by
// the per-interval bound is the device's doing (pushing too often) and
// counts as a history quota hit; one dropped only by the byte bound is not.
// Neither lists the device: an agent pushing early after a reboot loses a
// sample but is not an offender.
func (q *quota) keepSample(d *device, now int64, interval int) (clock uint32, keep, hit bool) {
	var perInterval uint32
	if q.opts.HistorySamples > 0 {
		perInterval = uint32(interval * ticksPerSecond / q.opts.HistorySamples)
	}
	spacing := max(q.minSpacing, perInterval)
	if spacing == 0 {
		return d.lastSample, true, false
	}
	n := q.ticks(now)
	if n == 0 || d.lastSample == 0 || n < d.lastSample || n-d.lastSample >= spacing {
		return n, true, false
	}
	if n-d.lastSample < perInterval {
		q.thinned[0].Add(1)
		return d.lastSample, false, true
	}
	q.thinned[1].Add(1)
	return d.lastSample, false, false
}

// isLifted says whether id's quotas are lifted at now.
func (q *quota) isLifted(id uint64, now int64) bool {
	if !q.anyLifted.Load() {
		return false
	}
	q.mu.Lock()
	l, ok := q.lifted[id]
	q.mu.Unlock()
	return ok && (l.Until.IsZero() || l.Until.UnixNano() > now)
}

// note records that device id hit a quota for reason; history hits are
// only counted.
func (q *quota) note(id uint64, reason string, now int64) {
	i := reasonIndex(reason)
	q.hits[i].Add(1)
	if reason == QuotaHistory {
		return
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	r, ok := q.hit[id]
	if !ok {
		if len(q.hit) >= maxTracked {
			q.evictOldest()
		}
		r = &hitRecord{first: now}
		q.hit[id] = r
	}
	r.counts[i]++
	r.last = now
}

// evictOldest drops the device whose last hit is the oldest; q.mu held.
func (q *quota) evictOldest() {
	var oldest uint64
	at := int64(math.MaxInt64)
	for id, r := range q.hit {
		if r.last < at {
			oldest, at = id, r.last
		}
	}
	delete(q.hit, oldest)
}

// QuotaFilters are the values of the devices filter's quota parameter:
// devices that hit any quota, whose quotas are lifted, or that hit one
// (history hits are counted, not listed: see keepSample).
var QuotaFilters = []string{"hit", "lifted", QuotaPushRate, QuotaProfileCreate}

// quotaSet resolves a quota filter to device IDs.
func (q *quota) quotaSet(kind string) (map[uint64]struct{}, bool) {
	if !slices.Contains(QuotaFilters, kind) {
		return nil, false
	}
	i := reasonIndex(kind)
	now := q.now().UnixNano()
	q.mu.Lock()
	defer q.mu.Unlock()
	out := map[uint64]struct{}{}
	if kind == "lifted" {
		for id, l := range q.lifted {
			if l.Until.IsZero() || l.Until.UnixNano() > now {
				out[id] = struct{}{}
			}
		}
		return out, true
	}
	for id, r := range q.hit {
		if i < 0 || r.counts[i] > 0 {
			out[id] = struct{}{}
		}
	}
	return out, true
}

// QuotaHits counts quota hits by reason since the server started.
func (q *quota) QuotaHits() map[string]uint64 {
	out := make(map[string]uint64, len(QuotaReasons))
	for i, r := range QuotaReasons {
		out[r] = q.hits[i].Load()
	}
	return out
}

// HistoryThinned counts the history samples not kept since the server
// started: because the device pushed more often than the per-interval bound
// allows, and because of the byte bound alone.
func (q *quota) HistoryThinned() (perInterval, bytes uint64) {
	return q.thinned[0].Load(), q.thinned[1].Load()
}

// QuotaDevices lists the devices that hit a quota (at most 10,000, the
// latest kept), the latest hit first, and the devices with lifted quotas.
func (q *quota) QuotaDevices() []QuotaHit {
	now := q.now().UnixNano()
	q.mu.Lock()
	out := make([]QuotaHit, 0, len(q.hit)+len(q.lifted))
	for id, r := range q.hit {
		h := QuotaHit{DeviceID: id, Counts: map[string]uint64{}, First: time.Unix(0, r.first).UTC(), Last: time.Unix(0, r.last).UTC()}
		for i, n := range r.counts {
			if n > 0 {
				h.Counts[QuotaReasons[i]] = n
			}
		}
		out = append(out, h)
	}
	for id := range q.lifted {
		if _, ok := q.hit[id]; !ok {
			out = append(out, QuotaHit{DeviceID: id, Counts: map[string]uint64{}})
		}
	}
	for i := range out {
		if l, ok := q.lifted[out[i].DeviceID]; ok && (l.Until.IsZero() || l.Until.UnixNano() > now) {
			out[i].Lifted = true
			if !l.Until.IsZero() {
				u := l.Until.UTC()
				out[i].LiftedUntil = &u
			}
		}
	}
	q.mu.Unlock()
	slices.SortFunc(out, func(a, b QuotaHit) int {
		if c := b.Last.Compare(a.Last); c != 0 {
			return c
		}
		return cmpU(a.DeviceID, b.DeviceID)
	})
	return out
}

// QuotaOf returns one device's quota record; ok false when it never hit a
// quota and has no lift.
func (q *quota) QuotaOf(id uint64) (QuotaHit, bool) {
	for _, h := range q.QuotaDevices() {
		if h.DeviceID == id {
			return h, true
		}
	}
	return QuotaHit{}, false
}

// CheckLiftNote checks an operator's note on a lift.
func CheckLiftNote(note string) error {
	if len(note) > 200 || !utf8.ValidString(note) {
		return &FieldError{Field: "note", Message: "note must be at most 200 bytes of UTF-8"}
	}
	return nil
}

// LiftQuota exempts device id from its quotas until until (zero: until
// revoked), durably when a PolicyStore is attached.
func (q *quota) LiftQuota(ctx context.Context, id uint64, until time.Time, note string) (QuotaLift, error) {
	if q.devs.get(id) == nil {
		return QuotaLift{}, ErrNotFound
	}
	l := QuotaLift{DeviceID: id, Until: until.UTC().Truncate(time.Millisecond), Note: note, At: q.now().UTC().Truncate(time.Millisecond)}
	err := q.lifts(func(st PolicyStore) error {
		q.mu.Lock()
		_, had := q.lifted[id]
		full := !had && len(q.lifted) >= maxTracked
		q.mu.Unlock()
		if full {
			return ErrTooManyLifts
		}
		if st != nil {
			if err := st.SaveQuotaLift(ctx, l); err != nil {
				return err
			}
		}
		q.mu.Lock()
		q.lifted[id] = l
		q.anyLifted.Store(true)
		q.mu.Unlock()
		q.logChange(ctx, ChangePolicy, id)
		return nil
	})
	if err != nil {
		return QuotaLift{}, err
	}
	q.log.Info("quota lifted", "device_id", id, "until", until, "note", note)
	return l, nil
}

// RestoreQuota ends a device's lift and forgets its quota hits.
func (q *quota) RestoreQuota(ctx context.Context, id uint64) error {
	err := q.lifts(func(st PolicyStore) error {
		q.mu.Lock()
		_, had := q.lifted[id]
		_, hit := q.hit[id]
		q.mu.Unlock()
		if !had && !hit {
			return ErrNotFound
		}
		if had && st != nil {
			if err := st.DeleteQuotaLift(ctx, id); err != nil {
				return err
			}
			q.logChange(ctx, ChangePolicy, id)
		}
		q.mu.Lock()
		delete(q.lifted, id)
		delete(q.hit, id)
		q.anyLifted.Store(len(q.lifted) > 0)
		q.mu.Unlock()
		return nil
	})
	if err != nil {
		return err
	}
	q.log.Info("quota restored", "device_id", id)
	return nil
}

// loadLifts takes the stored lifts (New).
func (q *quota) loadLifts(lifts []QuotaLift) {
	for _, l := range lifts {
		q.lifted[l.DeviceID] = l
	}
	q.anyLifted.Store(len(q.lifted) > 0)
}

// replaceLifts replaces the lifts with the stored ones (cluster mode).
func (q *quota) replaceLifts(lifts []QuotaLift) {
	q.mu.Lock()
	clear(q.lifted)
	for _, l := range lifts {
		q.lifted[l.DeviceID] = l
	}
	q.anyLifted.Store(len(q.lifted) > 0)
	q.mu.Unlock()
}

// QuotaOptions returns the quotas in force.
func (q *quota) QuotaOptions() QuotaOptions { return q.opts }
