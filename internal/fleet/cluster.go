package fleet

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
)

// ClusterStore is what the fleet needs from a database that several
// servers share (cluster mode, docs/cluster.md): IDs the database hands
// out, registrations it settles, and single rows read back when another
// node changed them. With Options.Cluster set, the fleet's memory is a
// cache of the database, refreshed through ApplyChange.
type ClusterStore interface {
	// NextDeviceID hands out a device ID no node has used.
	NextDeviceID(ctx context.Context) (uint64, error)
	// ClaimDevice stores a new device and its trust record unless its
	// machine ID is stored already (then won is false and nothing is
	// written). The database's unique machine ID settles races.
	ClaimDevice(ctx context.Context, rec DeviceRecord, tr TrustRecord) (won bool, err error)
	// ClaimProfile stores p under a new ID unless a profile for its type and
	// firmware exists; it returns the stored one either way, and won when
	// this call stored it.
	ClaimProfile(ctx context.Context, p Profile) (stored Profile, won bool, err error)
	// ReadDevice reads one device with its trust record; ok is false when
	// it is not stored (never registered, or deleted).
	ReadDevice(ctx context.Context, id uint64) (rec DeviceRecord, tr TrustRecord, ok bool, err error)
	// DeviceIDOf finds a machine ID's device.
	DeviceIDOf(ctx context.Context, machineID string) (uint64, bool, error)
	// ReadProfile reads one profile; ProfileOf the one of a device type
	// and firmware.
	ReadProfile(ctx context.Context, id uint64) (Profile, bool, error)
	ProfileOf(ctx context.Context, deviceType, firmware string) (Profile, bool, error)
	// NoteChange adds a change log entry for a change stored outside the
	// grouped commit (labels, the profile policy, quota lifts, enrollment).
	NoteChange(ctx context.Context, kind ChangeKind, id uint64) error
	// NextProfileVersion hands out a configuration version above every
	// one any node has used.
	NextProfileVersion(ctx context.Context) (int64, error)
	// NextFirmwareID hands out a firmware artifact ID no node has used.
	NextFirmwareID(ctx context.Context) (uint64, error)
	// NextLabelID hands out a label ID no node has used (above 65535:
	// no more labels).
	NextLabelID(ctx context.Context) (uint64, error)
	// NextTokenID hands out an enrollment token ID no node has used.
	NextTokenID(ctx context.Context) (uint64, error)
	// UseEnrollmentToken marks token id used by deviceID at at unless it is
	// used or revoked already; the database settles races between nodes.
	UseEnrollmentToken(ctx context.Context, id, deviceID uint64, at time.Time) (bool, error)
	// LoadEnrollment reads the enrollment tokens and preauthorized machine
	// IDs (Tokens and Preauthorized of the TrustState).
	LoadEnrollment(ctx context.Context) (TrustState, error)
	ClusterCommands
}

// ClusterCommands is what remote commands need in cluster mode
// (commands_cluster.go): the database holds every per-device command's
// state, and nodes change it only with conditional statements.
type ClusterCommands interface {
	// NextJobID hands out a job ID no node has used.
	NextJobID(ctx context.Context) (uint64, error)
	// ReadJobs reads the stored jobs among ids, with their counts by state
	// if counts.
	ReadJobs(ctx context.Context, ids []uint64, counts bool) ([]JobRecord, error)
	// QueuedDevices lists at most limit devices with a queued command of
	// the job, with IDs above after, in ID order.
	QueuedDevices(ctx context.Context, jobID, after uint64, limit int) ([]uint64, error)
	// CommandsOnPush, in one transaction, records results (delivered
	// commands only: each once) and claims at most claim queued commands
	// of active, unexpired jobs for the device, marking them delivered at
	// now; two nodes never claim the same one. It returns the claimed
	// jobs (ID, kind, args, timeout) and whether queued ones remain.
	CommandsOnPush(ctx context.Context, deviceID uint64, results []DeviceCommand, claim int, now time.Time) ([]JobRecord, bool, error)
	// FinishDelivered moves delivered commands to their state in cmds
	// (expired), each only if still delivered; it returns how many moved.
	FinishDelivered(ctx context.Context, cmds []DeviceCommand) (int64, error)
	// SetJobState moves a job to state to if its state is one of from.
	SetJobState(ctx context.Context, id uint64, from []JobState, to JobState) (bool, error)
	// CloseJobs marks done each job among ids that is active, no longer
	// creating and has no queued or delivered command left, and returns
	// the IDs it moved. Each job moves once, whichever nodes ask.
	CloseJobs(ctx context.Context, ids []uint64) ([]uint64, error)
	// DeliveredCommands lists at most limit delivered commands whose
	// delivery plus their job's timeout lies before before, oldest first.
	DeliveredCommands(ctx context.Context, before time.Time, limit int) ([]DeviceCommand, error)
}

