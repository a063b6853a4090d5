// Package fleet is Drover's domain core: device registration, state pushes,
// configuration profiles, sync state and liveness. It keeps the whole fleet
// in memory for the hot path and persists through a Store and a Persister.
package fleet

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Errors every room of the fleet returns.
var (
	// ErrNotFound is returned for an ID or name the fleet does not hold.
	ErrNotFound = errors.New("not found")
	// ErrInvalid is wrapped by every *FieldError.
	ErrInvalid = errors.New("invalid input")
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
