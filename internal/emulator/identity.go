package emulator

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// Shard selects the devices of one process: index % N == K-1. K is 1-based.
type Shard struct{ K, N int }

// ParseShard parses "k/n" with 1 ≤ k ≤ n.
func ParseShard(s string) (Shard, error) {
	a, b, ok := strings.Cut(s, "/")
	k, err1 := strconv.Atoi(a)
	n, err2 := strconv.Atoi(b)
	if !ok || err1 != nil || err2 != nil || n < 1 || k < 1 || k > n {
		return Shard{}, fmt.Errorf("shard %q: want k/n with 1 ≤ k ≤ n, e.g. 1/4 … 4/4", s)
	}
	return Shard{k, n}, nil
}

func (s Shard) String() string {
	if s.N == 0 {
		return "1/1"
	}
	return strconv.Itoa(s.K) + "/" + strconv.Itoa(s.N)
}

func (s Shard) norm() Shard {
	if s.N == 0 {
		return Shard{1, 1}
	}
	return s
}

// Sub splits shard s into n sub-shards; the i-th (1-based) covers the
// indexes of s with (index / s.N) % n == i-1, which is again a plain shard.
func (s Shard) Sub(i, n int) Shard {
	s = s.norm()
	return Shard{K: s.K + s.N*(i-1), N: s.N * n}
}

// indexes returns the fleet indexes of the shard in order.
func (s Shard) indexes(devices int) []int {
	s = s.norm()
	out := make([]int, 0, devices/s.N+1)
	for i := s.K - 1; i < devices; i += s.N {
		out = append(out, i)
	}
	return out
}

// identity derives stable per-device values from the seed and the index.
type identity struct {
	seed     string
	seedHash uint64
	// seqPrefix is set for sequential machine IDs (Config.MachineIDs).
	seqPrefix string
}

func newIdentity(seed string) identity {
	h := sha256.Sum256([]byte("drover-emulator\x00" + seed))
	return identity{seed: seed, seedHash: binary.LittleEndian.Uint64(h[:8])}
}

// Machine ID kinds (Config.MachineIDs).
const (
	// MachineIDsRandom is MachineID: hashed, in no order, 32 hex digits.
	MachineIDsRandom = "random"
	// MachineIDsSequential is SequentialMachineID: a counter, in index order.
	MachineIDsSequential = "sequential"
)

// sequentialPrefix is the seed's part of a sequential machine ID.
func sequentialPrefix(seed string) string {
	h := sha256.Sum256([]byte("drover-emulator-sequential\x00" + seed))
	return hex.EncodeToString(h[:4])
}

// SequentialMachineID returns the sequential machine ID of device index i:
// 8 hex digits from the seed (so that runs with other seeds do not collide),
// then i as 24 zero-padded decimal digits — 32 characters like MachineID,
// sorting in index order.
func SequentialMachineID(seed string, i int) string {
	return identity{seed: seed, seqPrefix: sequentialPrefix(seed)}.machineID(i)
}

// machineID is device i's machine ID of the identity's kind.
func (id identity) machineID(i int) string {
	if id.seqPrefix != "" {
		return fmt.Sprintf("%s%024d", id.seqPrefix, i)
	}
	return MachineID(id.seed, i)
}

// MachineID returns the machine ID of device index i: 32 hex digits, like
// /etc/machine-id, from SHA-256(seed, i).
func MachineID(seed string, i int) string {
	var buf [8]byte
	binary.BigEndian.PutUint64(buf[:], uint64(i))
	h := sha256.Sum256(append([]byte("drover-emulator-machine\x00"+seed+"\x00"), buf[:]...))
	return hex.EncodeToString(h[:16])
}

// hash mixes values into a well-distributed 64-bit number (splitmix64).
func mix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

func (id identity) hash(i int, salt uint64) uint64 {
	return mix(id.seedHash ^ mix(uint64(i)*0x2545f4914f6cdd1d^salt))
}

// phase is device i's offset within the push interval.
func (id identity) phase(i int, interval time.Duration) time.Duration {
	if interval <= 0 {
		return 0
	}
	return time.Duration(id.hash(i, 1) % uint64(interval))
}

// rng is a small deterministic generator (splitmix64); not safe for
// concurrent use.
type rng struct{ s uint64 }

func (r *rng) next() uint64 {
	r.s += 0x9e3779b97f4a7c15
	x := r.s
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// float returns a number in [0, 1).
func (r *rng) float() float64 { return float64(r.next()>>11) / (1 << 53) }

// intn returns a number in [0, n).
func (r *rng) intn(n int64) int64 {
	if n <= 0 {
		return 0
	}
	return int64(r.next() % uint64(n))
}

// jitterSource gives goroutines their own jitter without locks.
var jitterSeq atomic.Uint64

func newJitter() rng { return rng{s: mix(uint64(time.Now().UnixNano()) ^ jitterSeq.Add(1))} }