// RolloutCluster is what rollouts need from a database several nodes
// share; the PostgreSQL adapter implements it next to ClusterStore.
type RolloutCluster interface {
	// NextRolloutID hands out a rollout ID no node has used.
	NextRolloutID(ctx context.Context) (uint64, error)
	// SaveRolloutIf stores r if the stored rollout is still in state
	// prevState at wave prevWave, with wave (the devices of a wave r
	// starts) in the same transaction; a rollout stored as aborted also
	// has its devices still pending or downloading canceled there. ok is
	// false, and nothing is written, when the stored rollout changed.
	SaveRolloutIf(ctx context.Context, r Rollout, prevState string, prevWave int, wave []RolloutDevice) (ok bool, err error)
	// MergeRolloutDevices upserts ds: a stored final state (verified,
	// failed, canceled) stays; otherwise a final state, or a report at
	// least as new as the stored one, replaces it.
	MergeRolloutDevices(ctx context.Context, ds []RolloutDevice) error
	// SyncRollouts reads the rollouts not finished, those of known, and
	// those with an ID above after.
	SyncRollouts(ctx context.Context, known []uint64, after uint64) ([]Rollout, error)
	// RolloutDevicesWritten reads the devices of rollouts written at or
	// after since (the database's clock, unix ms), and that clock now.
	RolloutDevicesWritten(ctx context.Context, rollouts []uint64, since int64) ([]RolloutDevice, int64, error)
}

// ChangeKind says what a change log entry names.
type ChangeKind uint8

// Change kinds.
const (
	ChangeDevice  ChangeKind = 1 // identity, token, trust or deletion
	ChangeProfile ChangeKind = 2
	ChangeLabels  ChangeKind = 3 // a label created, deleted or assigned: read every label back
	ChangePolicy  ChangeKind = 4 // the profile policy or a quota lift: read them back
	// ChangeEnrollment: an enrollment token made, used or revoked, or a
	// preauthorized machine ID added or removed: read them all back.
	ChangeEnrollment ChangeKind = 5
	// ChangeFirmware: a firmware artifact added or deleted: read the
	// artifacts back.
	ChangeFirmware ChangeKind = 6
	// ChangeJob: a remote command job made, paused, resumed, cancelled or
	// done, or given a batch of devices: read the job back and its queued
	// devices past those this node read.
	ChangeJob ChangeKind = 8
	// ChangeAccess: an operator user or API token made, changed, revoked
	// or deleted: drop what is cached of them (OnChange).
	ChangeAccess ChangeKind = 9
	// ChangeAlerts: an alert rule made, changed or deleted, or the e-mail
	// settings changed: read them back (OnChange).
	ChangeAlerts ChangeKind = 10
	// ChangeConfigLayers: a configuration layer or a device type's schema
	// set, deleted or rolled back: read them all back.
	ChangeConfigLayers ChangeKind = 11
)

// Change is one entry of a cluster's change log: something a commit
// changed, to be read back by every node.
type Change struct {
	Seq  int64
	Kind ChangeKind
	ID   uint64
	Node string
	At   time.Time
}

