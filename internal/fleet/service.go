// Package fleet is Drover's domain core: device registration, state pushes,
// configuration profiles, sync state and liveness. It keeps the whole fleet
// in memory for the hot path and persists through a Store and a Persister.
package fleet

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/drover/drover/internal/protocol"
)

// Errors of the fleet's operations.
var (
	ErrEnrollment   = errors.New("wrong enrollment secret")
	ErrUnauthorized = errors.New("unknown or revoked token")
	ErrNotFound     = errors.New("not found")
)

// Options configure a Service.
type Options struct {
	EnrollmentSecret    string
	DefaultPushInterval int // seconds, for profiles created by default
	Logger              *slog.Logger
	Now                 func() time.Time
	// Admission is the policy for new machine IDs (admission.go).
	Admission Policy
	// RequireCertificate refuses registrations without a client
	// certificate naming the machine ID (Proof.CertNames).
	RequireCertificate bool
	// Quotas are the per-device quotas (quota.go); zero: none.
	Quotas QuotaOptions
	// Cluster, when set, is the database several servers share (cluster
	// mode, cluster.go): IDs and registrations are settled there, and
	// memory is refreshed from it.
	Cluster ClusterStore
	// ClusterRollouts, in cluster mode, is where rollouts are settled
	// between the nodes (rollout_cluster.go); set with Cluster.
	ClusterRollouts RolloutCluster
	// RolloutDriver, in cluster mode, says whether this node drives the
	// rollouts (starts waves, pauses, fails stalled devices): the
	// cluster's leader (rollout_cluster.go). Nil: it does.
	RolloutDriver func() bool
}

// Service is the fleet.
type Service struct {
	opts    Options
	store   Store
	history HistoryDropper // nil: none
	persist Persister
	// states reads current states from the store; nil: they stay in memory.
	states StateReader
	log    *slog.Logger
	now    func() time.Time

	regMu      sync.Mutex   // registration: machineIDs, nextID, interned, slab
	machineIDs machineIndex // machine ID -> device ID (registry.go)
	nextID     uint64
	interned   map[string]string
	slab       []device // the rest of the current slab (registry.go)

	devMu   sync.RWMutex
	devices []*device // index: device ID; nil where no device

	profiles     *profiles
	profileWrite sync.Mutex // serialises profile updates

	labels labelRegistry // labels.go
	trust  trustRegistry // enrollment.go
	quota  *quotas       // quota.go
	policy policyState   // policy.go
	fw     firmwareState // firmware.go, rollout.go, profilehistory.go
	cmds   commands      // commands.go

	cluster clusterState // cluster.go
	events  subscribers  // events.go

	secret enrollmentSecret // secret.go
}

