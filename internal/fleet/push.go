package fleet

// The push, read top to bottom. A device's push takes five steps, each one
// function below, in this order:
//
//  1. authenticate: the token names a device and is its token, compared
//     once, under the device's lock (authenticate);
//  2. admit: the device may push: within its push quota, checked once
//     (the quota rules are quota.go's), and neither blocked nor
//     decommissioned (admit);
//  3. resolve profile: a push reporting another firmware selects the
//     device's profile by the policy, profileselect.go (resolveProfile);
//  4. enqueue: the push is charged to the quota (it may be free: quota.go),
//     the state and, within the history quota, a sample go to the grouped
//     commit, and the device's memory is updated under its lock (enqueue);
//  5. after commit: subscribers hear the push (events.go), commands are
//     handed out, the answer carries the configuration and the firmware
//     offer (afterCommit).
//
// Steps 1 and 2 also run before the request's body is read (CheckPush), so
// that a push over its quota is refused cheaply; the server then hands
// their result to Push on the request's context (WithPushAuth), and Push
// does not run them again.

import (
	"context"
	"strings"
	"time"

	"github.com/drover/drover/internal/protocol"
)

// Push records a device's state and tells it what to change: the pipeline
// above. In cluster mode a token memory refuses is checked against the
// database first (checkStored).
func (s *Service) Push(ctx context.Context, token string, p protocol.PushRequest) (protocol.PushResponse, error) {
	a, err := s.pushAuth(ctx, token) // steps 1 and 2
	if err != nil {
		return protocol.PushResponse{}, err
	}
	now := s.now()
	if s.layerState.any.Load() {
		s.labelNames() // renewed, should labels have changed: read under the device's lock below
	}
	newProfile, newFirmware, err := s.resolveProfile(ctx, a.d, p.State.Firmware)
	if err != nil {
		return protocol.PushResponse{}, err
	}
	c, err := s.enqueue(a.d, &p, now, newProfile, newFirmware)
	if newProfile != nil && !c.tookProfile {
		newProfile.release() // the one place a selected profile is given back
	}
	if err != nil {
		return protocol.PushResponse{}, err
	}
	return s.afterCommit(ctx, a.d, &p, &c)
}

// PushAuth is a push authenticated and admitted (steps 1 and 2), before
// its body is read: CheckPush makes it, WithPushAuth hands it to Push.
type PushAuth struct {
	token string
	d     *device // the device the token is the token of; nil: none
	err   error   // why the push is refused; nil: admitted
}

// Token is the token this PushAuth was made for.
func (a *PushAuth) Token() string { return a.token }

// WithPushAuth returns ctx carrying a copy of a, for Push with a's token.
func WithPushAuth(ctx context.Context, a *PushAuth) context.Context {
	return &pushAuthContext{Context: ctx, a: *a}
}

// pushAuthContext is a context carrying a PushAuth: one allocation per
// push (context.WithValue would box the PushAuth as well).
type pushAuthContext struct {
	context.Context
	a PushAuth
}

type pushAuthKey struct{}

func (c *pushAuthContext) Value(key any) any {
	if _, ok := key.(pushAuthKey); ok {
		return &c.a
	}
	return c.Context.Value(key)
}

// CheckPush authenticates a push and admits it (steps 1 and 2), before its
// body is read and decoded, so that a flooding device costs the server
// little. The error is the refusal Push gives: a *QuotaError for a device
// over its quota, ErrUnauthorized, ErrBlocked or ErrDecommissioned.
func (s *Service) CheckPush(token string) (*PushAuth, error) {
	a := s.checkPush(token)
	return &a, a.err
}

func (s *Service) checkPush(token string) PushAuth {
	a := PushAuth{token: token, err: ErrUnauthorized}
	d, hash, ok := s.deviceForToken(token)
	if !ok {
		return a
	}
	now := s.now().UnixNano()
	d.mu.Lock()
	authentic := authenticate(d, hash)
	var q pushLimits
	if authentic {
		q = s.readLimits(d, now)
	}
	d.mu.Unlock()
	if authentic {
		a.d, a.err = d, s.admit(d.id, q, now)
	}
	return a
}

// pushAuth is steps 1 and 2 for Push: CheckPush's result on ctx for this
// token, or CheckPush now. A token memory refuses is, in cluster mode,
// looked up again after the device is read back: it may have registered
// on another node a moment ago.
func (s *Service) pushAuth(ctx context.Context, token string) (PushAuth, error) {
	var a PushAuth
	if checked, _ := ctx.Value(pushAuthKey{}).(*PushAuth); checked != nil && checked.token == token {
		a = *checked
	} else {
		a = s.checkPush(token)
	}
	if a.err == ErrUnauthorized {
		if ok, err := s.checkStored(ctx, token); err != nil {
			return a, err
		} else if ok {
			a = s.checkPush(token)
		}
	}
	return a, a.err
}

