// Package histcodec packs a device's history samples into one compact
// value: column by column, each numeric column as varints of its deltas (or
// deltas of deltas, whichever is shorter) with their common trailing zero
// bits shifted out, decimals as scaled integers when that is exact; a
// column whose values step evenly (sequence numbers, constants) takes a few
// bytes in all. A push's sample usually differs little from the previous
// one, so a packed run of samples takes a few bytes each instead of a row
// each.
package histcodec

import (
	"encoding/binary"
	"errors"
	"math"
	"math/bits"
	"time"

	"github.com/drover/drover/internal/fleet"
	"github.com/drover/drover/internal/store/internal/batchutil"
)

const version = 1

// ErrCorrupt is returned for a value Decode cannot read.
var ErrCorrupt = errors.New("histcodec: corrupt packed samples")

// Encode packs ss, in their order. The device ID is not stored; counters
// beyond int64 keep int64's maximum, as the row layout does.
func Encode(ss []fleet.Sample) []byte {
	n := len(ss)
	out := append(make([]byte, 0, 16+n*24), version)
	out = binary.AppendUvarint(out, uint64(n))
	ints := make([]int64, n)
	col := func(get func(*fleet.Sample) *int64) {
		present := make([]bool, n)
		vals := ints[:0]
		for i := range ss {
			if p := get(&ss[i]); p != nil {
				present[i] = true
				vals = append(vals, *p)
			}
		}
		out = appendPresence(out, present, len(vals))
		out = appendInts(out, vals)
	}
	ats := make([]int64, n)
	for i := range ss {
		ats[i] = ss[i].At.UnixMilli()
	}
	out = appendInts(out, ats)
	for i := range ss {
		ats[i] = int64(ss[i].Seq)
	}
	out = appendInts(out, ats)
	col(func(m *fleet.Sample) *int64 { return m.Uptime })
	col(func(m *fleet.Sample) *int64 { return m.MemUsed })
	col(func(m *fleet.Sample) *int64 { return m.MemTotal })
	col(func(m *fleet.Sample) *int64 { return m.DiskUsed })
	col(func(m *fleet.Sample) *int64 { return m.DiskTotal })
	col(func(m *fleet.Sample) *int64 { return batchutil.ClampU(m.RxBytes) })
	col(func(m *fleet.Sample) *int64 { return batchutil.ClampU(m.TxBytes) })
	fs := make([]float64, 0, n)
	for _, get := range floatCols {
		present := make([]bool, n)
		fs = fs[:0]
		for i := range ss {
			if p := get(&ss[i]); p != nil {
				present[i] = true
				fs = append(fs, *p)
			}
		}
		out = appendPresence(out, present, len(fs))
		out = appendFloats(out, fs, ints)
	}
	return out
}

var floatCols = []func(*fleet.Sample) *float64{
	func(m *fleet.Sample) *float64 { return m.CPU },
	func(m *fleet.Sample) *float64 { return m.Temperature },
	func(m *fleet.Sample) *float64 { return m.RSSI },
	func(m *fleet.Sample) *float64 { return m.RSRP },
	func(m *fleet.Sample) *float64 { return m.RSRQ },
	func(m *fleet.Sample) *float64 { return m.SINR },
}

func setFloat(m *fleet.Sample, k int, v *float64) {
	switch k {
	case 0:
		m.CPU = v
	case 1:
		m.Temperature = v
	case 2:
		m.RSSI = v
	case 3:
		m.RSRP = v
	case 4:
		m.RSRQ = v
	default:
		m.SINR = v
	}
}

// Presence modes.
const (
	allAbsent  = 0
	allPresent = 1
	someBitmap = 2
)

func appendPresence(out []byte, present []bool, count int) []byte {
	switch count {
	case 0:
		return append(out, allAbsent)
	case len(present):
		return append(out, allPresent)
	}
	out = append(out, someBitmap)
	bm := make([]byte, (len(present)+7)/8)
	for i, p := range present {
		if p {
			bm[i/8] |= 1 << (i % 8)
		}
	}
	return append(out, bm...)
}

