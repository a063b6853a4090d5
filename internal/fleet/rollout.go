package fleet

// Rollouts (docs/firmware.md): a firmware offered to the devices a filter
// selects, in waves; or a label layer's new values released to them
// (configuration rollouts, configrollout.go). The engine (RolloutStep, run
// by RunRollouts) starts waves, pauses a rollout whose wave fails too
// often, fails stalled devices and writes state changes to the store;
// pushes only touch memory.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/drover/drover/internal/protocol"
)

// Rollout states.
const (
	RolloutRunning = "running"
	RolloutPaused  = "paused"
	RolloutAborted = "aborted"
	RolloutDone    = "done"
)

// Rollout kinds: what is rolled out.
const (
	RolloutFirmware = "firmware"
	RolloutConfig   = "config"
)

// Rollout device states.
const (
	DevicePending     = "pending"
	DeviceDownloading = protocol.FirmwareDownloading
	DeviceInstalling  = protocol.FirmwareInstalling
	DeviceVerified    = "verified"
	DeviceFailed      = protocol.FirmwareFailed
	DeviceCanceled    = "canceled" // the rollout was aborted before it installed
)

// RolloutDeviceStates lists the device states in order.
var RolloutDeviceStates = []string{DevicePending, DeviceDownloading, DeviceInstalling, DeviceVerified, DeviceFailed, DeviceCanceled}

func terminal(state string) bool {
	return state == DeviceVerified || state == DeviceFailed || state == DeviceCanceled
}

// RolloutSpec is what an operator asks for.
type RolloutSpec struct {
	FirmwareID uint64 `json:"firmware_id"`
	// Config, instead of a firmware, makes a configuration rollout: a
	// label layer's new values (configrollout.go).
	Config *ConfigChange `json:"config,omitempty"`
	// Filter selects devices as the devices list does (a query string:
	// "label=north&liveness=online"); the firmware's device type, or the
	// configuration's label, is implied.
	Filter string `json:"filter,omitempty"`
	// Policy names the rollout policy whose plan the rollout was started
	// with (rolloutpolicy.go); the plan is copied.
	Policy string `json:"policy,omitempty"`
	RolloutPlan
}

// RolloutPlan is how a rollout goes: given inline, or a rollout
// policy's (rolloutpolicy.go).
type RolloutPlan struct {
	// Waves are wave sizes, each a count ("10") or a percentage of the
	// devices matched at creation ("25%"); the last repeats.
	Waves []string `json:"waves,omitempty"`
	// MaxFailurePct pauses the rollout when more than this share of a
	// wave's devices failed.
	MaxFailurePct float64 `json:"max_failure_pct"`
	// MaxDownloads is how many devices may download at once.
	MaxDownloads int `json:"max_downloads"`
	// Window is when devices may start an update (UTC); nil: any time.
	Window *Window `json:"window,omitempty"`
	// StallTimeout fails a downloading or installing device that reports
	// no progress for this many seconds.
	StallTimeout int `json:"stall_timeout"`
}

// clone is p sharing no memory with it.
func (p RolloutPlan) clone() RolloutPlan {
	p.Waves = slices.Clone(p.Waves)
	if p.Window != nil {
		w := *p.Window
		p.Window = &w
	}
	return p
}

// Window is a daily maintenance window in UTC, "HH:MM" each; End before
// Start spans midnight.
type Window struct {
	Start string `json:"start"`
	End   string `json:"end"`
}

func hhmm(v string) (int, bool) {
	if len(v) != 5 || v[2] != ':' {
		return 0, false
	}
	h, err1 := strconv.Atoi(v[:2])
	m, err2 := strconv.Atoi(v[3:])
	if err1 != nil || err2 != nil || h < 0 || h > 23 || m < 0 || m > 59 {
		return 0, false
	}
	return h*60 + m, true
}

// Open says whether t is inside the window (a nil window always is).
func (w *Window) Open(t time.Time) bool {
	if w == nil {
		return true
	}
	s, _ := hhmm(w.Start)
	e, _ := hhmm(w.End)
	t = t.UTC()
	m := t.Hour()*60 + t.Minute()
	if s <= e {
		return m >= s && m < e
	}
	return m >= s || m < e
}