// ClusterNode is a server of a cluster as recorded in the database.
type ClusterNode struct {
	Name      string    `json:"name"`
	Host      string    `json:"host"`
	PID       int       `json:"pid"`
	Address   string    `json:"address,omitempty"`
	StartedAt time.Time `json:"started_at"`
	Heartbeat time.Time `json:"heartbeat"`
	NATS      bool      `json:"nats"` // its NATS connection was up at its heartbeat
}

// PushSummaries is one batch of a node's push summaries stored in the
// database (while some node cannot reach NATS); Body is the node's own
// encoding.
type PushSummaries struct {
	Seq  int64
	Node string
	Body []byte
}

// cluster is the cluster glue room: the fleet's bookkeeping in cluster
// mode, the change log (writing entries, and applying other nodes' ones by
// handing each to the room that keeps what it names), and the second look
// at tokens and machine IDs memory does not know. The Service embeds it,
// so that its exported methods are the Service's.
type cluster struct {
	// deviceReads counts devices read back from the database (change
	// log entries, tokens memory refused, registrations of machine IDs
	// another node stored).
	deviceReads atomic.Uint64
	// refused remembers tokens the database refused a moment ago, so that
	// a device pushing with a stale token costs one read per
	// refusedTTL, not one per push. A token refused by the database never
	// becomes valid later (a new token is secret until its registration
	// committed), so the memory cannot refuse a good token; a change log
	// entry for the device drops its entries all the same.
	mu      sync.Mutex
	refused map[uint64][]refusedToken
	// hooks apply the change log entries of kinds the fleet does not
	// keep (OnChange); mu held.
	hooks map[ChangeKind]func(context.Context, Change) error
	// reads bounds the database reads for refused tokens that are not
	// remembered (unknown devices, new wrong tokens): beyond it the push
	// is answered 503 with Retry-After, never a wrong 401.
	reads *rate.Limiter

	// Set by New: what the room needs of the others.
	store ClusterStore // nil: one server
	devs  clusterDevices
	now   func() time.Time
	log   *slog.Logger
	// readBack applies a change log entry of a kind the fleet keeps, by
	// kind: each room's read-back.
	readBack map[ChangeKind]func(ctx context.Context, id uint64) error
}

// clusterDevices is what the cluster glue needs of the registry.
type clusterDevices interface {
	deviceFinder
	deviceOf(machineID string) (uint64, bool)
	// refreshDevice reads a device back from the database (readback.go).
	refreshDevice(ctx context.Context, id uint64) error
	// noteReported takes a pushed state into the index of reported
	// fields and live labels (stateindex.go); relabel re-evaluates the
	// device's live labels (livelabels.go). d.mu held.
	noteReported(d *device, raw []byte)
	relabel(d *device)
}

type refusedToken struct {
	hash  [32]byte
	until int64 // unix ns
}

const (
	refusedTTL = 10 * time.Second
	// maxRefused bounds the memory of refused tokens (devices).
	maxRefused = 100000
	// storedChecksPerSecond bounds the database reads for tokens memory
	// refused, per node (burst: as many).
	storedChecksPerSecond = 200
)

// wire gives the room what it needs of the others (New): the read-back
// of every kind of change the fleet keeps is the room's that keeps it.
func (c *cluster) wire(s *Service) {
	c.store, c.devs, c.now, c.log = s.opts.Cluster, s, s.now, s.log
	c.readBack = map[ChangeKind]func(context.Context, uint64) error{
		ChangeDevice:     s.refreshDevice,
		ChangeProfile:    func(ctx context.Context, id uint64) error { return s.profiles.refreshProfile(ctx, id) },
		ChangeLabels:     func(ctx context.Context, _ uint64) error { return s.labels.reloadLabels(ctx) },
		ChangePolicy:     func(ctx context.Context, _ uint64) error { return s.reloadPolicy(ctx) },
		ChangeEnrollment: func(ctx context.Context, _ uint64) error { return s.trust.reloadEnrollment(ctx) },
		ChangeFirmware:   func(ctx context.Context, _ uint64) error { return s.firmwareState.reloadFirmware(ctx) },
		ChangeRollout:    func(ctx context.Context, _ uint64) error { return s.firmwareState.SyncRollouts(ctx) },
		ChangeJob:        s.commands.refreshJob,
		ChangeConfigLayers: func(ctx context.Context, _ uint64) error {
			return s.layerState.reloadLayers(ctx)
		},
	}
	if c.store != nil {
		c.reads = rate.NewLimiter(storedChecksPerSecond, storedChecksPerSecond)
	}
}