// residuals turns vs into the deltas of order (1 or 2) after the first
// value, in place in dst, and returns their common trailing zero bits.
func residuals(dst, vs []int64, order int) uint {
	copy(dst, vs)
	for o := 0; o < order; o++ {
		for i := len(dst) - 1; i > o; i-- {
			dst[i] -= dst[i-1]
		}
	}
	shift := uint(63)
	for _, r := range dst[min(order, len(dst)):] {
		if r != 0 {
			shift = min(shift, uint(bits.TrailingZeros64(uint64(r))))
		}
	}
	if shift == 63 {
		shift = 0
	}
	return shift
}

func zigzag(v int64) uint64 { return uint64(v<<1) ^ uint64(v>>63) }

func unzigzag(u uint64) int64 { return int64(u>>1) ^ -int64(u&1) }

// constDelta marks a column whose values differ by the same step each
// (counters of uptime, sequence numbers, constants): the first value and
// the step, nothing per sample.
const constDelta = 3

func appendInts(out []byte, vs []int64) []byte {
	if len(vs) == 0 {
		return out
	}
	if len(vs) > 2 {
		step, same := vs[1]-vs[0], true
		for i := 2; i < len(vs) && same; i++ {
			same = vs[i]-vs[i-1] == step
		}
		if same {
			out = append(out, constDelta<<6)
			return binary.AppendUvarint(binary.AppendUvarint(out, zigzag(vs[0])), zigzag(step))
		}
	}
	best, bestOrder, bestShift := 0, 1, uint(0)
	r := make([]int64, len(vs))
	for order := 1; order <= 2; order++ {
		shift := residuals(r, vs, order)
		size := 0
		for i, x := range r {
			if i >= order {
				x >>= shift
			}
			size += varintLen(zigzag(x))
		}
		if order == 1 || size < best {
			best, bestOrder, bestShift = size, order, shift
		}
	}
	residuals(r, vs, bestOrder)
	out = append(out, byte(bestOrder)<<6|byte(bestShift))
	for i, x := range r {
		if i >= bestOrder {
			x >>= bestShift
		}
		out = binary.AppendUvarint(out, zigzag(x))
	}
	return out
}

func varintLen(u uint64) int { return (bits.Len64(u|1) + 6) / 7 }

var pow10 = [...]float64{1, 10, 100, 1000, 1e4, 1e5, 1e6}

// rawFloats marks a float column stored as 8 bytes a value.
const rawFloats = 0xff

func appendFloats(out []byte, fs []float64, scratch []int64) []byte {
	if len(fs) == 0 {
		return out
	}
	ints := scratch[:len(fs)]
	for k, p := range pow10 {
		ok := true
		for i, f := range fs {
			x := math.Round(f * p)
			if math.Abs(x) > 1<<53 || math.Float64bits(float64(int64(x))/p) != math.Float64bits(f) {
				ok = false
				break
			}
			ints[i] = int64(x)
		}
		if ok {
			return appendInts(append(out, byte(k)), ints)
		}
	}
	out = append(out, rawFloats)
	for _, f := range fs {
		out = binary.LittleEndian.AppendUint64(out, math.Float64bits(f))
	}
	return out
}

type reader struct {
	b   []byte
	err bool
}