// Rollout is a rollout as stored and shown.
type Rollout struct {
	ID uint64 `json:"id"`
	// Kind is RolloutFirmware or RolloutConfig.
	Kind string `json:"kind"`
	RolloutSpec
	State  string `json:"state"`
	Reason string `json:"reason,omitempty"` // why paused, aborted or done
	Wave   int    `json:"wave"`             // waves started
	Total  int    `json:"total"`            // devices matched at creation
	// Counts are devices by state (kept in the store once finished).
	Counts map[string]int `json:"counts,omitempty"`
	// FailWaveOK: the operator resumed after this wave's failures.
	FailWaveOK int       `json:"fail_wave_ok,omitempty"`
	CreatedAt  time.Time `json:"created_at"`
	UpdatedAt  time.Time `json:"updated_at"`
	By         string    `json:"by,omitempty"`
}

// MarshalJSON writes the rollout's id and firmware_id as decimal strings,
// like every ID of the API.
func (r Rollout) MarshalJSON() ([]byte, error) {
	type plain Rollout
	return json.Marshal(struct {
		plain
		ID         string `json:"id"`
		FirmwareID string `json:"firmware_id"`
	}{plain(r), strconv.FormatUint(r.ID, 10), strconv.FormatUint(r.FirmwareID, 10)})
}

// UnmarshalJSON reads id and firmware_id as strings or numbers (rollouts
// stored before IDs became strings keep numbers).
func (r *Rollout) UnmarshalJSON(b []byte) error {
	type plain Rollout
	v := struct {
		*plain
		ID         json.Number `json:"id"`
		FirmwareID json.Number `json:"firmware_id"`
	}{plain: (*plain)(r)}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	var err1, err2 error
	r.ID, err1 = parseIDNumber(v.ID)
	r.FirmwareID, err2 = parseIDNumber(v.FirmwareID)
	return errors.Join(err1, err2)
}

// parseIDNumber is an ID given as a JSON number or decimal string ("" is 0).
func parseIDNumber(n json.Number) (uint64, error) {
	if n == "" {
		return 0, nil
	}
	return strconv.ParseUint(string(n), 10, 64)
}

func (r *Rollout) finished() bool { return r.State == RolloutAborted || r.State == RolloutDone }

// RolloutDevice is one device's place in a rollout.
type RolloutDevice struct {
	RolloutID uint64    `json:"rollout_id,string"`
	DeviceID  uint64    `json:"device_id,string"`
	Wave      int       `json:"wave"`
	State     string    `json:"state"`
	Progress  int64     `json:"progress,omitempty"` // bytes downloaded
	Reason    string    `json:"reason,omitempty"`
	From      string    `json:"from_firmware,omitempty"`
	UpdatedAt time.Time `json:"updated_at"`
}

// DefaultRolloutSpec fills what an operator left out.
func DefaultRolloutSpec() RolloutSpec {
	return RolloutSpec{RolloutPlan: RolloutPlan{Waves: []string{"1", "10%", "100%"}, MaxFailurePct: 10, MaxDownloads: 50, StallTimeout: 3600}}
}

// rollout is a Rollout in memory.
type rollout struct {
	Rollout
	fw      *Firmware    // nil: a configuration rollout
	stage   *configStage // a configuration rollout's staged layer
	filter  Filter
	parsed  bool // filter resolved (after labels are loaded: at the first step)
	targets map[uint64]*target
	count   map[string]int
	// waveSize and waveFailed are of the latest wave.
	waveSize, waveFailed int
}

type target struct {
	RolloutDevice
	r *rollout
}

func (r *rollout) add(t *target) {
	if r.count == nil {
		r.count = map[string]int{}
	}
	r.targets[t.DeviceID] = t
	r.count[t.State]++
	if t.Wave == r.Wave {
		r.waveSize++
		if t.State == DeviceFailed {
			r.waveFailed++
		}
	}
}

