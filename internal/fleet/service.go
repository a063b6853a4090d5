// Package fleet is Drover's domain core: device registration, state pushes,
// configuration profiles, sync state and liveness. It keeps the whole fleet
// in memory for the hot path and persists through a Store and a Persister.
package fleet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
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
	// Progress, if set, is kept up to date while New loads the devices.
	Progress *LoadProgress
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

	*profiles // profile.go, profileselect.go

	layerState    // layers.go, layermerge.go, layerschema.go
	labels        // labels.go, livelabels.go, stateindex.go, where.go
	trust         // admission.go, enrollment.go, secret.go
	*quota        // quota.go
	policy        // policy.go
	firmwareState // firmware.go, rollout.go, rollout_cluster.go, profilehistory.go
	commands      // commands.go, commands_cluster.go

	cluster             // cluster.go
	events  subscribers // events.go
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
	if _, wt := p.(*WriteThrough); wt && st.Devices != nil {
		s.states = st.States
	}
	s.layerState.init()
	s.layerState.wire(s)
	s.labels.wire(s)
	s.commands.wire(s)
	s.trust.wire(s)
	s.firmwareState.wire(s)
	s.cluster.wire(s)
	s.quota = newQuotas(opts.Quotas, s.now())
	s.quota.wire(s)
	s.policy.wire(s)
	store := st.Devices
	if store == nil {
		s.profiles = newProfiles(nil, 0, &s.layerState)
		s.profiles.wire(s)
		return s, nil
	}
	// Labels are read first: the state paths live labels use are indexed
	// as the devices load.
	var rd labelsRead
	var cols []*column
	if st.Labels != nil {
		var err error
		if rd, err = readLabels(ctx, st.Labels); err != nil {
			return nil, err
		}
		cols = s.labels.index.preset(rd.statePaths())
	}
	res, loaded, err := s.loadDevices(ctx, store, opts.Progress, cols)
	if err != nil {
		return nil, fmt.Errorf("load fleet: %w", err)
	}
	s.profiles = newProfiles(res.Profiles, res.MaxProfileID, &s.layerState)
	s.profiles.wire(s)
	if st.Policy != nil {
		// The policy, then the links to the profiles and the lifted quotas.
		data, err := st.Policy.LoadPolicy(ctx)
		if err != nil {
			return nil, fmt.Errorf("load profile policy: %w", err)
		}
		if err := s.policy.loaded(st.Policy, data.Policy); err != nil {
			return nil, err
		}
		s.profiles.loadLinks(data.Links, s.intern)
		s.quota.loadLifts(data.Lifts)
		s.policy.replaceRolloutPolicies(data.RolloutPolicies)
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
	}
	if st.Trust != nil {
		if err := s.loadTrust(ctx, st.Trust); err != nil {
			return nil, err
		}
	}
	if st.Labels != nil {
		if err := s.loadLabels(ctx, st.Labels, rd); err != nil {
			return nil, err
		}
	}
	if st.Commands != nil {
		if err := s.loadCommands(ctx, st.Commands); err != nil {
			return nil, err
		}
	}
	if st.Layers != nil {
		if err := s.loadLayers(ctx, st.Layers); err != nil {
			return nil, fmt.Errorf("load configuration layers: %w", err)
		}
	}
	return s, nil
}

// deviceFinder is what the rooms need of the registry: a device by ID,
// and every device in turn (d.mu held during fn). The Service implements
// it.
type deviceFinder interface {
	get(id uint64) *device
	each(fn func(d *device))
}

// lastID is the highest device ID handed out here so far.
func (s *Service) lastID() uint64 {
	s.devMu.RLock()
	defer s.devMu.RUnlock()
	return uint64(len(s.devices)) - 1
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