func (r *reader) byte() byte {
	if len(r.b) == 0 {
		r.err = true
		return 0
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c
}

func (r *reader) uvarint() uint64 {
	u, k := binary.Uvarint(r.b)
	if k <= 0 {
		r.err = true
		return 0
	}
	r.b = r.b[k:]
	return u
}

func (r *reader) ints(dst []int64) {
	if len(dst) == 0 {
		return
	}
	h := r.byte()
	order, shift := int(h>>6), uint(h&63)
	if order == constDelta {
		if shift != 0 || len(dst) < 3 {
			r.err = true
			return
		}
		dst[0] = unzigzag(r.uvarint())
		step := unzigzag(r.uvarint())
		for i := 1; i < len(dst); i++ {
			dst[i] = dst[i-1] + step
		}
		return
	}
	if order < 1 || order > 2 {
		r.err = true
		return
	}
	for i := range dst {
		x := unzigzag(r.uvarint())
		if i >= order {
			x <<= shift
		}
		dst[i] = x
	}
	for o := order - 1; o >= 0; o-- {
		for i := o + 1; i < len(dst); i++ {
			dst[i] += dst[i-1]
		}
	}
}

// presence returns which of n samples have the column, nil for all.
func (r *reader) presence(n int) (present []bool, count int) {
	switch r.byte() {
	case allAbsent:
		return make([]bool, n), 0
	case allPresent:
		return nil, n
	case someBitmap:
		bm := make([]bool, n)
		for i := 0; i < n; i += 8 {
			c := r.byte()
			for j := i; j < min(i+8, n); j++ {
				if c&(1<<(j-i)) != 0 {
					bm[j] = true
					count++
				}
			}
		}
		return bm, count
	}
	r.err = true
	return make([]bool, n), 0
}

// Decode unpacks what Encode packed, for device id.
func Decode(b []byte, id uint64) ([]fleet.Sample, error) {
	r := &reader{b: b}
	if r.byte() != version {
		return nil, ErrCorrupt
	}
	u := r.uvarint()
	if r.err || u > uint64(len(b)) { // at least a byte a sample
		return nil, ErrCorrupt
	}
	n := int(u)
	ss := make([]fleet.Sample, n)
	vals := make([]int64, n)
	r.ints(vals)
	for i := range ss {
		ss[i].DeviceID, ss[i].At = id, time.UnixMilli(vals[i]).UTC()
	}
	r.ints(vals)
	for i := range ss {
		ss[i].Seq = uint64(vals[i])
	}
	for k := range 7 {
		present, count := r.presence(n)
		r.ints(vals[:count])
		if r.err {
			return nil, ErrCorrupt
		}
		j := 0
		for i := range ss {
			if present != nil && !present[i] {
				continue
			}
			v := vals[j]
			j++
			m := &ss[i]
			switch k {
			case 0:
				m.Uptime = &v
			case 1:
				m.MemUsed = &v
			case 2:
				m.MemTotal = &v
			case 3:
				m.DiskUsed = &v
			case 4:
				m.DiskTotal = &v
			case 5, 6: // counters are stored clamped to 0..MaxInt64
				if v < 0 {
					return nil, ErrCorrupt
				}
				if k == 5 {
					m.RxBytes = batchutil.UnclampU(&v)
				} else {
					m.TxBytes = batchutil.UnclampU(&v)
				}
			}
		}
	}
	for k := range floatCols {
		present, count := r.presence(n)
		fs := make([]float64, count)
		if count > 0 {
			scale := r.byte()
			switch {
			case scale == rawFloats:
				if len(r.b) < 8*count {
					return nil, ErrCorrupt
				}
				for i := range fs {
					fs[i] = math.Float64frombits(binary.LittleEndian.Uint64(r.b[8*i:]))
				}
				r.b = r.b[8*count:]
			case int(scale) < len(pow10):
				r.ints(vals[:count])
				for i := range fs {
					fs[i] = float64(vals[i]) / pow10[scale]
				}
			default:
				return nil, ErrCorrupt
			}
		}
		if r.err {
			return nil, ErrCorrupt
		}
		j := 0
		for i := range ss {
			if present != nil && !present[i] {
				continue
			}
			setFloat(&ss[i], k, &fs[j])
			j++
		}
	}
	if r.err || len(r.b) != 0 {
		return nil, ErrCorrupt
	}
	return ss, nil
}