// parse resolves the filter.
func (r *rollout) parse(devs firmwareDevices) error {
	v, err := url.ParseQuery(r.Filter)
	if err != nil {
		return &FieldError{Field: "filter", Message: "filter must be a query string: " + err.Error()}
	}
	for k := range v {
		if !slices.Contains(FilterParams, k) {
			return &FieldError{Field: "filter", Message: "filter: unknown parameter " + strconv.Quote(k)}
		}
	}
	f, err := devs.ParseFilter(v)
	if err != nil {
		return err
	}
	if r.Config != nil {
		return r.configFilter(f, devs)
	}
	if f.DeviceType != "" && f.DeviceType != r.fw.DeviceType {
		return &FieldError{Field: "filter", Message: "filter names another device type than the firmware's"}
	}
	f.DeviceType = r.fw.DeviceType
	r.filter, r.parsed = f, true
	return nil
}

// waveSizes turns the spec into the size of wave n (1-based).
func (r *rollout) waveLimit(n int) int {
	w := r.Waves[min(n, len(r.Waves))-1]
	if p, ok := strings.CutSuffix(w, "%"); ok {
		pct, _ := strconv.ParseFloat(p, 64)
		return max(1, int(float64(r.Total)*pct/100+0.5))
	}
	c, _ := strconv.Atoi(w)
	return c
}

// Check reports the first rule spec breaks.
func (spec *RolloutSpec) Check() error {
	if err := spec.RolloutPlan.check(); err != nil {
		return err
	}
	if len(spec.Filter) > 4096 {
		return &FieldError{Field: "filter", Message: "filter must be at most 4096 bytes"}
	}
	return nil
}

// check checks a plan, a rollout's own or a rollout policy's.
func (spec *RolloutPlan) check() error {
	if len(spec.Waves) == 0 || len(spec.Waves) > 20 {
		return &FieldError{Field: "waves", Message: "waves must list 1..20 sizes"}
	}
	for _, w := range spec.Waves {
		if p, ok := strings.CutSuffix(w, "%"); ok {
			if v, err := strconv.ParseFloat(p, 64); err != nil || !(v > 0 && v <= 100) {
				return &FieldError{Field: "waves", Message: "a wave percentage must be within (0, 100]: " + strconv.Quote(w)}
			}
		} else if v, err := strconv.Atoi(w); err != nil || v < 1 || v > 10_000_000 {
			return &FieldError{Field: "waves", Message: "a wave must be a count 1..10000000 or a percentage like 10%: " + strconv.Quote(w)}
		}
	}
	switch {
	case !(spec.MaxFailurePct >= 0 && spec.MaxFailurePct <= 100):
		return &FieldError{Field: "max_failure_pct", Message: "max_failure_pct must be 0..100"}
	case spec.MaxDownloads < 1 || spec.MaxDownloads > 100000:
		return &FieldError{Field: "max_downloads", Message: "max_downloads must be 1..100000"}
	case spec.StallTimeout < 60 || spec.StallTimeout > 7*86400:
		return &FieldError{Field: "stall_timeout", Message: "stall_timeout must be 60..604800 seconds"}
	}
	if w := spec.Window; w != nil {
		_, ok1 := hhmm(w.Start)
		_, ok2 := hhmm(w.End)
		if !ok1 || !ok2 || w.Start == w.End {
			return &FieldError{Field: "window", Message: "window start and end must be different times HH:MM (UTC)"}
		}
	}
	return nil
}

// eligible says whether d (d.mu held) may join r's next wave.
func (r *rollout) eligible(d *device, now int64) bool {
	return d.admission == Active && (r.fw == nil || d.firmware != r.fw.Version) && d.lastSeen != 0 &&
		d.liveness(now) != Offline && r.filter.match(d, now)
}

// from is what d runs before r (d.mu held): its firmware, or for a
// configuration rollout its applied configuration version.
func (r *rollout) from(d *device) string {
	if r.fw == nil {
		return strconv.FormatInt(d.appliedVersion, 10)
	}
	return d.firmware
}