// mayRead says whether a database read for something memory does not know
// is within the budget (storedChecksPerSecond); cluster mode only.
func (c *cluster) mayRead() bool { return c.reads.Allow() }

// ClusterDeviceReads counts the devices this node read back from the
// database (cluster mode).
func (c *cluster) ClusterDeviceReads() uint64 { return c.deviceReads.Load() }

// wasRefused says whether the database refused this token for device id
// within refusedTTL.
func (c *cluster) wasRefused(id uint64, hash [32]byte, now int64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, r := range c.refused[id] {
		if r.hash == hash && r.until > now {
			return true
		}
	}
	return false
}

func (c *cluster) noteRefused(id uint64, hash [32]byte, now int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.refused == nil || len(c.refused) >= maxRefused {
		c.refused = map[uint64][]refusedToken{}
	}
	list := c.refused[id][:0:0]
	for _, r := range c.refused[id] {
		if r.until > now && len(list) < 3 {
			list = append(list, r)
		}
	}
	c.refused[id] = append(list, refusedToken{hash, now + int64(refusedTTL)})
}

// ApplyChange reads back what a change names and replaces the memory's
// copy; the database is the truth.
func (c *cluster) ApplyChange(ctx context.Context, ch Change) error {
	if ch.Kind == ChangeDevice {
		c.forget(ch.ID)
	}
	if fn := c.readBack[ch.Kind]; fn != nil {
		return fn(ctx, ch.ID)
	}
	c.mu.Lock()
	fn := c.hooks[ch.Kind]
	c.mu.Unlock()
	if fn != nil {
		return fn(ctx, ch)
	}
	return nil
}

// OnChange sets what applies a change log entry of a kind the fleet does
// not keep (ChangeAccess, ChangeAlerts): the server's other parts read their changes
// back through the same change log.
func (c *cluster) OnChange(kind ChangeKind, fn func(ctx context.Context, ch Change) error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.hooks == nil {
		c.hooks = map[ChangeKind]func(context.Context, Change) error{}
	}
	c.hooks[kind] = fn
}

// NoteChange, in cluster mode, logs a change of a kind the fleet does not
// keep (OnChange), right after it was stored; without a cluster it does
// nothing.
func (c *cluster) NoteChange(ctx context.Context, kind ChangeKind, id uint64) {
	c.noteChange(ctx, kind, id)
}

// noteChange, in cluster mode, logs a change made outside the grouped
// commit, right after it was stored. Should that fail, the change is
// stored but other nodes learn it at their restart: it is logged.
func (c *cluster) noteChange(ctx context.Context, kind ChangeKind, id uint64) {
	if c.store == nil {
		return
	}
	if err := c.store.NoteChange(context.WithoutCancel(ctx), kind, id); err != nil {
		c.log.Warn("cluster: change stored but not logged; other nodes see it at their restart", "kind", kind, "id", id, "err", err)
	}
}

