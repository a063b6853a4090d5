package fleet

// Firmware artifacts, rollouts and profile history (docs/firmware.md).
// The files themselves live with the server (internal/server/firmware.go);
// the fleet keeps what is known about them, the rollouts and every device's
// place in one, in memory for the push path and in a FirmwareStore.

import (
	"context"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/drover/drover/internal/protocol"
)

// FirmwareStore keeps firmware artifacts, rollouts, rollout devices and
// profile revisions; all three backends implement it.
type FirmwareStore interface {
	// LoadFirmware returns every artifact and rollout, and the devices of
	// the rollouts not finished.
	LoadFirmware(ctx context.Context) (FirmwareData, error)
	SaveFirmware(ctx context.Context, f Firmware) error // upsert by ID
	DeleteFirmware(ctx context.Context, id uint64) error
	SaveRollout(ctx context.Context, r Rollout) error // upsert by ID
	// SaveRolloutDevices upserts by (RolloutID, DeviceID).
	SaveRolloutDevices(ctx context.Context, ds []RolloutDevice) error
	// RolloutDevices returns one rollout's devices by device ID.
	RolloutDevices(ctx context.Context, rolloutID uint64) ([]RolloutDevice, error)
	// AddProfileRevision stores r with the next revision number of its
	// profile and returns it. The database allocates the number: calls
	// at the same moment (servers sharing it) get distinct numbers, and
	// none fails for another's.
	AddProfileRevision(ctx context.Context, r ProfileRevision) (ProfileRevision, error)
	// ProfileRevisions returns a profile's revisions, oldest first.
	ProfileRevisions(ctx context.Context, profileID uint64) ([]ProfileRevision, error)
}

// Errors of firmware operations.
var (
	ErrFirmwareExists = errors.New("this device type has this firmware version already")
	ErrFirmwareInUse  = errors.New("a rollout that is not finished uses this firmware")
	ErrRolloutState   = errors.New("the rollout cannot do this in its state")
	ErrNoDevices      = errors.New("no device matches the rollout's filter")
)

// FirmwareData is what LoadFirmware returns.
type FirmwareData struct {
	// MaxFirmwareID is the highest firmware ID ever used (deleted ones
	// too): IDs are never reused.
	MaxFirmwareID uint64
	Firmware      []Firmware
	Rollouts      []Rollout
	Devices       []RolloutDevice // of unfinished rollouts
}