// CreateRollout checks spec and starts a rollout; its first wave starts
// with the engine's next step.
func (fs *firmwareState) CreateRollout(ctx context.Context, spec RolloutSpec, by string) (Rollout, error) {
	if err := spec.Check(); err != nil {
		return Rollout{}, err
	}
	fs.mu.Lock()
	fw, ok := fs.artifacts[spec.FirmwareID]
	fs.mu.Unlock()
	if !ok {
		return Rollout{}, &FieldError{Field: "firmware_id", Message: "no firmware " + strconv.FormatUint(spec.FirmwareID, 10)}
	}
	if spec.Config != nil {
		return Rollout{}, &FieldError{Field: "config", Message: "a rollout has a firmware_id or a config, not both"}
	}
	fs.stepMu.Lock()
	defer fs.stepMu.Unlock()
	r := fs.newRollout(spec, RolloutFirmware, by)
	r.fw = fw
	if err := fs.match(r); err != nil {
		return Rollout{}, err
	}
	if err := fs.register(ctx, r, nil); err != nil {
		return Rollout{}, err
	}
	v := r.view()
	fs.log.Info("rollout created", "rollout", r.ID, "firmware_id", fw.ID, "version", fw.Version, "devices", r.Total, "by", by)
	return v, nil
}

// newRollout is a running rollout of spec, made now.
func (fs *firmwareState) newRollout(spec RolloutSpec, kind, by string) *rollout {
	now := fs.now().UTC().Truncate(time.Millisecond)
	return &rollout{Rollout: Rollout{Kind: kind, RolloutSpec: spec, State: RolloutRunning, CreatedAt: now, UpdatedAt: now, By: by},
		targets: map[uint64]*target{}, count: map[string]int{}}
}

// match resolves r's filter and counts the devices it matches now.
func (fs *firmwareState) match(r *rollout) error {
	if err := r.parse(fs.devs); err != nil {
		return err
	}
	ns := r.CreatedAt.UnixNano()
	fs.devs.each(func(d *device) {
		if r.eligible(d, ns) {
			r.Total++
		}
	})
	if r.Total == 0 {
		return ErrNoDevices
	}
	return nil
}

// register gives r its ID, stores it and makes it known (memory, other
// nodes); added runs with fs.mu held once r is stored. fs.stepMu held.
func (fs *firmwareState) register(ctx context.Context, r *rollout, added func()) error {
	var id uint64 // from the database in cluster mode
	if fs.clustered() {
		var err error
		if id, err = fs.rc.NextRolloutID(ctx); err != nil {
			return errors.Join(ErrUnavailable, err)
		}
	}
	fs.mu.Lock()
	r.ID = fs.nextRO
	if id != 0 {
		r.ID = id
	}
	if fs.store != nil {
		if err := fs.store.SaveRollout(ctx, r.Rollout); err != nil {
			fs.mu.Unlock()
			return err
		}
	}
	fs.nextRO = max(fs.nextRO, r.ID) + 1
	fs.rollouts[r.ID] = r
	if added != nil {
		added()
	}
	fs.mu.Unlock()
	fs.note(ctx, ChangeRollout, r.ID)
	return nil
}

// view copies r for callers (fs.mu held).
func (r *rollout) view() Rollout {
	out := r.Rollout
	if !r.finished() || out.Counts == nil {
		out.Counts = map[string]int{}
		for _, st := range RolloutDeviceStates {
			out.Counts[st] = r.count[st]
		}
	}
	out.Waves = slices.Clone(out.Waves)
	if out.Kind == "" {
		out.Kind = RolloutFirmware // stored before configuration rollouts
	}
	return out
}

// Rollouts lists the rollouts, newest first.
func (fs *firmwareState) Rollouts() []Rollout {
	fs.mu.Lock()
	out := make([]Rollout, 0, len(fs.rollouts))
	for _, r := range fs.rollouts {
		out = append(out, r.view())
	}
	fs.mu.Unlock()
	slices.SortFunc(out, func(a, b Rollout) int { return int(b.ID) - int(a.ID) })
	return out
}

// RolloutByID returns one rollout.
func (fs *firmwareState) RolloutByID(id uint64) (Rollout, bool) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	r, ok := fs.rollouts[id]
	if !ok {
		return Rollout{}, false
	}
	return r.view(), true
}

