package render

import (
	"fmt"
	"html"
	"math"
	"slices"
	"strconv"
	"strings"
)

// Chart is a line chart drawn as inline SVG: the dashboard's device
// history, the emulator report's and the perf report's charts. Elements
// carry classes (chart, plot, grid, axis, line sN, dot sN, legend, nodata)
// for a stylesheet; Standalone adds colours and fonts as attributes for
// documents without one. Never a script or a style attribute (the
// dashboard's Content-Security-Policy forbids both).
type Chart struct {
	Title          string
	XLabel, YLabel string // under the x axis, beside the y axis; "" for none
	Series         []Series
	// Width and Height in px; 0: 720 × 200.
	Width, Height int
	// XRange fixes the x axis; nil: the data's range (widened to XTicks'
	// fixed ticks).
	XRange *[2]float64
	// XTicks places and labels the x ticks over the axis' range; nil:
	// NiceTicks(8, Number).
	XTicks func(lo, hi float64) []Tick
	// YFormat labels the y ticks; nil: Number.
	YFormat func(float64) string
	// YZero starts a linear y axis at 0; otherwise it starts at 0 only for
	// values that cannot be negative and are near it.
	YZero bool
	// LogY draws y on a log10 axis, leaving out values ≤ 0.
	LogY bool
	// Thin averages each series to at most one point per x pixel and
	// breaks its line where points are more than 3 median spacings apart
	// (irregular samples, such as a device's history).
	Thin bool
	// Last, when set, marks each series' last point with a dot titled
	// Last(series, x, y).
	Last func(series string, x, y float64) string
	// Standalone draws the title and colours and fonts as attributes.
	Standalone bool
	// NoData is the text of a chart without points; "": "no data".
	NoData string
}

// Series is one line; a NaN y breaks it.
type Series struct {
	Name    string
	X, Y    []float64
	Markers bool // a dot on every point
}

// Tick is an axis value and its label.
type Tick struct {
	V     float64
	Label string
}

// NiceTicks are n or fewer ticks at NiceStep multiples within the range.
func NiceTicks(n int, format func(float64) string) func(lo, hi float64) []Tick {
	return func(lo, hi float64) []Tick {
		step := NiceStep(hi-lo, n)
		var out []Tick
		for v := math.Ceil(lo/step) * step; v <= hi+step/1e6; v += step {
			out = append(out, Tick{v, format(v)})
		}
		return out
	}
}

// EvenTicks are n+1 ticks evenly spaced from lo to hi.
func EvenTicks(n int, format func(float64) string) func(lo, hi float64) []Tick {
	return func(lo, hi float64) []Tick {
		out := make([]Tick, 0, n+1)
		for i := 0; i <= n; i++ {
			v := lo + (hi-lo)*float64(i)/float64(n)
			out = append(out, Tick{v, format(v)})
		}
		return out
	}
}

// FixedTicks are the given ticks whatever the range.
func FixedTicks(t []Tick) func(lo, hi float64) []Tick {
	return func(float64, float64) []Tick { return t }
}

// Number labels an axis value briefly: 0, 0.25, 12.5, 250, 25k, 2.5M.
func Number(v float64) string {
	a := math.Abs(v)
	switch {
	case a == 0:
		return "0"
	case a >= 1e6:
		return strconv.FormatFloat(v/1e6, 'f', -1, 64) + "M"
	case a >= 1e4:
		return strconv.FormatFloat(v/1e3, 'f', -1, 64) + "k"
	case a >= 1:
		return strconv.FormatFloat(math.Round(v*100)/100, 'f', -1, 64)
	}
	return strconv.FormatFloat(v, 'g', 3, 64)
}

// palette colours the series of standalone charts.
var palette = []string{"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"}

const (
	plotL, plotR = 84, 8 // margins
	font         = ` font-family="sans-serif" font-size="11" fill="#444"`
)

