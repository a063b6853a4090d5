package fleet

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"time"
)

// Store is what the fleet needs from a database. Adapters live in
// internal/store/<backend>; all of them pass internal/store/storetest.
type Store interface {
	// Load streams every stored device, then returns all profiles and the
	// highest device and profile IDs in use. It calls each from one
	// goroutine at a time, in no particular order of IDs.
	Load(ctx context.Context, opts LoadOptions, each func(DeviceRecord) error) (LoadResult, error)
	// Commit applies one batch atomically and durably (one transaction).
	Commit(ctx context.Context, b *Batch) error
	// History returns a device's samples in [q.From, q.To), oldest first.
	History(ctx context.Context, deviceID uint64, q HistoryQuery) ([]Sample, error)
	// PruneHistory deletes at most limit samples older than before and
	// returns how many it deleted.
	PruneHistory(ctx context.Context, before time.Time, limit int) (int64, error)
	Close() error
}

// LoadOptions say what Store.Load may leave out, and whom it tells what
// to expect.
type LoadOptions struct {
	// NoStates: the devices' state documents are not needed, and
	// DeviceRecord.State.State may be left empty (write-through mode reads
	// them back through StateReader). The rest of the state record is
	// filled all the same.
	NoStates bool
	// Expect, if set, is called once before the first device with the
	// most devices Load will stream: the highest device ID, which a store
	// reads without counting its rows.
	Expect func(devices uint64)
}

// StateReader is implemented by stores that read back one device's current
// state. In write-through mode the fleet then keeps states only in the store,
// not in memory.
type StateReader interface {
	DeviceState(ctx context.Context, deviceID uint64) (json.RawMessage, error)
}

// HistoryDropper drops history by time partitions: DropHistory drops every
// whole partition older than before, whatever its size (a cheap operation
// there), and returns how many samples it dropped; a store without
// partitions drops nothing. PruneHistory then deletes the rest in chunks.
type HistoryDropper interface {
	DropHistory(ctx context.Context, before time.Time) (int64, error)
}

// Errors of the registry and the push.
var (
	// ErrUnauthorized is returned for a device token that is unknown or revoked.
	ErrUnauthorized = errors.New("unknown or revoked token")
	// ErrCursor is returned for a cursor that Query did not make.
	ErrCursor = errors.New("invalid cursor")
)

// The registry holds a million devices at fleet scale, most of a server's
// live heap: what the garbage collector must mark in every cycle. Two
// layouts keep that work small (BenchmarkRegistryGC measures it).

// deviceSlab is how many device records are allocated together: the
// collector marks one object per slab instead of one per device. A
// deleted device's slot is not reused (deletions are rare).
const deviceSlab = 1024

// newDevice returns a zeroed device record; s.regMu held (or the fleet
// not yet shared, as while loading).
func (s *Service) newDevice() *device {
	if len(s.slab) == 0 {
		s.slab = make([]device, deviceSlab)
	}
	d := &s.slab[0]
	s.slab = s.slab[1:]
	return d
}

// machineKey stands for a machine ID in the registry's index: the first
// 16 bytes of its SHA-256. The index then holds no pointers, so the
// collector never scans its entries; two machine IDs with one key would
// take about 2^64 hashes to find.
type machineKey [16]byte

func keyOfMachine(machineID string) machineKey {
	sum := sha256.Sum256([]byte(machineID))
	return machineKey(sum[:16])
}

// machineIndex maps machine IDs to device IDs; s.regMu guards it.
type machineIndex map[machineKey]uint64

func (m machineIndex) get(machineID string) (uint64, bool) {
	id, ok := m[keyOfMachine(machineID)]
	return id, ok
}

func (m machineIndex) set(machineID string, id uint64) { m[keyOfMachine(machineID)] = id }

func (m machineIndex) delete(machineID string) { delete(m, keyOfMachine(machineID)) }

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

// each calls fn for every registered device with d.mu held.
func (s *Service) each(fn func(d *device)) {
	s.devMu.RLock()
	all := s.devices
	s.devMu.RUnlock()
	for _, d := range all {
		if d == nil {
			continue
		}
		d.mu.Lock()
		if d.profile != nil {
			fn(d)
		}
		d.mu.Unlock()
	}
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
	// Hashed from a stack copy: []byte(token) is a heap copy past 32 bytes.
	var buf [128]byte
	return d, sha256.Sum256(append(buf[:0], token...)), true
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
