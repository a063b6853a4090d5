package web

import (
	"fmt"
	"html"
	"html/template"
	"math"
	"sort"
	"strings"
	"time"

	"github.com/drover/drover/internal/fleet"
	"github.com/drover/drover/internal/render"
)

// point is one chart value at a time (unix ms).
type point struct {
	t int64
	v float64
}

type series struct {
	name   string
	points []point
}

const (
	chartW, chartH         = 720, 200
	plotL, plotR           = 84, 712
	plotT, plotB           = 14, 172
	maxPointsPerSeries int = plotR - plotL
)

// chart renders a line chart as inline SVG (no script, no inline style:
// colours come from the stylesheet through classes).
func chart(title string, from, to time.Time, ss []series, format func(float64) string) template.HTML {
	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="chart" viewBox="0 0 %d %d" role="img" aria-label="%s" xmlns="http://www.w3.org/2000/svg">`,
		chartW, chartH, html.EscapeString(title))
	fmt.Fprintf(&b, `<title>%s</title>`, html.EscapeString(title))
	lo, hi := math.Inf(1), math.Inf(-1)
	n := 0
	for _, s := range ss {
		for _, p := range s.points {
			lo, hi = min(lo, p.v), max(hi, p.v)
			n++
		}
	}
	fmt.Fprintf(&b, `<rect class="plot" x="%d" y="%d" width="%d" height="%d"/>`, plotL, plotT, plotR-plotL, plotB-plotT)
	if n == 0 {
		fmt.Fprintf(&b, `<text class="nodata" x="%d" y="%d" text-anchor="middle">no data in this period</text></svg>`,
			(plotL+plotR)/2, (plotT+plotB)/2)
		return template.HTML(b.String())
	}
	if lo >= 0 && (lo == hi || lo < (hi-lo)/4) {
		lo = 0 // no negative axis for values that cannot be negative
	}
	ticks := render.Ticks(lo, hi, 4)
	lo, hi = ticks[0], ticks[len(ticks)-1]
	t0, t1 := from.UnixMilli(), to.UnixMilli()
	if t1 <= t0 {
		t1 = t0 + 1
	}
	x := func(t int64) float64 { return plotL + float64(t-t0)/float64(t1-t0)*float64(plotR-plotL) }
	y := func(v float64) float64 { return plotB - (v-lo)/(hi-lo)*float64(plotB-plotT) }
	for _, v := range ticks {
		fmt.Fprintf(&b, `<line class="grid" x1="%d" x2="%d" y1="%.1f" y2="%.1f"/>`, plotL, plotR, y(v), y(v))
		fmt.Fprintf(&b, `<text class="axis" x="%d" y="%.1f" text-anchor="end">%s</text>`, plotL-4, y(v)+4, html.EscapeString(format(v)))
	}
	layout := "15:04"
	if to.Sub(from) > 24*time.Hour {
		layout = "Jan 2 15:04"
	}
	for i := 0; i <= 4; i++ {
		t := t0 + (t1-t0)*int64(i)/4
		anchor := "middle"
		if i == 0 {
			anchor = "start"
		} else if i == 4 {
			anchor = "end"
		}
		fmt.Fprintf(&b, `<text class="axis" x="%.1f" y="%d" text-anchor="%s">%s</text>`, x(t), plotB+16, anchor,
			time.UnixMilli(t).UTC().Format(layout))
	}
	for i, s := range ss {
		pts := downsample(s.points, maxPointsPerSeries, t0, t1)
		gap := gapLimit(pts)
		var line []string
		flush := func() {
			if len(line) == 1 {
				line = append(line, line[0])
			}
			if len(line) > 0 {
				fmt.Fprintf(&b, `<polyline class="line s%d" points="%s"/>`, i, strings.Join(line, " "))
			}
			line = line[:0]
		}
		for j, p := range pts {
			if j > 0 && p.t-pts[j-1].t > gap {
				flush()
			}
			line = append(line, fmt.Sprintf("%.1f,%.1f", x(p.t), y(p.v)))
		}
		flush()
		if len(pts) > 0 {
			last := pts[len(pts)-1]
			fmt.Fprintf(&b, `<circle class="dot s%d" cx="%.1f" cy="%.1f" r="3"><title>%s: %s at %s</title></circle>`, i,
				x(last.t), y(last.v), html.EscapeString(s.name), html.EscapeString(format(last.v)),
				time.UnixMilli(last.t).UTC().Format("2006-01-02 15:04:05"))
		}
		lx := plotR - 130*(len(ss)-i)
		fmt.Fprintf(&b, `<line class="line s%d" x1="%d" x2="%d" y1="8" y2="8"/><text class="legend" x="%d" y="11">%s</text>`,
			i, lx, lx+14, lx+18, html.EscapeString(s.name))
	}
	b.WriteString(`</svg>`)
	return template.HTML(b.String())
}

// gapLimit is the time between points beyond which the line breaks: three
// times the median interval.
func gapLimit(pts []point) int64 {
	if len(pts) < 3 {
		return math.MaxInt64
	}
	d := make([]int64, 0, len(pts)-1)
	for i := 1; i < len(pts); i++ {
		d = append(d, pts[i].t-pts[i-1].t)
	}
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	return max(3*d[len(d)/2], 1)
}

// downsample averages points into at most n time buckets.
func downsample(pts []point, n int, t0, t1 int64) []point {
	if len(pts) <= n {
		return pts
	}
	out := make([]point, 0, n)
	width := float64(t1-t0) / float64(n)
	var sumT, sumV float64
	count, bucket := 0, -1
	for _, p := range pts {
		b := int(float64(p.t-t0) / width)
		if b != bucket && count > 0 {
			out = append(out, point{int64(sumT / float64(count)), sumV / float64(count)})
			sumT, sumV, count = 0, 0, 0
		}
		bucket = b
		sumT += float64(p.t)
		sumV += p.v
		count++
	}
	if count > 0 {
		out = append(out, point{int64(sumT / float64(count)), sumV / float64(count)})
	}
	return out
}

// deviceCharts turns history samples into the device page's charts.
func deviceCharts(samples []fleet.Sample, from, to time.Time) []template.HTML {
	var cpu, temp, rssi, rsrp, sinr, rx, tx []point
	for i, s := range samples {
		t := s.At.UnixMilli()
		add := func(dst *[]point, v *float64) {
			if v != nil {
				*dst = append(*dst, point{t, *v})
			}
		}
		add(&cpu, s.CPU)
		add(&temp, s.Temperature)
		add(&rssi, s.RSSI)
		add(&rsrp, s.RSRP)
		add(&sinr, s.SINR)
		if i > 0 {
			p := samples[i-1]
			dt := s.At.Sub(p.At).Seconds()
			if dt > 0 {
				if s.RxBytes != nil && p.RxBytes != nil && *s.RxBytes >= *p.RxBytes {
					rx = append(rx, point{t, float64(*s.RxBytes-*p.RxBytes) * 8 / dt})
				}
				if s.TxBytes != nil && p.TxBytes != nil && *s.TxBytes >= *p.TxBytes {
					tx = append(tx, point{t, float64(*s.TxBytes-*p.TxBytes) * 8 / dt})
				}
			}
		}
	}
	unit := func(u string, prec int) func(float64) string {
		return func(v float64) string { return fmt.Sprintf("%.*f%s", prec, v, u) }
	}
	return []template.HTML{
		chart("CPU (%)", from, to, []series{{"CPU", cpu}}, unit(" %", 0)),
		chart("Temperature (°C)", from, to, []series{{"temperature", temp}}, unit(" °C", 1)),
		chart("Traffic (bit/s, all interfaces)", from, to, []series{{"received", rx}, {"sent", tx}}, bitRate),
		chart("Signal", from, to, []series{{"RSSI dBm", rssi}, {"RSRP dBm", rsrp}, {"SINR dB", sinr}}, unit("", 0)),
	}
}

func bitRate(v float64) string { return render.SI(v, []string{"bit/s", "kbit/s", "Mbit/s", "Gbit/s"}) }