// SVG draws the chart.
func (c *Chart) SVG() string {
	w, h := c.Width, c.Height
	if w == 0 || h == 0 {
		w, h = 720, 200
	}
	top, bottom := 14, 28
	if c.Standalone {
		top += 20
	}
	if c.XLabel != "" {
		bottom += 16
	}
	left, right := plotL, w-plotR
	pt, pb := top, h-bottom
	attr := func(a string) string {
		if c.Standalone {
			return a
		}
		return ""
	}
	var b strings.Builder
	title := html.EscapeString(c.Title)
	fmt.Fprintf(&b, `<svg class="chart" viewBox="0 0 %d %d"%s role="img" aria-label="%s" xmlns="http://www.w3.org/2000/svg">`,
		w, h, attr(fmt.Sprintf(` width="%d" height="%d"`, w, h)), title)
	fmt.Fprintf(&b, `<title>%s</title>`, title)
	if c.Standalone {
		fmt.Fprintf(&b, `<text class="title" x="%d" y="18"%s font-weight="bold">%s</text>`, left, font, title)
	}
	fmt.Fprintf(&b, `<rect class="plot" x="%d" y="%d" width="%d" height="%d"%s/>`, left, pt, right-left, pb-pt, attr(` fill="none" stroke="#888"`))

	// The points that can be drawn, and their ranges.
	ys := make([][]float64, len(c.Series))
	xs := make([][]float64, len(c.Series))
	x0, x1, y0, y1 := math.Inf(1), math.Inf(-1), math.Inf(1), math.Inf(-1)
	for i, s := range c.Series {
		n := min(len(s.X), len(s.Y))
		xs[i], ys[i] = s.X[:n], s.Y[:n]
		for j := range n {
			y := s.Y[j]
			if math.IsNaN(y) || (c.LogY && y <= 0) {
				continue
			}
			x0, x1 = min(x0, s.X[j]), max(x1, s.X[j])
			y0, y1 = min(y0, y), max(y1, y)
		}
	}
	if math.IsInf(y0, 1) {
		text := c.NoData
		if text == "" {
			text = "no data"
		}
		fmt.Fprintf(&b, `<text class="nodata" x="%d" y="%d" text-anchor="middle"%s>%s</text></svg>`,
			(left+right)/2, (pt+pb)/2, attr(font), html.EscapeString(text))
		return b.String()
	}
	if c.XRange != nil {
		x0, x1 = c.XRange[0], c.XRange[1]
	}
	xTicks := c.XTicks
	if xTicks == nil {
		xTicks = NiceTicks(8, Number)
	}
	if c.XRange == nil {
		for _, t := range xTicks(x0, x1) {
			x0, x1 = min(x0, t.V), max(x1, t.V)
		}
	}
	if x1 <= x0 {
		x1 = x0 + 1
	}
	xmap := func(v float64) float64 { return float64(left) + (v-x0)/(x1-x0)*float64(right-left) }

	yFormat := c.YFormat
	if yFormat == nil {
		yFormat = Number
	}
	var yt []Tick
	var ymap func(float64) float64
	if c.LogY {
		lo, hi := math.Floor(math.Log10(y0)), math.Ceil(math.Log10(y1))
		if hi == lo {
			hi = lo + 1
		}
		for e := lo; e <= hi; e++ {
			yt = append(yt, Tick{math.Pow(10, e), yFormat(math.Pow(10, e))})
		}
		ymap = func(v float64) float64 { return float64(pb) - (math.Log10(v)-lo)/(hi-lo)*float64(pb-pt) }
	} else {
		if c.YZero || (y0 >= 0 && (y0 == y1 || y0 < (y1-y0)/4)) {
			y0 = min(y0, 0) // no negative axis for values that cannot be negative
		}
		for _, v := range Ticks(y0, y1, 4) {
			yt = append(yt, Tick{v, yFormat(v)})
		}
		lo, hi := yt[0].V, yt[len(yt)-1].V
		ymap = func(v float64) float64 { return float64(pb) - (v-lo)/(hi-lo)*float64(pb-pt) }
	}
	for _, t := range yt {
		y := ymap(t.V)
		fmt.Fprintf(&b, `<line class="grid" x1="%d" x2="%d" y1="%.1f" y2="%.1f"%s/>`, left, right, y, y, attr(` stroke="#ddd"`))
		fmt.Fprintf(&b, `<text class="axis" x="%d" y="%.1f" text-anchor="end"%s>%s</text>`, left-4, y+4, attr(font), html.EscapeString(t.Label))
	}
	xt := xTicks(x0, x1)
	for i, t := range xt {
		anchor := "middle"
		if c.XRange != nil && i == 0 && t.V == x0 {
			anchor = "start"
		} else if i == len(xt)-1 && t.V == x1 {
			anchor = "end"
		}
		fmt.Fprintf(&b, `<text class="axis" x="%.1f" y="%d" text-anchor="%s"%s>%s</text>`, xmap(t.V), pb+16, anchor, attr(font), html.EscapeString(t.Label))
	}
	if c.XLabel != "" {
		fmt.Fprintf(&b, `<text class="axis" x="%d" y="%d" text-anchor="end"%s>%s</text>`, right, h-6, attr(font), html.EscapeString(c.XLabel))
	}
	if c.YLabel != "" {
		mid := (pt + pb) / 2
		fmt.Fprintf(&b, `<text class="axis" x="12" y="%d" text-anchor="middle" transform="rotate(-90 12 %d)"%s>%s</text>`, mid, mid, attr(font), html.EscapeString(c.YLabel))
	}

	lx := right
	for i, s := range c.Series {
		colour := palette[i%len(palette)]
		stroke := attr(fmt.Sprintf(` fill="none" stroke="%s" stroke-width="1.5"`, colour))
		fill := attr(fmt.Sprintf(` fill="%s"`, colour))
		px, py := xs[i], ys[i]
		if c.Thin {
			px, py = thin(px, py, right-left, x0, x1)
		}
		var line []string
		var dots [][2]float64
		flush := func() {
			if len(line) == 1 {
				line = append(line, line[0])
			}
			if len(line) > 0 {
				fmt.Fprintf(&b, `<polyline class="line s%d" points="%s"%s/>`, i, strings.Join(line, " "), stroke)
			}
			line = line[:0]
		}
		gap := math.Inf(1)
		if c.Thin {
			gap = gapLimit(px)
		}
		last := -1
		for j := range px {
			y := py[j]
			if math.IsNaN(y) || (c.LogY && y <= 0) {
				flush()
				continue
			}
			if last >= 0 && px[j]-px[last] > gap {
				flush()
			}
			p := [2]float64{xmap(px[j]), ymap(y)}
			line = append(line, fmt.Sprintf("%.1f,%.1f", p[0], p[1]))
			if s.Markers {
				dots = append(dots, p)
			}
			last = j
		}
		flush()
		for _, d := range dots {
			fmt.Fprintf(&b, `<circle class="dot s%d" cx="%.1f" cy="%.1f" r="2.5"%s/>`, i, d[0], d[1], fill)
		}
		if c.Last != nil && last >= 0 {
			fmt.Fprintf(&b, `<circle class="dot s%d" cx="%.1f" cy="%.1f" r="3"%s><title>%s</title></circle>`, i,
				xmap(px[last]), ymap(py[last]), fill, html.EscapeString(c.Last(s.Name, px[last], py[last])))
		}
	}
	// The legend, right-aligned above the plot.
	for i := len(c.Series) - 1; i >= 0; i-- {
		name := c.Series[i].Name
		lx -= 26 + 7*len([]rune(name))
		ly := pt - 6
		colour := palette[i%len(palette)]
		fmt.Fprintf(&b, `<line class="line s%d" x1="%d" x2="%d" y1="%d" y2="%d"%s/><text class="legend" x="%d" y="%d"%s>%s</text>`,
			i, lx, lx+14, ly, ly, attr(fmt.Sprintf(` stroke="%s" stroke-width="2"`, colour)), lx+18, ly+3, attr(font), html.EscapeString(name))
	}
	b.WriteString(`</svg>`)
	return b.String()
}

