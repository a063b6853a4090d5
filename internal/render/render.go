// Package render is what Drover's reports (internal/report, internal/perf)
// and dashboard (internal/web) share to present numbers: the one SVG line
// chart (Chart), "nice" axis ticks (0/20/40/60, not 0/13.7/27.4) and number
// formatting. The documents around them are the sub-package doc.
package render

import (
	"math"
	"strconv"
	"strings"
)

// NiceStep is the 1, 2 or 5 × 10^k step that cuts span into at most n
// parts, the smallest such.
func NiceStep(span float64, n int) float64 {
	if span <= 0 || n < 1 {
		return 1
	}
	raw := span / float64(n)
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 5, 10} {
		if raw <= m*mag*(1+1e-9) {
			return m * mag
		}
	}
	return 10 * mag
}

// Ticks are axis values for data from lo to hi: multiples of
// NiceStep(hi-lo, n), from the last one at or below lo to the first one at
// or above hi (so the axis is widened to them).
func Ticks(lo, hi float64, n int) []float64 {
	if hi < lo {
		lo, hi = hi, lo
	}
	if hi == lo {
		lo, hi = lo-1, hi+1
	}
	step := NiceStep(hi-lo, n)
	// step = m × 10^e; multiples are computed as k·m scaled by 10^e so that
	// 3 × 0.2 prints as 0.6.
	e := math.Floor(math.Log10(step))
	m := math.Round(step / math.Pow(10, e))
	at := func(k float64) float64 {
		if e < 0 {
			return k * m / math.Pow(10, -e)
		}
		return k * m * math.Pow(10, e)
	}
	first, last := math.Floor(lo/step+1e-9), math.Ceil(hi/step-1e-9)
	var out []float64
	for k := first; k <= last; k++ {
		out = append(out, at(k))
	}
	return out
}

// Group writes an integer with thousands separators: 1,234,567.
func Group(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// SI writes v scaled by powers of 1000 into the first of units (e.g.
// "bit/s", "kbit/s", …) that keeps it below 1000, with up to three
// significant digits and no trailing zeros: "3 kbit/s", "2.5 Mbit/s".
func SI(v float64, units []string) string {
	i := 0
	for math.Abs(v) >= 1000 && i < len(units)-1 {
		v /= 1000
		i++
	}
	return strconv.FormatFloat(v, 'g', 3, 64) + " " + units[i]
}

// Elapsed writes seconds since a start briefly: "45 s", "2.5 min", "3 h".
func Elapsed(sec float64) string {
	trim := func(s string) string { return strings.TrimSuffix(strings.TrimRight(s, "0"), ".") }
	switch {
	case sec >= 7200:
		return trim(strconv.FormatFloat(sec/3600, 'f', 1, 64)) + " h"
	case sec >= 120:
		return trim(strconv.FormatFloat(sec/60, 'f', 1, 64)) + " min"
	default:
		return trim(strconv.FormatFloat(sec, 'f', 1, 64)) + " s"
	}
}
