package render

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// The number formatters of Drover's reports and dashboard, once.

// Fixed writes v with prec decimals and grouped thousands: 12,345.68;
// "—" for NaN and ±Inf.
func Fixed(v float64, prec int) string {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return "—"
	}
	s := strconv.FormatFloat(math.Abs(v), 'f', prec, 64)
	ip, fp, _ := strings.Cut(s, ".")
	n, _ := strconv.ParseInt(ip, 10, 64)
	out := Group(n)
	if fp != "" {
		out += "." + fp
	}
	if v < 0 && strings.Trim(s, "0.") != "" {
		out = "-" + out
	}
	return out
}

// TrimZeros drops trailing zeros of a decimal fraction: 2.50 -> 2.5,
// 3.00 -> 3.
func TrimZeros(s string) string {
	if strings.Contains(s, ".") {
		s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	}
	return s
}

// Rate writes a per-second rate: whole above 100, one decimal above 10,
// two below.
func Rate(r float64) string {
	switch {
	case r == 0:
		return "0"
	case r >= 100:
		return strconv.FormatFloat(math.Round(r), 'f', 0, 64)
	case r >= 10:
		return strconv.FormatFloat(r, 'f', 1, 64)
	}
	return strconv.FormatFloat(r, 'f', 2, 64)
}

// Duration writes a duration with 3 significant digits (µs, ms, s), or as
// 4m05s and 2h03m.
func Duration(d time.Duration) string {
	if d == 0 {
		return "0"
	}
	f := func(v float64, unit string) string {
		switch {
		case v >= 100:
			return strconv.FormatFloat(v, 'f', 0, 64) + unit
		case v >= 10:
			return strconv.FormatFloat(v, 'f', 1, 64) + unit
		}
		return strconv.FormatFloat(v, 'f', 2, 64) + unit
	}
	switch a := d.Abs(); {
	case a < time.Millisecond:
		return f(float64(d)/float64(time.Microsecond), "µs")
	case a < time.Second:
		return f(float64(d)/float64(time.Millisecond), "ms")
	case a < time.Minute:
		return f(d.Seconds(), "s")
	case a < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	}
	return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
}

// BinaryBytes writes a byte count in binary units: 512 B, 1.5 KiB,
// 2.0 MiB, 1.25 GiB.
func BinaryBytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

// DecimalBytes writes a byte count in decimal units with one decimal:
// 999 B, 1.5 kB, 24.7 GB (devices report disks and memory so).
func DecimalBytes(f float64) string {
	units := []string{"B", "kB", "MB", "GB", "TB", "PB"}
	i := 0
	for math.Abs(f) >= 1000 && i < len(units)-1 {
		f /= 1000
		i++
	}
	if i == 0 {
		return strconv.FormatFloat(f, 'f', 0, 64) + " B"
	}
	return strconv.FormatFloat(f, 'f', 1, 64) + " " + units[i]
}
