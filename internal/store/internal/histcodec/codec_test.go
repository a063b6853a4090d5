package histcodec

import (
	"math"
	"reflect"
	"testing"
	"time"

	"github.com/drover/drover/internal/fleet"
	"github.com/drover/drover/internal/store/internal/samplegen"
)

func p[T any](v T) *T { return &v }

func emulated(n int, seed uint64) []fleet.Sample {
	return samplegen.Device(7, time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC), 200*time.Second, n, seed)
}

func TestRoundTrip(t *testing.T) {
	cases := map[string][]fleet.Sample{
		"none":     {},
		"one":      emulated(1, 3),
		"hour":     emulated(18, 4),
		"day":      emulated(432, 5),
		"empty":    {{DeviceID: 7, At: time.UnixMilli(5).UTC(), Seq: 2}},
		"negative": {{DeviceID: 7, At: time.UnixMilli(-5).UTC(), Seq: math.MaxUint64, Uptime: p(int64(math.MinInt64)), CPU: p(math.Inf(-1))}},
		"odd floats": {
			{DeviceID: 7, At: time.UnixMilli(1).UTC(), CPU: p(math.Copysign(0, -1)), Temperature: p(0.1 + 0.2), SINR: p(math.NaN())},
			{DeviceID: 7, At: time.UnixMilli(1).UTC(), CPU: p(1e300), RSSI: p(-3.25)},
			{DeviceID: 7, At: time.UnixMilli(0).UTC(), Uptime: p(int64(math.MaxInt64)), RxBytes: p(uint64(math.MaxInt64))},
		},
	}
	for name, ss := range cases {
		got, err := Decode(Encode(ss), 7)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !sameSamples(got, ss) {
			t.Fatalf("%s: round trip\n got %+v\nwant %+v", name, got, ss)
		}
	}
	// Counters beyond int64 keep int64's maximum.
	got, _ := Decode(Encode([]fleet.Sample{{RxBytes: p(uint64(math.MaxUint64))}}), 0)
	if *got[0].RxBytes != math.MaxInt64 {
		t.Fatalf("clamped counter: %d", *got[0].RxBytes)
	}
}

// A day of a device at 200 s packs into a few bytes a sample: a row of the
// one-row-per-sample layout took 273–293 bytes on PostgreSQL.
func TestPackedSize(t *testing.T) {
	ss := emulated(432, 9)
	per := float64(len(Encode(ss))) / float64(len(ss))
	if per > 24 {
		t.Fatalf("%.1f bytes a sample packed, want at most 24", per)
	}
	t.Logf("%.1f bytes a sample (day), %.1f (hour)", per, float64(len(Encode(ss[:18])))/18)
}

func sameSamples(a, b []fleet.Sample) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		x, y := a[i], b[i]
		if !x.At.Equal(y.At) || x.Seq != y.Seq || x.DeviceID != y.DeviceID {
			return false
		}
		fs := [][2]*float64{{x.CPU, y.CPU}, {x.Temperature, y.Temperature}, {x.RSSI, y.RSSI}, {x.RSRP, y.RSRP}, {x.RSRQ, y.RSRQ}, {x.SINR, y.SINR}}
		for _, f := range fs {
			if (f[0] == nil) != (f[1] == nil) || f[0] != nil && math.Float64bits(*f[0]) != math.Float64bits(*f[1]) {
				return false
			}
		}
		x.CPU, x.Temperature, x.RSSI, x.RSRP, x.RSRQ, x.SINR = nil, nil, nil, nil, nil, nil
		y.CPU, y.Temperature, y.RSSI, y.RSRP, y.RSRQ, y.SINR = nil, nil, nil, nil, nil, nil
		x.At, y.At = time.Time{}, time.Time{}
		if !reflect.DeepEqual(x, y) {
			return false
		}
	}
	return true
}

func FuzzDecode(f *testing.F) {
	f.Add(Encode(emulated(5, 1)))
	f.Add(Encode([]fleet.Sample{{Seq: 1}}))
	f.Add([]byte{1, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		ss, err := Decode(b, 3)
		if err != nil {
			return
		}
		// What decodes encodes and decodes to the same samples.
		again, err := Decode(Encode(ss), 3)
		if err != nil || !sameSamples(again, ss) {
			t.Fatalf("re-encoding %x: %v", b, err)
		}
	})
}
