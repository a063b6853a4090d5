package render

import (
	"fmt"
	"math"
	"testing"
	"time"
)

func TestTicks(t *testing.T) {
	for _, c := range []struct {
		lo, hi float64
		n      int
		want   string
	}{
		{0, 47, 4, "[0 20 40 60]"},              // CPU %: not 0/11.75/23.5/…/47
		{0, 3060, 4, "[0 1000 2000 3000 4000]"}, // bit/s: 3 kbit/s, not 3.06
		{0, 100, 4, "[0 50 100]"},               // 25 is not 1, 2 or 5 × 10^k
		{0, 5, 4, "[0 2 4 6]"},
		{-112, -63, 4, "[-120 -100 -80 -60]"},
		{0, 0.7, 4, "[0 0.2 0.4 0.6 0.8]"},
		{38.2, 41.9, 4, "[38 39 40 41 42]"},
		{5, 5, 4, "[4 4.5 5 5.5 6]"},
		{0, 1e6, 5, "[0 200000 400000 600000 800000 1e+06]"},
	} {
		if got := fmt.Sprint(Ticks(c.lo, c.hi, c.n)); got != c.want {
			t.Errorf("Ticks(%v, %v, %d) = %s, want %s", c.lo, c.hi, c.n, got, c.want)
		}
	}
}

func TestNiceStep(t *testing.T) {
	for _, c := range []struct {
		span float64
		n    int
		want float64
	}{{47, 4, 20}, {3060, 4, 1000}, {0.7, 4, 0.2}, {100, 4, 50}, {100, 5, 20}, {8, 4, 2}, {0, 4, 1}} {
		if got := NiceStep(c.span, c.n); got != c.want {
			t.Errorf("NiceStep(%v, %d) = %v, want %v", c.span, c.n, got, c.want)
		}
	}
}

func TestFormat(t *testing.T) {
	units := []string{"bit/s", "kbit/s", "Mbit/s"}
	for v, want := range map[float64]string{0: "0 bit/s", 3000: "3 kbit/s", 3060: "3.06 kbit/s", 2.5e6: "2.5 Mbit/s", 999: "999 bit/s"} {
		if got := SI(v, units); got != want {
			t.Errorf("SI(%v) = %q, want %q", v, got, want)
		}
	}
	for n, want := range map[int64]string{0: "0", 999: "999", 1000: "1,000", -1234567: "-1,234,567"} {
		if got := Group(n); got != want {
			t.Errorf("Group(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestNumberFormatters(t *testing.T) {
	for _, c := range []struct{ got, want string }{
		{Fixed(12345.678, 2), "12,345.68"}, {Fixed(-0.001, 2), "0.00"}, {Fixed(-1234.5, 1), "-1,234.5"}, {Fixed(math.NaN(), 1), "—"},
		{TrimZeros("2.50"), "2.5"}, {TrimZeros("3.00"), "3"}, {TrimZeros("300"), "300"},
		{Rate(0), "0"}, {Rate(1234.4), "1234"}, {Rate(12.34), "12.3"}, {Rate(1.234), "1.23"},
		{Duration(0), "0"}, {Duration(1500 * time.Microsecond), "1.50ms"}, {Duration(250 * time.Microsecond), "250µs"},
		{Duration(12500 * time.Millisecond), "12.5s"}, {Duration(245 * time.Second), "4m05s"}, {Duration(123 * time.Minute), "2h03m"},
		{BinaryBytes(512), "512 B"}, {BinaryBytes(1536), "1.5 KiB"}, {BinaryBytes(2 << 20), "2.0 MiB"}, {BinaryBytes(5 << 29), "2.50 GiB"},
		{DecimalBytes(999), "999 B"}, {DecimalBytes(1500), "1.5 kB"}, {DecimalBytes(24.7e9), "24.7 GB"},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
}