// authenticate is step 1: whether the token hashed to hash is d's (d.mu
// held). A deleted device has no token and no profile.
func authenticate(d *device, hash [32]byte) bool {
	return hashEq(hash, d.tokenHash) && d.profile != nil
}

// pushLimits is what admit decides on, read under the device's lock: the
// push quota's verdict and the device's admission.
type pushLimits struct {
	within    bool          // within the push quota
	wait      time.Duration // when not: until the device may push again
	admission Admission
}

// readLimits reads a push of d at now against its limits (d.mu held): the
// one check of the push quota. Whether the push is a start (isStart) is
// not known before the body is read; it changes whether the push is
// counted (enqueue), never whether it is refused (pushFree).
func (s *Service) readLimits(d *device, now int64) pushLimits {
	_, wait, ok, _ := s.quota.pushFree(d, now, d.profile.interval(), false)
	return pushLimits{within: ok, wait: wait, admission: d.admission}
}

// admit is step 2: a push over its device's quota (unless the device's
// quotas are lifted) is refused and recorded, so is a push of a blocked or
// decommissioned device.
func (s *Service) admit(id uint64, q pushLimits, now int64) error {
	if !q.within && !s.quota.isLifted(id, now) {
		return s.overQuota(id, q.wait, now)
	}
	return admissionError(q.admission)
}

// overQuota records a refused push and says when to come back.
func (s *Service) overQuota(id uint64, wait time.Duration, now int64) error {
	s.quota.note(id, QuotaPushRate, now)
	return &QuotaError{DeviceID: id, RetryAfter: wait}
}

// resolveProfile is step 3: a push reporting another firmware than the
// device's selects the profile the policy gives the device on it (it may
// create it, within the device type's profile creation quota), and the
// firmware as the device is to record it. The selected profile is the
// caller's to adopt or release; nil: unchanged.
func (s *Service) resolveProfile(ctx context.Context, d *device, fw string) (*profileEntry, string, error) {
	if fw == "" {
		return nil, "", nil
	}
	d.mu.Lock()
	changed, deviceType, prev := fw != d.firmware, d.deviceType, d.profile
	d.mu.Unlock()
	if !changed {
		return nil, "", nil
	}
	return s.selectProfile(ctx, profileKey{deviceType, fw}, prev, d.id)
}

// committed is what enqueue did, for afterCommit.
type committed struct {
	ticket      Ticket
	now         time.Time
	profile     *profileEntry // the device's profile after the push
	firmware    string        // the device's firmware after the push
	moved       bool          // to another firmware
	tookProfile bool          // the device adopted enqueue's new profile
	historyHit  bool          // the sample was dropped by the history quota
	claim       bool          // cluster mode: ask the database for commands
	cmds        []protocol.Command
	cmdChanges  []DeviceCommand
}

// enqueue is step 4: under the device's lock, the push is charged to its
// quota (free when the server asked for it or it is a start: quota.go),
// its state and a sample (when the history quota keeps it) are enqueued
// for the grouped commit, and memory takes the push: firmware and profile,
// last seen, applied version, commands delivered. Nothing changes when
// the enqueue fails.
func (s *Service) enqueue(d *device, p *protocol.PushRequest, now time.Time, newProfile *profileEntry, newFirmware string) (committed, error) {
	c := committed{now: now}
	nowNS := now.UnixNano()
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.profile == nil {
		return c, ErrUnauthorized // deleted since it was authenticated
	}
	// The charge: the push clock to store, and whether the push is free.
	// Whether it is refused was admit's to say; should another push of
	// the device have taken the room since (two connections at once),
	// this one, admitted, is taken without a charge.
	start := isStart(p.Started, p.State.Uptime, d.lastSeen, nowNS)
	tat, _, charged, free := s.quota.pushFree(d, nowNS, d.profile.interval(), start)
	c.firmware, c.profile = d.firmware, d.profile
	if newProfile != nil && newProfile.get().DeviceType == d.deviceType {
		c.firmware, c.profile = newFirmware, newProfile
	}
	lastSample, keep, hit := s.quota.keepSample(d, nowNS, c.profile.interval())
	if !keep && s.quota.isLifted(d.id, nowNS) {
		lastSample, keep, hit = s.quota.ticks(nowNS), true, false
	}
	c.historyHit = hit && free == counted // a sample dropped from a free push is not the device's doing
	st := StateRecord{
		DeviceID: d.id, Firmware: c.firmware, LastSeen: now, Seq: p.Seq,
		AppliedVersion: p.ConfigVersion, ConfigError: p.ConfigError, State: p.RawState,
	}
	sample := sampleOf(d.id, now, p)
	var err error
	c.ticket, err = s.persist.Enqueue(func(b *Batch) {
		b.States = append(b.States, st)
		if keep {
			b.Samples = append(b.Samples, sample)
		}
	})
	if err != nil {
		return c, err
	}
	if c.profile == newProfile {
		adopt(d, newProfile)
		c.tookProfile = true
	}
	c.moved = d.firmware != c.firmware
	d.firmware = c.firmware
	if charged {
		d.pushTAT = tat
	}
	d.took(free, start)
	if v, _ := d.effectiveAt(p.RawState); Behind(p.ConfigVersion, v) {
		d.oweConfig(v) // the answer sends it
	}
	d.lastSample = lastSample
	d.lastSeen, d.seq, d.appliedVersion = nowNS, p.Seq, p.ConfigVersion
	if d.configError != p.ConfigError {
		d.configError = strings.Clone(p.ConfigError)
	}
	if s.states == nil {
		d.state = string(p.RawState)
	}
	s.noteReported(d, p.RawState) // the index of reported fields, live labels (livelabels.go)
	if s.opts.Cluster != nil {
		// Cluster mode: the database settles delivery (after the push is
		// stored, afterCommit); memory only says whether to ask.
		c.claim = d.cmds != nil
	} else if d.cmds != nil || len(p.Results) > 0 {
		c.cmds, c.cmdChanges = s.commandsOnPush(d, p.Results, nowNS)
	}
	return c, nil
}