// RolloutDevices lists a rollout's devices in ID order, optionally of one
// state, from memory while it runs and from the store once finished.
func (fs *firmwareState) RolloutDevices(ctx context.Context, id uint64, state string, after uint64, limit int) ([]RolloutDevice, error) {
	fs.mu.Lock()
	r, ok := fs.rollouts[id]
	if !ok {
		fs.mu.Unlock()
		return nil, ErrNotFound
	}
	var all []RolloutDevice
	if !r.finished() || fs.store == nil {
		all = make([]RolloutDevice, 0, len(r.targets))
		for _, t := range r.targets {
			all = append(all, t.RolloutDevice)
		}
		fs.mu.Unlock()
	} else {
		fs.mu.Unlock()
		var err error
		if all, err = fs.store.RolloutDevices(ctx, id); err != nil {
			return nil, err
		}
	}
	slices.SortFunc(all, func(a, b RolloutDevice) int { return int(a.DeviceID) - int(b.DeviceID) })
	out := []RolloutDevice{}
	for _, d := range all {
		if d.DeviceID > after && (state == "" || d.State == state) {
			out = append(out, d)
			if len(out) == limit {
				break
			}
		}
	}
	return out, nil
}

// Rollout actions an operator takes.
const (
	ActionPause  = "pause"
	ActionResume = "resume"
	ActionAbort  = "abort"
)

// ControlRollout pauses, resumes or aborts a rollout.
func (fs *firmwareState) ControlRollout(ctx context.Context, id uint64, action, by string) (Rollout, error) {
	if fs.clustered() {
		// Start from the stored rollout; the change is stored only if no
		// other node changed it meanwhile.
		fs.stepMu.Lock()
		defer fs.stepMu.Unlock()
		if err := fs.syncRolloutsLocked(ctx); err != nil {
			return Rollout{}, errors.Join(ErrUnavailable, err)
		}
	}
	if action == ActionAbort {
		// A configuration's previous values go back first (configrollout.go).
		if err := fs.revertConfig(ctx, id, by); err != nil {
			return Rollout{}, err
		}
	}
	fs.mu.Lock()
	r, ok := fs.rollouts[id]
	if !ok {
		fs.mu.Unlock()
		return Rollout{}, ErrNotFound
	}
	prev := r.Rollout
	now := fs.now().UTC().Truncate(time.Millisecond)
	switch {
	case action == ActionPause && r.State == RolloutRunning:
		r.State, r.Reason = RolloutPaused, "paused by "+by
	case action == ActionResume && r.State == RolloutPaused:
		r.State, r.Reason, r.FailWaveOK = RolloutRunning, "", r.Wave
	case action == ActionAbort && !r.finished() && fs.clustered():
		// The database cancels the devices, with the rollout's row; they
		// are read back after.
		r.State, r.Reason = RolloutAborted, "aborted by "+by
	case action == ActionAbort && !r.finished():
		r.State, r.Reason = RolloutAborted, "aborted by "+by
		for _, t := range r.targets {
			if t.State == DevicePending || t.State == DeviceDownloading {
				fs.setState(t, DeviceCanceled, "rollout aborted", now)
			}
		}
		fs.finishLocked(r)
	case action != ActionPause && action != ActionResume && action != ActionAbort:
		fs.mu.Unlock()
		return Rollout{}, &FieldError{Field: "action", Message: "action must be pause, resume or abort"}
	default:
		fs.mu.Unlock()
		return Rollout{}, fmt.Errorf("%w: %s a rollout that is %s", ErrRolloutState, action, r.State)
	}
	r.UpdatedAt = now
	view := r.view()
	fs.mu.Unlock()
	if fs.clustered() {
		// Memory takes the change from the database, when it is stored.
		fs.mu.Lock()
		r.Rollout = prev
		fs.mu.Unlock()
		if err := fs.controlClustered(ctx, view, prev); err != nil {
			return Rollout{}, err
		}
		fs.log.Info("rollout "+action, "rollout", id, "by", by)
		v, _ := fs.RolloutByID(id)
		return v, nil
	}
	if err := fs.saveRollout(ctx, view); err != nil {
		fs.mu.Lock()
		r.Rollout = prev
		fs.mu.Unlock()
		return Rollout{}, err
	}
	fs.log.Info("rollout "+action, "rollout", id, "by", by)
	return view, nil
}