// Firmware is one uploaded (or referenced) firmware image.
type Firmware struct {
	ID         uint64 `json:"id,string"`
	DeviceType string `json:"device_type"`
	Version    string `json:"version"`
	SHA256     string `json:"sha256"` // lower-case hex
	Size       int64  `json:"size"`
	// Signature is base64 ed25519 over the 32-byte SHA-256 digest; "" for
	// none.
	Signature string `json:"signature,omitempty"`
	// URL is where devices fetch it when the operator keeps it elsewhere
	// (a CDN, an object store); "" when the server keeps the file.
	URL       string    `json:"url,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	By        string    `json:"by,omitempty"`
}

// Stored reports whether the server keeps the file (no URL).
func (f *Firmware) Stored() bool { return f.URL == "" }

// FileName is the stored file's name in the firmware directory.
func (f *Firmware) FileName() string { return f.SHA256 + ".bin" }

// Limits on firmware metadata.
const (
	MaxFirmwareURLLen = 2048
	maxFirmware       = 10000
)

// Check reports the first rule f breaks, as a *FieldError.
func (f *Firmware) Check() error {
	if p := fieldText(f.DeviceType, protocol.MaxNameLen); p != "" {
		return &FieldError{Field: "device_type", Message: "device_type " + p}
	}
	if p := fieldText(f.Version, protocol.MaxNameLen); p != "" {
		return &FieldError{Field: "version", Message: "version " + p}
	}
	if b, err := hex.DecodeString(f.SHA256); err != nil || len(b) != 32 || strings.ToLower(f.SHA256) != f.SHA256 {
		return &FieldError{Field: "sha256", Message: "sha256 must be 64 lower-case hex digits"}
	}
	if f.Size <= 0 {
		return &FieldError{Field: "size", Message: "size must be > 0 bytes"}
	}
	if f.Signature != "" {
		if b, err := base64.StdEncoding.DecodeString(f.Signature); err != nil || len(b) != 64 {
			return &FieldError{Field: "signature", Message: "signature must be 64 bytes (ed25519) in base64"}
		}
	}
	if f.URL != "" {
		u, err := url.Parse(f.URL)
		if err != nil || len(f.URL) > MaxFirmwareURLLen || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
			return &FieldError{Field: "url", Message: "url must be an absolute http(s) URL of at most 2048 bytes"}
		}
	}
	return nil
}

// fieldText says what is wrong with a required name, or "".
func fieldText(v string, max int) string {
	switch {
	case v == "":
		return "is required"
	case len(v) > max:
		return "is longer than " + strconv.Itoa(max) + " bytes"
	case strings.TrimSpace(v) != v || strings.ContainsFunc(v, func(r rune) bool { return r < 0x20 || r == 0x7f }):
		return "must not have control characters or surrounding spaces"
	}
	return ""
}

// firmwareState is the firmware and rollouts room: the artifacts, the
// rollouts and every device's place in one, and the profiles' revisions
// (firmware.go, rollout.go, rollout_cluster.go, profilehistory.go). The
// Service embeds it, so that its exported methods are the Service's.
type firmwareState struct {
	mu        sync.Mutex
	store     FirmwareStore // nil: memory only
	artifacts map[uint64]*Firmware
	nextFW    uint64
	rollouts  map[uint64]*rollout
	nextRO    uint64
	// byDevice is every device's place in an unfinished rollout; targets
	// says whether it has any (the push path's only cost otherwise).
	byDevice map[uint64]*target
	targets  atomic.Bool
	// byConfig and configTargets are the same for configuration rollouts.
	byConfig      map[uint64]*target
	configTargets atomic.Bool
	dirty         map[*target]struct{}
	// revisions is the history without a store.
	revisions map[uint64][]ProfileRevision
	// storeMu serialises store writes of rollouts; stepMu engine steps
	// (and, in cluster mode, every change of a rollout and its read-back).
	storeMu, stepMu sync.Mutex
	// rc is the shared database in cluster mode (rollout_cluster.go), nil
	// otherwise; readSince is where the next read of other nodes' rollout
	// device changes starts (the database's clock, unix ms).
	rc        RolloutCluster
	readSince int64

	// Set by New: the Options of the room, and what it needs of the others.
	rcOption RolloutCluster // Options.ClusterRollouts, rc once a store is loaded
	driver   func() bool    // Options.RolloutDriver
	devs     firmwareDevices
	cluster  ClusterStore // nil: one server
	now      func() time.Time
	log      *slog.Logger
	// note writes a change log entry (cluster glue, cluster.go).
	note func(ctx context.Context, kind ChangeKind, id uint64)
}

// firmwareDevices is what the firmware room needs of the registry and
// the profiles: the devices (a rollout's filter, a device's token) and
// a profile's existence and update (profile history and rollback).
type firmwareDevices interface {
	deviceFinder
	deviceForToken(token string) (*device, [32]byte, bool)
	ParseFilter(v url.Values) (Filter, error)
	Profile(id uint64) (Profile, bool)
	updateProfile(ctx context.Context, id uint64, u ProfileUpdate, by, note string, always bool) (Profile, bool, error)
	configStager
}

// wire gives the room its options and what it needs of the others (New).
func (fs *firmwareState) wire(s *Service) {
	fs.rcOption, fs.driver = s.opts.ClusterRollouts, s.opts.RolloutDriver
	fs.devs, fs.cluster, fs.now, fs.log, fs.note = s, s.opts.Cluster, s.now, s.log, s.noteChange
	fs.init()
}

func (fs *firmwareState) init() {
	fs.artifacts, fs.rollouts = map[uint64]*Firmware{}, map[uint64]*rollout{}
	fs.byDevice, fs.byConfig, fs.dirty = map[uint64]*target{}, map[uint64]*target{}, map[*target]struct{}{}
	fs.revisions = map[uint64][]ProfileRevision{}
	fs.nextFW, fs.nextRO = 1, 1
}

// loadFirmware reads artifacts, rollouts and their devices.
func (fs *firmwareState) loadFirmware(ctx context.Context, st FirmwareStore) error {
	data, err := st.LoadFirmware(ctx)
	if err != nil {
		return fmt.Errorf("load firmware: %w", err)
	}
	fs.store = st
	fs.rc = fs.rcOption
	fs.nextFW = max(fs.nextFW, data.MaxFirmwareID+1)
	for i := range data.Firmware {
		f := data.Firmware[i]
		fs.artifacts[f.ID] = &f
		fs.nextFW = max(fs.nextFW, f.ID+1)
	}
	for _, r := range data.Rollouts {
		fs.nextRO = max(fs.nextRO, r.ID+1)
		fw := fs.artifacts[r.FirmwareID]
		if fw == nil && r.Config == nil {
			continue
		}
		ro := &rollout{Rollout: r, fw: fw, targets: map[uint64]*target{}}
		if r.Config != nil {
			// Its filter names a label: resolved at the first step, once
			// labels are loaded.
			fs.stageLoaded(ro)
		} else if !r.finished() {
			if err := ro.parse(fs.devs); err != nil {
				fs.log.Warn("stored rollout's filter no longer parses; it is paused", "rollout", r.ID, "err", err)
				ro.State, ro.Reason = RolloutPaused, "filter: "+err.Error()
			}
		}
		fs.rollouts[r.ID] = ro
	}
	for _, d := range data.Devices {
		ro := fs.rollouts[d.RolloutID]
		if ro == nil || ro.finished() {
			continue
		}
		t := &target{RolloutDevice: d, r: ro}
		ro.add(t)
		if !terminal(d.State) {
			fs.places(ro)[d.DeviceID] = t
		}
	}
	for _, ro := range fs.rollouts {
		fs.release(ro, nil)
	}
	fs.targets.Store(len(fs.byDevice) > 0)
	fs.configTargets.Store(len(fs.byConfig) > 0)
	return nil
}

// Firmware lists the artifacts, newest first.
func (fs *firmwareState) Firmware() []Firmware {
	fs.mu.Lock()
	out := make([]Firmware, 0, len(fs.artifacts))
	for _, f := range fs.artifacts {
		out = append(out, *f)
	}
	fs.mu.Unlock()
	slices.SortFunc(out, func(a, b Firmware) int { return int(b.ID) - int(a.ID) })
	return out
}

// FirmwareByID returns one artifact.
func (fs *firmwareState) FirmwareByID(id uint64) (Firmware, bool) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	f, ok := fs.artifacts[id]
	if !ok {
		return Firmware{}, false
	}
	return *f, true
}

// AddFirmware checks and records an artifact (its file, if the server
// keeps it, is in place already) and returns it with its ID.
func (fs *firmwareState) AddFirmware(ctx context.Context, f Firmware) (Firmware, error) {
	if err := f.Check(); err != nil {
		return Firmware{}, err
	}
	cs := fs.cluster
	if cs != nil {
		// Another node may have added this one: start from the stored list.
		if err := fs.reloadFirmware(ctx); err != nil {
			return Firmware{}, errors.Join(ErrUnavailable, err)
		}
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if len(fs.artifacts) >= maxFirmware {
		return Firmware{}, &FieldError{Field: "version", Message: "the server holds 10000 firmware artifacts; delete some first"}
	}
	for _, o := range fs.artifacts {
		if o.DeviceType == f.DeviceType && o.Version == f.Version {
			return Firmware{}, ErrFirmwareExists
		}
	}
	f.ID = fs.nextFW
	if cs != nil {
		id, err := cs.NextFirmwareID(ctx)
		if err != nil {
			return Firmware{}, errors.Join(ErrUnavailable, err)
		}
		f.ID = id
	}
	f.CreatedAt = fs.now().UTC().Truncate(time.Millisecond)
	if fs.store != nil {
		if err := fs.store.SaveFirmware(ctx, f); err != nil {
			return Firmware{}, err
		}
	}
	fs.nextFW = max(fs.nextFW, f.ID+1)
	fs.artifacts[f.ID] = &f
	fs.note(ctx, ChangeFirmware, f.ID)
	fs.log.Info("firmware added", "firmware_id", f.ID, "device_type", f.DeviceType, "version", f.Version, "size", f.Size, "stored", f.Stored(), "by", f.By)
	return f, nil
}

// DeleteFirmware forgets an artifact no unfinished rollout uses. It returns
// the artifact, so that the caller removes its file when no other artifact
// shares it.
func (fs *firmwareState) DeleteFirmware(ctx context.Context, id uint64) (f Firmware, fileShared bool, err error) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	a, ok := fs.artifacts[id]
	if !ok {
		return Firmware{}, false, ErrNotFound
	}
	for _, r := range fs.rollouts {
		if r.FirmwareID == id && !r.finished() {
			return Firmware{}, false, ErrFirmwareInUse
		}
	}
	if fs.store != nil {
		if err := fs.store.DeleteFirmware(ctx, id); err != nil {
			return Firmware{}, false, err
		}
	}
	delete(fs.artifacts, id)
	fs.note(ctx, ChangeFirmware, id)
	for _, o := range fs.artifacts {
		if o.Stored() && o.SHA256 == a.SHA256 {
			fileShared = true
		}
	}
	fs.log.Info("firmware deleted", "firmware_id", id)
	return *a, fileShared, nil
}

// FirmwareAccess checks a device token for fetching firmware id: the
// device must be admitted and of the firmware's device type.
func (fs *firmwareState) FirmwareAccess(token string, id uint64) (Firmware, error) {
	d, hash, ok := fs.devs.deviceForToken(token)
	if !ok {
		return Firmware{}, ErrUnauthorized
	}
	d.mu.Lock()
	good := subtle.ConstantTimeCompare(hash[:], d.tokenHash[:]) == 1
	adm, typ := d.admission, d.deviceType
	d.mu.Unlock()
	if !good {
		return Firmware{}, ErrUnauthorized
	}
	if err := admissionError(adm); err != nil {
		return Firmware{}, err
	}
	f, ok := fs.FirmwareByID(id)
	if !ok || f.DeviceType != typ {
		return Firmware{}, ErrNotFound
	}
	return f, nil
}

// reloadFirmware replaces the firmware artifacts with the stored ones
// (a rollout keeps the artifact it was read with: an artifact is never
// changed, and not deleted while an unfinished rollout uses it).
func (fs *firmwareState) reloadFirmware(ctx context.Context) error {
	if fs.store == nil {
		return nil
	}
	// Read under the lock: an artifact this node adds meanwhile is then
	// either in what is read or added after.
	fs.mu.Lock()
	defer fs.mu.Unlock()
	data, err := fs.store.LoadFirmware(ctx)
	if err != nil {
		return err
	}
	clear(fs.artifacts)
	for i := range data.Firmware {
		f := data.Firmware[i]
		fs.artifacts[f.ID] = &f
	}
	return nil
}
