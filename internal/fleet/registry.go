package fleet

import "crypto/sha256"

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