func (fs *firmwareState) saveRollout(ctx context.Context, r Rollout) error {
	if st := fs.store; st != nil {
		fs.storeMu.Lock()
		defer fs.storeMu.Unlock()
		return st.SaveRollout(ctx, r)
	}
	return nil
}

// finishLocked releases a finished rollout's devices (fs.mu held); its
// counts are kept in the rollout.
func (fs *firmwareState) finishLocked(r *rollout) {
	places := fs.places(r)
	for id, t := range r.targets {
		if places[id] == t {
			delete(places, id)
		}
	}
	r.Counts = nil
	r.Counts = r.view().Counts
	fs.placed(r)
	switch {
	case r.stage == nil:
	case r.stage.profile != 0:
		fs.devs.profileStage(r.stage, false)
	default:
		fs.devs.endStage(r.stage)
	}
	r.stage = nil
}

// places is where the devices of r's kind are placed (fs.mu held): a
// device is in at most one unfinished rollout of each kind.
func (fs *firmwareState) places(r *rollout) map[uint64]*target {
	if r.Config != nil {
		return fs.byConfig
	}
	return fs.byDevice
}

// placed notes whether any device is placed in a rollout of r's kind
// (fs.mu held).
func (fs *firmwareState) placed(r *rollout) {
	if r.Config != nil {
		fs.configTargets.Store(len(fs.byConfig) > 0)
	} else {
		fs.targets.Store(len(fs.byDevice) > 0)
	}
}

// setState moves t to state (fs.mu held).
func (fs *firmwareState) setState(t *target, state, reason string, now time.Time) {
	r := t.r
	if t.State != state {
		r.count[t.State]--
		r.count[state]++
		if t.Wave == r.Wave && state == DeviceFailed {
			r.waveFailed++
		}
		if places := fs.places(r); terminal(state) && places[t.DeviceID] == t {
			delete(places, t.DeviceID)
		}
	}
	t.State, t.Reason, t.UpdatedAt = state, reason, now
	fs.dirty[t] = struct{}{}
}

// downloads counts r's devices holding a download slot.
func (r *rollout) downloads() int { return r.count[DeviceDownloading] }

// firmwareOnPush updates the pushing device's rollout state from its
// report and firmware, and returns the offer to answer with, if any. It
// reads memory only.
func (fs *firmwareState) firmwareOnPush(id uint64, firmware string, rep *protocol.FirmwareReport, now time.Time) *protocol.FirmwareOffer {
	if !fs.targets.Load() {
		return nil
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	t := fs.byDevice[id]
	if t == nil {
		return nil
	}
	r := now.UTC().Truncate(time.Millisecond)
	ro := t.r
	switch {
	case firmware == ro.fw.Version:
		fs.setState(t, DeviceVerified, "", r)
		return nil
	case rep != nil && rep.Rollout == ro.ID:
		switch rep.State {
		case protocol.FirmwareFailed:
			fs.setState(t, DeviceFailed, rep.Reason, r)
			return nil
		case protocol.FirmwareInstalling:
			if t.State != DeviceInstalling { // the stall clock runs from here
				fs.setState(t, DeviceInstalling, "", r)
			}
		default:
			if rep.Progress != t.Progress || t.State != DeviceDownloading {
				t.Progress = rep.Progress
				fs.setState(t, DeviceDownloading, "", r)
			}
		}
	case t.State == DeviceInstalling:
		// Installed, came back without a report and without the version.
		fs.setState(t, DeviceFailed, "device runs "+firmware+" after installing "+ro.fw.Version, r)
		return nil
	}
	switch t.State {
	case DevicePending:
		if ro.State != RolloutRunning || !ro.Window.Open(now) || ro.downloads() >= ro.MaxDownloads {
			return nil
		}
		t.Progress = 0
		fs.setState(t, DeviceDownloading, "", r)
	case DeviceDownloading:
	default:
		return nil // installing: nothing more to fetch
	}
	f := ro.fw
	u := f.URL
	if u == "" {
		u = protocol.PathFirmware + strconv.FormatUint(f.ID, 10) + "/file"
	}
	return &protocol.FirmwareOffer{Rollout: ro.ID, Version: f.Version, URL: u, SHA256: f.SHA256, Size: f.Size, Signature: f.Signature}
}

// RunRollouts runs the engine every tick until ctx ends, then writes what
// is left.
func (fs *firmwareState) RunRollouts(ctx context.Context, tick time.Duration) {
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			if err := fs.RolloutStep(context.WithoutCancel(ctx)); err != nil {
				fs.log.Warn("rollouts: last write failed", "err", err)
			}
			return
		case <-t.C:
			if err := fs.RolloutStep(ctx); err != nil {
				fs.log.Warn("rollouts: step failed", "err", err)
			}
		}
	}
}