// sampleOf is the history sample of a push.
func sampleOf(id uint64, at time.Time, p *protocol.PushRequest) Sample {
	st := &p.State
	sm := Sample{
		DeviceID: id, At: at, Seq: p.Seq, Uptime: st.Uptime, CPU: st.CPU, MemUsed: st.MemUsed,
		MemTotal: st.MemTotal, DiskUsed: st.DiskUsed, DiskTotal: st.DiskTotal, Temperature: st.Temperature,
	}
	if len(st.Interfaces) > 0 {
		var rx, tx uint64
		for _, i := range st.Interfaces {
			rx += i.RxBytes
			tx += i.TxBytes
		}
		sm.RxBytes, sm.TxBytes = &rx, &tx
	}
	if g := st.Signal; g != nil {
		sm.RSSI, sm.RSRP, sm.RSRQ, sm.SINR = g.RSSI, g.RSRP, g.RSRQ, g.SINR
	}
	return sm
}

// afterCommit is step 5, once the push is stored as the persistence mode
// promises: subscribers hear it, commands are handed out (cluster mode:
// claimed in the database) and their changes stored, and the answer
// carries the push interval, a configuration the device is behind on and
// a firmware offer.
func (s *Service) afterCommit(ctx context.Context, d *device, p *protocol.PushRequest, c *committed) (protocol.PushResponse, error) {
	nowNS := c.now.UnixNano()
	if c.historyHit {
		s.quota.note(d.id, QuotaHistory, nowNS)
	}
	if err := c.ticket.Wait(ctx); err != nil {
		return protocol.PushResponse{}, err
	}
	prof := c.profile.get()
	d.mu.Lock()
	version, config := prof.Version, prof.Config
	if d.profile == c.profile {
		version, config = d.effectiveAt(p.RawState) // layers.go: the profile's own without layers
	}
	d.mu.Unlock()
	s.events.pushed(PushEvent{DeviceID: d.id, DeviceType: prof.DeviceType, Firmware: c.firmware, At: c.now, Seq: p.Seq, State: &p.State,
		ConfigVersion: p.ConfigVersion, DesiredVersion: version, ConfigError: p.ConfigError, FirmwareChanged: c.moved, RawState: p.RawState})
	cmds := c.cmds
	if c.claim || (s.opts.Cluster != nil && len(p.Results) > 0) {
		cmds = s.clusterCommandsOnPush(ctx, d, p.Results, c.claim, c.now)
	}
	resp := protocol.PushResponse{PushInterval: prof.PushInterval, Commands: cmds}
	if err := s.saveCommands(ctx, c.cmdChanges); err != nil {
		// Delivered in memory only: they expire without a result.
		s.log.Warn("push: storing command states failed; commands not sent", "device", d.id, "err", err)
		resp.Commands = nil
	} else if len(p.Results) > 0 && s.opts.Cluster == nil {
		s.closeJobsOf(ctx, p.Results, c.cmdChanges)
	}
	if n := len(resp.Commands); n > 0 { // their results are owed
		d.mu.Lock()
		d.owe(n)
		d.mu.Unlock()
	}
	if Behind(p.ConfigVersion, version) {
		resp.Config = &protocol.Config{Version: version, Data: config}
	}
	resp.FirmwareUpdate = s.firmwareOnPush(d.id, c.firmware, p.FirmwareUpdate, c.now)
	s.configOnPush(d.id, p.ConfigVersion, version, p.ConfigError, c.now) // configrollout.go
	return resp, nil
}