// New loads the fleet from its stores (none: in memory) and returns the
// Service. It is the one load path: devices and profiles, then the profile
// policy, trust and labels, from whichever of st are set.
func New(ctx context.Context, st Stores, p Persister, opts Options) (*Service, error) {
	if opts.DefaultPushInterval <= 0 {
		opts.DefaultPushInterval = 200
	}
	if err := CheckPushInterval(opts.DefaultPushInterval); err != nil {
		return nil, fmt.Errorf("default push interval %d: %w", opts.DefaultPushInterval, err)
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if p == nil {
		p = Memory{}
	}
	s := &Service{
		opts: opts, store: st.Devices, history: st.History, persist: p, log: opts.Logger, now: opts.Now,
		machineIDs: make(machineIndex), interned: make(map[string]string), nextID: 1,
		devices: make([]*device, 1, 1024),
	}
	s.trust.init()
	s.fw.init()
	if opts.Cluster != nil {
		s.cluster.init()
	}
	s.quota = newQuotas(opts.Quotas, s.now())
	pol := DefaultProfilePolicy()
	s.policy.policy.Store(&pol)
	store := st.Devices
	if store == nil {
		s.profiles = newProfiles(nil, 0)
		return s, nil
	}
	if _, wt := p.(*WriteThrough); wt {
		s.states = st.States
	}
	var loaded []*device
	res, err := store.Load(ctx, func(r DeviceRecord) error {
		d := s.newDevice()
		d.id, d.deviceType, d.model = r.ID, s.intern(r.DeviceType), s.intern(r.Model)
		d.firmware, d.registeredAt = s.intern(r.Firmware), r.RegisteredAt.Unix()
		d.seq, d.appliedVersion, d.configError = r.State.Seq, r.State.AppliedVersion, r.State.ConfigError
		d.setIDs(r.MachineID, r.Serial)
		copy(d.tokenHash[:], r.TokenHash)
		if !r.State.LastSeen.IsZero() {
			d.lastSeen = r.State.LastSeen.UnixNano()
		}
		if len(r.State.State) > 0 && s.states == nil {
			d.state = string(r.State.State)
		}
		if r.State.Firmware != "" {
			d.firmware = s.intern(r.State.Firmware)
		}
		loaded = append(loaded, d)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("load fleet: %w", err)
	}
	s.profiles = newProfiles(res.Profiles, res.MaxProfileID)
	if st.Policy != nil {
		if err := s.loadPolicy(ctx, st.Policy); err != nil {
			return nil, err
		}
	}
	if st.Firmware != nil {
		if err := s.loadFirmware(ctx, st.Firmware); err != nil {
			return nil, err
		}
	}
	s.nextID = res.MaxDeviceID + 1
	s.devices = make([]*device, s.nextID, s.nextID+s.nextID/4+1024)
	for _, d := range loaded {
		pe, err := s.loadProfile(ctx, profileKey{d.deviceType, d.firmware})
		if err != nil {
			return nil, fmt.Errorf("load fleet: profile of device %d: %w", d.id, err)
		}
		d.profile = pe
		s.devices[d.id] = d
		s.machineIDs.set(d.machineID(), d.id)
	}
	if st.Trust != nil {
		if err := s.loadTrust(ctx, st.Trust); err != nil {
			return nil, err
		}
	}
	if st.Labels != nil {
		if err := s.loadLabels(ctx, st.Labels); err != nil {
			return nil, err
		}
	}
	if st.Commands != nil {
		if err := s.loadCommands(ctx, st.Commands); err != nil {
			return nil, err
		}
	}
	return s, nil
}

func (s *Service) intern(v string) string {
	if v == "" {
		return ""
	}
	if i, ok := s.interned[v]; ok {
		return i
	}
	v = strings.Clone(v)
	s.interned[v] = v
	return v
}

// place puts d in the registry under its ID and machine ID and returns the
// device it replaced (nil if none). The caller holds regMu.
func (s *Service) place(d *device) (old *device) {
	s.devMu.Lock()
	for uint64(len(s.devices)) <= d.id {
		s.devices = append(s.devices, nil)
	}
	old, s.devices[d.id] = s.devices[d.id], d
	s.devMu.Unlock()
	s.machineIDs.set(d.machineID(), d.id)
	return old
}

func (s *Service) get(id uint64) *device {
	s.devMu.RLock()
	defer s.devMu.RUnlock()
	if id >= uint64(len(s.devices)) {
		return nil
	}
	return s.devices[id]
}

// newToken makes "<device id>.<secret>" and its SHA-256.
func newToken(id uint64) (string, [32]byte) {
	var secret [24]byte
	if _, err := rand.Read(secret[:]); err != nil {
		panic(err) // crypto/rand never fails on Linux
	}
	buf := make([]byte, 0, 20+1+32)
	buf = strconv.AppendUint(buf, id, 10)
	buf = append(buf, '.')
	buf = base64.RawURLEncoding.AppendEncode(buf, secret[:])
	return string(buf), sha256.Sum256(buf)
}

// deviceForToken finds the device a token names; the token is checked later
// under the device lock.
func (s *Service) deviceForToken(token string) (*device, [32]byte, bool) {
	dot := strings.IndexByte(token, '.')
	if dot <= 0 {
		return nil, [32]byte{}, false
	}
	id, err := strconv.ParseUint(token[:dot], 10, 64)
	if err != nil {
		return nil, [32]byte{}, false
	}
	d := s.get(id)
	if d == nil {
		return nil, [32]byte{}, false
	}
	return d, sha256.Sum256([]byte(token)), true
}

// Push records a device's state and tells it what to change. In cluster
// mode a token memory refuses is checked against the database first.
func (s *Service) Push(ctx context.Context, token string, p protocol.PushRequest) (protocol.PushResponse, error) {
	return s.PushChecked(ctx, s.auth(token), p)
}

// PushChecked is Push with the token already looked up (CheckPush).
func (s *Service) PushChecked(ctx context.Context, a PushAuth, p protocol.PushRequest) (protocol.PushResponse, error) {
	resp, err := s.push(ctx, a, p)
	if errors.Is(err, ErrUnauthorized) {
		if ok, cerr := s.checkStored(ctx, a.token); cerr != nil {
			return resp, cerr
		} else if ok {
			return s.push(ctx, s.auth(a.token), p)
		}
	}
	return resp, err
}

func (s *Service) push(ctx context.Context, a PushAuth, p protocol.PushRequest) (protocol.PushResponse, error) {
	d, hash := a.d, a.hash
	if d == nil {
		return protocol.PushResponse{}, ErrUnauthorized
	}
	now := s.now()
	nowNS := now.UnixNano()
	// A firmware upgrade moves the device to the profile the policy
	// selects (policy.go); a push over quota is refused before that.
	var newProfile *profileEntry
	var newFirmware string
	if fw := p.State.Firmware; fw != "" {
		d.mu.Lock()
		if subtle.ConstantTimeCompare(hash[:], d.tokenHash[:]) != 1 {
			d.mu.Unlock()
			return protocol.PushResponse{}, ErrUnauthorized
		}
		changed, deviceType, prev := fw != d.firmware, d.deviceType, d.profile
		_, wait, ok, _ := s.quota.pushFree(d, nowNS, d.profile.interval(), isStart(p.Started, p.State.Uptime, d.lastSeen, nowNS))
		d.mu.Unlock()
		if !ok && !s.quota.isLifted(d.id, nowNS) {
			return protocol.PushResponse{}, s.overQuota(d.id, wait, nowNS)
		}
		if changed {
			pe, canon, err := s.selectProfile(ctx, profileKey{deviceType, fw}, prev, d.id)
			if err != nil {
				return protocol.PushResponse{}, err
			}
			newProfile, newFirmware = pe, canon
		}
	}
	d.mu.Lock()
	if subtle.ConstantTimeCompare(hash[:], d.tokenHash[:]) != 1 {
		d.mu.Unlock()
		if newProfile != nil {
			newProfile.release()
		}
		return protocol.PushResponse{}, ErrUnauthorized
	}
	if err := admissionError(d.admission); err != nil { // blocked: nothing is stored
		d.mu.Unlock()
		if newProfile != nil {
			newProfile.release()
		}
		return protocol.PushResponse{}, err
	}
	start := isStart(p.Started, p.State.Uptime, d.lastSeen, nowNS)
	tat, wait, ok, free := s.quota.pushFree(d, nowNS, d.profile.interval(), start)
	if !ok && !s.quota.isLifted(d.id, nowNS) {
		d.mu.Unlock()
		if newProfile != nil {
			newProfile.release()
		}
		return protocol.PushResponse{}, s.overQuota(d.id, wait, nowNS)
	}
	firmware, pe := d.firmware, d.profile
	if newProfile != nil && newProfile.get().DeviceType == d.deviceType {
		firmware, pe = newFirmware, newProfile
	}
	lastSample, keep, hit := s.quota.keepSample(d, nowNS, pe.interval())
	if !keep && s.quota.isLifted(d.id, nowNS) {
		lastSample, keep, hit = s.quota.ticks(nowNS), true, false
	}
	hit = hit && free == counted // a sample dropped from a free push is not the device's doing
	var cmds []protocol.Command
	var cmdChanges []DeviceCommand
	var moved bool // to another firmware
	claim := false
	st := StateRecord{
		DeviceID: d.id, Firmware: firmware, LastSeen: now, Seq: p.Seq,
		AppliedVersion: p.ConfigVersion, ConfigError: p.ConfigError, State: p.RawState,
	}
	sample := sampleOf(d.id, now, &p)
	ticket, err := s.persist.Enqueue(func(b *Batch) {
		b.States = append(b.States, st)
		if keep {
			b.Samples = append(b.Samples, sample)
		}
	})
	if err == nil {
		if pe != d.profile {
			adopt(d, pe)
		} else if newProfile != nil {
			newProfile.release()
		}
		moved = d.firmware != firmware
		d.firmware = firmware
		if ok {
			d.pushTAT = tat
		}
		d.took(free, start)
		if Behind(p.ConfigVersion, pe.version()) {
			d.oweConfig(pe.version()) // the answer sends it
		}
		d.lastSample = lastSample
		d.lastSeen, d.seq, d.appliedVersion = nowNS, p.Seq, p.ConfigVersion
		if d.configError != p.ConfigError {
			d.configError = strings.Clone(p.ConfigError)
		}
		if s.states == nil {
			d.state = string(p.RawState)
		}
		if s.opts.Cluster != nil {
			// Cluster mode: the database settles delivery (after the
			// push is stored, below); memory only says whether to ask.
			claim = d.cmds != nil
		} else if d.cmds != nil || len(p.Results) > 0 {
			cmds, cmdChanges = s.commandsOnPush(d, p.Results, nowNS)
		}
	} else if newProfile != nil {
		newProfile.release()
	}
	d.mu.Unlock()
	if err != nil {
		return protocol.PushResponse{}, err
	}
	if hit {
		s.quota.note(d.id, QuotaHistory, nowNS)
	}
	if err := ticket.Wait(ctx); err != nil {
		return protocol.PushResponse{}, err
	}
	prof := pe.get()
	s.events.pushed(PushEvent{DeviceID: d.id, DeviceType: prof.DeviceType, Firmware: firmware, At: now, Seq: p.Seq, State: &p.State,
		ConfigVersion: p.ConfigVersion, DesiredVersion: prof.Version, ConfigError: p.ConfigError, FirmwareChanged: moved})
	if claim || (s.opts.Cluster != nil && len(p.Results) > 0) {
		cmds = s.clusterCommandsOnPush(ctx, d, p.Results, claim, now)
	}
	resp := protocol.PushResponse{PushInterval: prof.PushInterval, Commands: cmds}
	if err := s.saveCommands(ctx, cmdChanges); err != nil {
		// Delivered in memory only: they expire without a result.
		s.log.Warn("push: storing command states failed; commands not sent", "device", d.id, "err", err)
		resp.Commands = nil
	} else if len(p.Results) > 0 && s.opts.Cluster == nil {
		s.closeJobsOf(ctx, p.Results, cmdChanges)
	}
	if n := len(resp.Commands); n > 0 { // their results are owed
		d.mu.Lock()
		d.owe(n)
		d.mu.Unlock()
	}
	if Behind(p.ConfigVersion, prof.Version) {
		resp.Config = &protocol.Config{Version: prof.Version, Data: prof.Config}
	}
	resp.FirmwareUpdate = s.firmwareOnPush(d.id, firmware, p.FirmwareUpdate, now)
	return resp, nil
}

// overQuota records a refused push and says when to come back.
func (s *Service) overQuota(id uint64, wait time.Duration, now int64) error {
	s.quota.note(id, QuotaPushRate, now)
	return &QuotaError{DeviceID: id, RetryAfter: wait}
}

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

// Filter selects devices. Zero fields match everything.
type Filter struct {
	SyncState  *SyncState
	Liveness   *Liveness
	DeviceType string
	Firmware   string
	ProfileID  uint64
	Text       string   // substring of machine ID or serial
	Labels     []uint16 // label IDs (LabelIDs); a device must have all
	Admission  AdmissionFilter
	// Quota selects devices by quota (QuotaFilters); set by ParseFilter,
	// which resolves it.
	Quota    string
	quotaIDs map[uint64]struct{}
}

func (f *Filter) match(d *device, now int64) bool {
	if f.DeviceType != "" && d.deviceType != f.DeviceType {
		return false
	}
	if f.Firmware != "" && d.firmware != f.Firmware {
		return false
	}
	if f.ProfileID != 0 && d.profile.get().ID != f.ProfileID {
		return false
	}
	if f.SyncState != nil && d.syncState() != *f.SyncState {
		return false
	}
	if f.Liveness != nil && d.liveness(now) != *f.Liveness {
		return false
	}
	if f.Text != "" && !strings.Contains(d.machineID(), f.Text) && !strings.Contains(d.serial(), f.Text) {
		return false
	}
	if len(f.Labels) > 0 && !d.hasLabels(f.Labels) {
		return false
	}
	if f.Quota != "" {
		if _, ok := f.quotaIDs[d.id]; !ok {
			return false
		}
	}
	return f.Admission.match(d)
}

// Device returns one device with its current state.
func (s *Service) Device(ctx context.Context, id uint64) (Device, error) {
	d := s.get(id)
	if d == nil {
		return Device{}, ErrNotFound
	}
	snap := d.snapshot(s.now().UnixNano(), s.states == nil)
	if s.states != nil && snap.LastSeen != nil {
		st, err := s.states.DeviceState(ctx, id)
		if err != nil {
			return Device{}, err
		}
		snap.State = st
	}
	return snap, nil
}

// History reads a device's stored samples.
func (s *Service) History(ctx context.Context, id uint64, q HistoryQuery) ([]Sample, error) {
	if s.get(id) == nil {
		return nil, ErrNotFound
	}
	if s.store == nil {
		return []Sample{}, nil
	}
	return s.store.History(ctx, id, q)
}

// Stats counts devices by sync state and liveness.
type Stats struct {
	Devices  int            `json:"devices"`
	Sync     map[string]int `json:"sync"`
	Liveness map[string]int `json:"liveness"`
}

// Counts returns device counts by sync state and by liveness.
func (s *Service) Counts() (sync [4]int, live [4]int, total int) {
	now := s.now().UnixNano()
	s.devMu.RLock()
	all := s.devices
	s.devMu.RUnlock()
	for _, d := range all {
		if d == nil {
			continue
		}
		d.mu.Lock()
		if d.profile != nil {
			sync[d.syncState()]++
			live[d.liveness(now)]++
			total++
		}
		d.mu.Unlock()
	}
	return sync, live, total
}

// Stats returns Counts with names.
func (s *Service) Stats() Stats {
	syncs, lives, total := s.Counts()
	st := Stats{Devices: total, Sync: map[string]int{}, Liveness: map[string]int{}}
	for _, v := range AllSyncStates() {
		st.Sync[v.String()] = syncs[v]
	}
	for _, v := range AllLiveness() {
		st.Liveness[v.String()] = lives[v]
	}
	return st
}

// PruneHistory deletes samples older than retention, in chunks so that it
// never holds the store for long. It returns how many it deleted.
func (s *Service) PruneHistory(ctx context.Context, retention time.Duration) (int64, error) {
	if s.store == nil || retention <= 0 {
		return 0, nil
	}
	before := s.now().Add(-retention)
	var total int64
	if s.history != nil {
		n, err := s.history.DropHistory(ctx, before)
		if total = n; err != nil {
			return total, err
		}
	}
	for {
		n, err := s.store.PruneHistory(ctx, before, 10000)
		total += n
		if err != nil || n < 10000 {
			return total, err
		}
	}
}

func sortProfiles(ps []Profile) {
	sort.Slice(ps, func(i, j int) bool { return ps[i].ID < ps[j].ID })
}