// RolloutStep advances every running rollout once: stalled devices fail, a
// wave failing beyond the threshold pauses its rollout, a finished wave
// starts the next, and state changes are written to the store.
func (fs *firmwareState) RolloutStep(ctx context.Context) error {
	fs.stepMu.Lock()
	defer fs.stepMu.Unlock()
	if fs.clustered() {
		// This node's device changes go out, the others' come in; only
		// the driving node goes on.
		err := fs.flushRollouts(ctx)
		if serr := fs.syncRolloutsLocked(ctx); err == nil {
			err = serr
		}
		if err != nil || !fs.driving() {
			return err
		}
	}
	now := fs.now()
	ts := now.UTC().Truncate(time.Millisecond)
	var starts []*rollout
	var changed []Rollout
	fs.mu.Lock()
	for _, r := range fs.rollouts {
		if r.finished() {
			continue
		}
		if r.count[DeviceDownloading]+r.count[DeviceInstalling] > 0 {
			stall := time.Duration(r.StallTimeout) * time.Second
			for _, t := range r.targets {
				if (t.State == DeviceDownloading || t.State == DeviceInstalling) && now.Sub(t.UpdatedAt) > stall {
					fs.setState(t, DeviceFailed, "no progress reported for "+stall.String(), ts)
				}
			}
		}
		if r.State != RolloutRunning {
			continue
		}
		if r.Wave > 0 && r.Wave != r.FailWaveOK && r.waveSize > 0 &&
			float64(r.waveFailed)*100 > r.MaxFailurePct*float64(r.waveSize) {
			r.State = RolloutPaused
			r.Reason = fmt.Sprintf("wave %d: %d of %d devices failed (more than %g%%)", r.Wave, r.waveFailed, r.waveSize, r.MaxFailurePct)
			r.UpdatedAt = ts
			changed = append(changed, r.view())
			fs.log.Warn("rollout paused", "rollout", r.ID, "reason", r.Reason)
			continue
		}
		if r.count[DevicePending]+r.count[DeviceDownloading]+r.count[DeviceInstalling] == 0 && r.Window.Open(now) {
			starts = append(starts, r)
		}
	}
	fs.mu.Unlock()
	for _, r := range starts {
		v, stored, err := fs.startWave(ctx, r, ts)
		if err != nil {
			return err
		}
		if !stored {
			changed = append(changed, v)
		}
	}
	for _, v := range changed {
		if err := fs.saveStepChange(ctx, v); err != nil {
			return err
		}
	}
	return fs.flushRollouts(ctx)
}