// gapLimit is the spacing beyond which a line breaks: three times the
// median spacing of xs.
func gapLimit(xs []float64) float64 {
	if len(xs) < 3 {
		return math.Inf(1)
	}
	d := make([]float64, 0, len(xs)-1)
	for i := 1; i < len(xs); i++ {
		d = append(d, xs[i]-xs[i-1])
	}
	slices.Sort(d)
	return max(3*d[len(d)/2], 1)
}

// thin averages points into at most n x buckets over [x0, x1].
func thin(xs, ys []float64, n int, x0, x1 float64) ([]float64, []float64) {
	if len(xs) <= n {
		return xs, ys
	}
	ox, oy := make([]float64, 0, n), make([]float64, 0, n)
	width := (x1 - x0) / float64(n)
	var sumX, sumY float64
	count, bucket := 0, -1
	for i, x := range xs {
		b := int((x - x0) / width)
		if b != bucket && count > 0 {
			ox, oy = append(ox, math.Trunc(sumX/float64(count))), append(oy, sumY/float64(count))
			sumX, sumY, count = 0, 0, 0
		}
		bucket = b
		sumX += x
		sumY += ys[i]
		count++
	}
	if count > 0 {
		ox, oy = append(ox, math.Trunc(sumX/float64(count))), append(oy, sumY/float64(count))
	}
	return ox, oy
}