// ApplyStates takes other nodes' pushes (device, last seen, sequence,
// applied version, config error) into memory, so that liveness and sync
// state cover the whole fleet; older ones than memory's are skipped. A
// record with a Firmware (the push moved the device to it) that memory
// does not have makes the device be read back, in the background: its
// profile may change too (rollouts select devices by firmware).
func (c *cluster) ApplyStates(recs []StateRecord) (applied int) {
	var moved []uint64
	defer func() {
		if len(moved) > 0 && c.store != nil {
			go c.refreshMoved(moved)
		}
	}()
	for i := range recs {
		r := &recs[i]
		d := c.devs.get(r.DeviceID)
		if d == nil || r.LastSeen.IsZero() {
			continue
		}
		ns := r.LastSeen.UnixNano()
		d.mu.Lock()
		if r.Firmware != "" && r.Firmware != d.firmware && len(moved) < 10000 {
			moved = append(moved, r.DeviceID)
		}
		if ns > d.lastSeen {
			d.lastSeen, d.seq, d.appliedVersion = ns, r.Seq, r.AppliedVersion
			if d.configError != r.ConfigError {
				d.configError = strings.Clone(r.ConfigError)
			}
			if len(r.State) > 0 {
				c.devs.noteReported(d, r.State)
			} else {
				c.devs.relabel(d)
			}
			applied++
		}
		d.mu.Unlock()
	}
	return applied
}

// refreshMoved reads back devices another node moved to another
// firmware.
func (c *cluster) refreshMoved(ids []uint64) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, id := range ids {
		if err := c.devs.refreshDevice(ctx, id); err != nil {
			c.log.Warn("cluster: reading back a device that changed firmware failed", "device_id", id, "err", err)
		}
	}
}

// checkStored is the cluster's second look at a push's token that memory
// refused: the device may have registered, or re-registered, on another
// node a moment ago. It reads the device back and says whether the token
// is now the device's. A token the database refused within refusedTTL is
// refused without a read; past storedChecksPerSecond reads it answers
// ErrOverloaded (503: the device comes back), never a wrong refusal.
func (c *cluster) checkStored(ctx context.Context, token string) (bool, error) {
	if c.store == nil {
		return false, nil
	}
	dot := strings.IndexByte(token, '.')
	if dot <= 0 {
		return false, nil
	}
	id, err := strconv.ParseUint(token[:dot], 10, 64)
	if err != nil {
		return false, nil
	}
	hash := sha256.Sum256([]byte(token))
	now := c.now().UnixNano()
	if c.wasRefused(id, hash, now) {
		return false, nil
	}
	if c.reads != nil && !c.reads.Allow() {
		return false, ErrOverloaded
	}
	if err := c.devs.refreshDevice(ctx, id); err != nil {
		c.log.Warn("cluster: reading a device back failed", "device_id", id, "err", err)
		return false, errors.Join(ErrUnavailable, err)
	}
	ok := false
	if d := c.devs.get(id); d != nil {
		d.mu.Lock()
		ok = hashEq(hash, d.tokenHash)
		d.mu.Unlock()
	}
	if !ok {
		c.noteRefused(id, hash, now)
	}
	return ok, nil
}

// claimLost handles a registration that another node won: the device is
// read back, so that the registration starts over as a re-registration.
func (c *cluster) claimLost(ctx context.Context, machineID string) error {
	id, ok, err := c.store.DeviceIDOf(ctx, machineID)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("cluster: device %q neither stored nor storable", machineID)
	}
	return c.devs.refreshDevice(ctx, id)
}

// storedElsewhere, in cluster mode, reads back a machine ID this node does
// not know that another node registered; it says whether it did.
func (c *cluster) storedElsewhere(ctx context.Context, machineID string) (bool, error) {
	if c.store == nil {
		return false, nil
	}
	id, ok, err := c.store.DeviceIDOf(ctx, machineID)
	if err != nil || !ok {
		return false, err
	}
	if err := c.devs.refreshDevice(ctx, id); err != nil {
		return false, err
	}
	_, known := c.devs.deviceOf(machineID)
	return known, nil
}

func (c *cluster) forget(id uint64) {
	c.mu.Lock()
	delete(c.refused, id)
	c.mu.Unlock()
}