// startWave adds r's next wave, or finishes r when no device is left;
// stored says whether it stored the change (a wave in cluster mode).
func (fs *firmwareState) startWave(ctx context.Context, r *rollout, ts time.Time) (v Rollout, stored bool, err error) {
	if !r.parsed {
		if err := r.parse(fs.devs); err != nil {
			fs.mu.Lock()
			defer fs.mu.Unlock()
			r.State, r.Reason, r.UpdatedAt = RolloutPaused, "filter: "+err.Error(), ts
			return r.view(), false, nil
		}
	}
	ns := ts.UnixNano()
	var ids []uint64
	var froms []string
	fs.devs.each(func(d *device) {
		if r.eligible(d, ns) {
			ids = append(ids, d.id)
			froms = append(froms, r.from(d))
		}
	})
	fs.mu.Lock()
	if r.State != RolloutRunning {
		v := r.view()
		fs.mu.Unlock()
		return v, false, nil
	}
	limit := r.waveLimit(r.Wave + 1)
	var wave []RolloutDevice
	for i, id := range ids {
		if len(wave) == limit {
			break
		}
		if _, busy := fs.places(r)[id]; busy {
			continue
		}
		if _, done := r.targets[id]; done {
			continue // verified, failed or canceled in this rollout already
		}
		wave = append(wave, RolloutDevice{RolloutID: r.ID, DeviceID: id, Wave: r.Wave + 1, State: DevicePending, From: froms[i], UpdatedAt: ts})
	}
	if len(wave) == 0 {
		r.State, r.Reason, r.UpdatedAt = RolloutDone, fmt.Sprintf("%d verified, %d failed", r.count[DeviceVerified], r.count[DeviceFailed]), ts
		fs.finishLocked(r)
		v := r.view()
		fs.mu.Unlock()
		fs.log.Info("rollout done", "rollout", r.ID, "reason", r.Reason)
		return v, false, nil
	}
	next := r.view()
	next.Wave++
	next.UpdatedAt = ts
	fs.mu.Unlock()
	// The wave's rows are stored before any device is offered the firmware.
	if fs.clustered() {
		// With the wave number, if no other node changed the rollout.
		ok, err := fs.startWaveClustered(ctx, next, wave)
		if err != nil || !ok {
			fs.mu.Lock()
			defer fs.mu.Unlock()
			return r.view(), true, err
		}
	} else if st := fs.store; st != nil {
		fs.storeMu.Lock()
		err := saveChunks(ctx, st, wave)
		fs.storeMu.Unlock()
		if err != nil {
			return Rollout{}, false, err
		}
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	r.Wave++
	r.waveSize, r.waveFailed = 0, 0
	r.UpdatedAt = ts
	places := fs.places(r)
	for _, d := range wave {
		t := &target{RolloutDevice: d, r: r}
		r.add(t)
		places[d.DeviceID] = t
	}
	fs.placed(r)
	fs.release(r, wave)
	fs.log.Info("rollout wave started", "rollout", r.ID, "wave", r.Wave, "devices", len(wave))
	return r.view(), fs.clustered(), nil
}

// saveChunks stores ds in bounded statements.
func saveChunks(ctx context.Context, st FirmwareStore, ds []RolloutDevice) error {
	for len(ds) > 0 {
		n := min(len(ds), 1000)
		if err := st.SaveRolloutDevices(ctx, ds[:n]); err != nil {
			return err
		}
		ds = ds[n:]
	}
	return nil
}

// flushRollouts writes the devices whose state changed since the last
// flush; on failure they are written with the next.
func (fs *firmwareState) flushRollouts(ctx context.Context) error {
	fs.mu.Lock()
	if len(fs.dirty) == 0 || fs.store == nil {
		clear(fs.dirty)
		fs.mu.Unlock()
		return nil
	}
	out := make([]RolloutDevice, 0, len(fs.dirty))
	for t := range fs.dirty {
		out = append(out, t.RolloutDevice)
	}
	dirty := fs.dirty
	fs.dirty = map[*target]struct{}{}
	fs.mu.Unlock()
	fs.storeMu.Lock()
	var err error
	if fs.clustered() {
		err = fs.rc.MergeRolloutDevices(ctx, out) // a stored final state stays
	} else {
		err = saveChunks(ctx, fs.store, out)
	}
	fs.storeMu.Unlock()
	if err != nil {
		fs.mu.Lock()
		for t := range dirty {
			fs.dirty[t] = struct{}{}
		}
		fs.mu.Unlock()
	}
	return err
}
