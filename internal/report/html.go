package report

import (
	"fmt"
	"html"
	"html/template"
	"io"
	"math"
	"runtime"
	"strconv"
	"strings"

	"github.com/drover/drover/internal/emulator/results"
	"github.com/drover/drover/internal/render"
)

// chart is a line chart rendered to inline SVG.
type chart struct {
	title, xLabel, yLabel string
	series                []series
	logY                  bool
	xTicks                []tick // fixed x ticks; nil: automatic
}

type series struct {
	name   string
	color  string
	pts    [][2]float64
	points bool // draw markers, not only a line
}

type tick struct {
	v     float64
	label string
}

var palette = []string{"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"}

func charts(m *results.Merged) []chart {
	var out []chart
	if len(m.Intervals) > 1 {
		t0 := float64(m.Intervals[0].TS)
		var acc, errs, reg, p50, p99, pmax, cpu, busy, rss, inflight [][2]float64
		for _, iv := range m.Intervals {
			x := float64(iv.TS) - t0
			d := iv.Dur
			if d <= 0 {
				continue
			}
			p := iv.Ops[results.OpPush]
			if p == nil {
				p = &results.Op{}
			}
			acc = append(acc, [2]float64{x, float64(p.Accepted) / d})
			errs = append(errs, [2]float64{x, float64(p.Errors()) / d})
			if r := iv.Ops[results.OpRegister]; r != nil {
				reg = append(reg, [2]float64{x, float64(r.Done()) / d})
			}
			if s := p.Stats; s != nil && s.Count > 0 {
				p50 = append(p50, [2]float64{x, ms(s.P50)})
				p99 = append(p99, [2]float64{x, ms(s.P99)})
				pmax = append(pmax, [2]float64{x, ms(s.Max)})
			}
			cpu = append(cpu, [2]float64{x, iv.CPU})
			busy = append(busy, [2]float64{x, iv.MachineBusy * float64(cpus(m))})
			rss = append(rss, [2]float64{x, float64(iv.RSS) / (1 << 20)})
			inflight = append(inflight, [2]float64{x, float64(iv.Inflight)})
		}
		th := chart{title: "Throughput per second", xLabel: "seconds since start", yLabel: "operations/s",
			series: []series{{name: "pushes accepted", pts: acc}, {name: "push errors", pts: errs}}}
		if len(reg) > 0 {
			th.series = append(th.series, series{name: "registrations", pts: reg})
		}
		out = append(out, th)
		if len(p99) > 0 {
			out = append(out, chart{title: "Push latency per second", xLabel: "seconds since start", yLabel: "ms", logY: true,
				series: []series{{name: "p50", pts: p50}, {name: "p99", pts: p99}, {name: "max", pts: pmax}}})
		}
		out = append(out, chart{title: "Emulator CPU", xLabel: "seconds since start", yLabel: "cores busy",
			series: []series{{name: "emulator", pts: cpu}, {name: "whole machine", pts: busy}}})
		out = append(out, chart{title: "Emulator memory and operations in flight", xLabel: "seconds since start", yLabel: "MiB / operations",
			series: []series{{name: "RSS MiB", pts: rss}, {name: "in flight", pts: inflight}}})
	}
	if sum := m.Summary; sum != nil {
		c := chart{title: "Latency distribution", xLabel: "percentile", yLabel: "ms", logY: true}
		maxX := 1.0
		for _, n := range opNames(sum) {
			var pts [][2]float64
			for _, p := range sum.Ops[n].Latency.Distribution() {
				pts = append(pts, [2]float64{nines(p[0], sum.Ops[n].Latency.Count()), p[1]})
			}
			if len(pts) > 0 {
				maxX = max(maxX, pts[len(pts)-1][0])
				c.series = append(c.series, series{name: n, pts: pts, points: true})
			}
		}
		if sum.SendLag != nil && sum.SendLag.Count() > 0 {
			var pts [][2]float64
			for _, p := range sum.SendLag.Distribution() {
				pts = append(pts, [2]float64{nines(p[0], sum.SendLag.Count()), p[1]})
			}
			c.series = append(c.series, series{name: "send lag", pts: pts, points: true})
		}
		for i, label := range []string{"0", "90", "99", "99.9", "99.99", "99.999", "99.9999"} {
			if float64(i) <= maxX+0.01 {
				c.xTicks = append(c.xTicks, tick{float64(i), label})
			}
		}
		if len(c.series) > 0 {
			out = append(out, c)
		}
	}
	if len(m.Steps) > 0 {
		var rate, p99 [][2]float64
		for _, st := range m.Steps {
			x := float64(st.Concurrency)
			o := st.Ops[results.OpPush]
			d := st.End.Sub(st.Start).Seconds()
			if o == nil || d <= 0 {
				continue
			}
			rate = append(rate, [2]float64{x, float64(o.Accepted) / d})
			p99 = append(p99, [2]float64{x, ms(o.Latency.Quantile(0.99))})
		}
		out = append(out, chart{title: "Ramp: accepted pushes/s by workers", xLabel: "workers", yLabel: "pushes/s",
			series: []series{{name: "accepted/s", pts: rate, points: true}}})
		out = append(out, chart{title: "Ramp: push p99 by workers", xLabel: "workers", yLabel: "ms", logY: true,
			series: []series{{name: "p99", pts: p99, points: true}}})
	}
	return out
}

func cpus(m *results.Merged) int {
	if len(m.Starts) > 0 && m.Starts[0].CPUs > 0 {
		return m.Starts[0].CPUs
	}
	return runtime.NumCPU()
}

func ms(d interface{ Seconds() float64 }) float64 { return d.Seconds() * 1000 }

// nines maps quantile q to −log10(1−q): 90 % → 1, 99 % → 2; the maximum
// (q = 1) goes to log10(count), where the last recorded value sits.
func nines(q float64, count int64) float64 {
	if q >= 1 {
		return math.Max(math.Log10(float64(count)), 0.3)
	}
	return -math.Log10(1 - q)
}

const (
	chartW, chartH                   = 760, 300
	padL, padR, padT, padB           = 70, 20, 34, 46
	plotW, plotH                     = chartW - padL - padR, chartH - padT - padB
	fontAttrs                        = `font-family="sans-serif" font-size="11"`
	gridColor, axisColor, labelColor = "#ddd", "#888", "#333"
)

func (c chart) svg() string {
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" role="img" aria-label="%s">`,
		chartW, chartH, chartW, chartH, html.EscapeString(c.title))
	fmt.Fprintf(&b, `<text x="%d" y="18" %s font-size="13" font-weight="bold" fill="%s">%s</text>`, padL, fontAttrs, labelColor, html.EscapeString(c.title))
	x0, x1, y0, y1 := math.Inf(1), math.Inf(-1), math.Inf(1), math.Inf(-1)
	for _, s := range c.series {
		for _, p := range s.pts {
			if c.logY && p[1] <= 0 {
				continue
			}
			x0, x1 = math.Min(x0, p[0]), math.Max(x1, p[0])
			y0, y1 = math.Min(y0, p[1]), math.Max(y1, p[1])
		}
	}
	if math.IsInf(x0, 1) {
		fmt.Fprintf(&b, `<text x="%d" y="%d" %s fill="%s">no data</text></svg>`, padL, padT+plotH/2, fontAttrs, labelColor)
		return b.String()
	}
	for _, t := range c.xTicks {
		x0, x1 = math.Min(x0, t.v), math.Max(x1, t.v)
	}
	if x1 == x0 {
		x1 = x0 + 1
	}
	var yt []tick
	var ymap func(float64) float64
	if c.logY {
		lo, hi := math.Floor(math.Log10(y0)), math.Ceil(math.Log10(y1))
		if hi == lo {
			hi = lo + 1
		}
		for e := lo; e <= hi; e++ {
			yt = append(yt, tick{e, axisNum(math.Pow(10, e))})
		}
		ymap = func(v float64) float64 { return padT + plotH - (math.Log10(v)-lo)/(hi-lo)*plotH }
	} else {
		lo := 0.0
		step := render.NiceStep(y1-lo, 5)
		hi := math.Ceil(y1/step) * step
		if hi <= lo {
			hi = lo + 1
			step = 0.2
		}
		for v := lo; v <= hi+step/2; v += step {
			yt = append(yt, tick{v, axisNum(v)})
		}
		ymap = func(v float64) float64 { return padT + plotH - (v-lo)/(hi-lo)*plotH }
	}
	xmap := func(v float64) float64 { return padL + (v-x0)/(x1-x0)*plotW }
	xt := c.xTicks
	if xt == nil {
		step := render.NiceStep(x1-x0, 8)
		for v := math.Ceil(x0/step) * step; v <= x1+step/1e6; v += step {
			xt = append(xt, tick{v, axisNum(v)})
		}
	}
	// grid and ticks
	for _, t := range yt {
		v := t.v
		if c.logY {
			v = math.Pow(10, t.v)
		}
		y := ymap(v)
		fmt.Fprintf(&b, `<line x1="%d" y1="%s" x2="%d" y2="%s" stroke="%s"/>`, padL, f1(y), padL+plotW, f1(y), gridColor)
		fmt.Fprintf(&b, `<text x="%d" y="%s" %s fill="%s" text-anchor="end">%s</text>`, padL-6, f1(y+4), fontAttrs, labelColor, t.label)
	}
	for _, t := range xt {
		x := xmap(t.v)
		fmt.Fprintf(&b, `<line x1="%s" y1="%d" x2="%s" y2="%d" stroke="%s"/>`, f1(x), padT, f1(x), padT+plotH, gridColor)
		fmt.Fprintf(&b, `<text x="%s" y="%d" %s fill="%s" text-anchor="middle">%s</text>`, f1(x), padT+plotH+16, fontAttrs, labelColor, t.label)
	}
	fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="%s"/>`, padL, padT, plotW, plotH, axisColor)
	fmt.Fprintf(&b, `<text x="%d" y="%d" %s fill="%s" text-anchor="middle">%s</text>`, padL+plotW/2, chartH-8, fontAttrs, labelColor, html.EscapeString(c.xLabel))
	fmt.Fprintf(&b, `<text x="14" y="%d" %s fill="%s" text-anchor="middle" transform="rotate(-90 14 %d)">%s</text>`, padT+plotH/2, fontAttrs, labelColor, padT+plotH/2, html.EscapeString(c.yLabel))
	// series
	for i, s := range c.series {
		color := s.color
		if color == "" {
			color = palette[i%len(palette)]
		}
		var pts []string
		for _, p := range s.pts {
			if c.logY && p[1] <= 0 {
				continue
			}
			pts = append(pts, f1(xmap(p[0]))+","+f1(ymap(p[1])))
		}
		if len(pts) > 1 {
			fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="1.5" points="%s"/>`, color, strings.Join(pts, " "))
		}
		if s.points || len(pts) == 1 {
			for _, p := range pts {
				x, y, _ := strings.Cut(p, ",")
				fmt.Fprintf(&b, `<circle cx="%s" cy="%s" r="2.5" fill="%s"/>`, x, y, color)
			}
		}
		lx := padL + plotW - 150
		ly := padT + 14 + i*15
		fmt.Fprintf(&b, `<rect x="%d" y="%d" width="12" height="3" fill="%s"/>`, lx, ly-4, color)
		fmt.Fprintf(&b, `<text x="%d" y="%d" %s fill="%s">%s</text>`, lx+16, ly, fontAttrs, labelColor, html.EscapeString(s.name))
	}
	b.WriteString(`</svg>`)
	return b.String()
}

func f1(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) }

func axisNum(v float64) string {
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

var page = template.Must(template.New("report").Parse(`<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{{.Title}}</title>
<style>
body { font-family: sans-serif; margin: 2em auto; max-width: 960px; color: #222; padding: 0 1em; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 1.6em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; margin: .6em 0; font-size: .9em; }
th, td { padding: .25em .7em; border-bottom: 1px solid #eee; text-align: left; }
td.r, th.r { text-align: right; font-variant-numeric: tabular-nums; }
dl.meta { display: grid; grid-template-columns: max-content auto; gap: .2em 1em; font-size: .9em; }
dl.meta dt { font-weight: bold; } dl.meta dd { margin: 0; }
.warn { background: #fdecea; border: 2px solid #d62728; color: #8b0000; padding: .6em 1em; margin: .5em 0; font-weight: bold; }
p.note { font-size: .85em; color: #555; }
figure { margin: 1em 0; }
</style>
</head>
<body>
<h1>{{.Title}}</h1>
<dl class="meta">{{range .Meta}}<dt>{{index . 0}}</dt><dd>{{index . 1}}</dd>{{end}}</dl>
{{range .Warnings}}<div class="warn">WARNING: {{.}}</div>
{{end}}{{range .Sections}}<h2>{{.Title}}</h2>
{{range .Tables}}<table>
<tr>{{range .Head}}<th{{if .Right}} class="r"{{end}}>{{.Text}}</th>{{end}}</tr>
{{range .Rows}}<tr>{{range .}}<td{{if .Right}} class="r"{{end}}>{{.Text}}</td>{{end}}</tr>
{{end}}</table>
{{end}}{{range .Notes}}<p class="note">{{.}}</p>
{{end}}{{end}}{{if .Charts}}<h2>Plots</h2>
{{range .Charts}}<figure>{{.}}</figure>
{{end}}{{end}}</body>
</html>
`))

type htmlCell struct {
	Text  string
	Right bool
}

type htmlTable struct {
	Head []htmlCell
	Rows [][]htmlCell
}

type htmlSection struct {
	Title  string
	Tables []htmlTable
	Notes  []string
}

func renderHTML(w io.Writer, d *doc) error {
	data := struct {
		Title    string
		Meta     [][2]string
		Warnings []string
		Sections []htmlSection
		Charts   []template.HTML
	}{Title: d.title, Meta: d.meta, Warnings: d.warnings}
	for _, s := range d.sections {
		hs := htmlSection{Title: s.title, Notes: s.notes}
		for _, t := range s.tables {
			ht := htmlTable{}
			for i, h := range t.head {
				ht.Head = append(ht.Head, htmlCell{h, t.right[i]})
			}
			for _, r := range t.rows {
				var row []htmlCell
				for i, c := range r {
					row = append(row, htmlCell{c, t.right[i]})
				}
				ht.Rows = append(ht.Rows, row)
			}
			hs.Tables = append(hs.Tables, ht)
		}
		data.Sections = append(data.Sections, hs)
	}
	for _, c := range d.charts {
		data.Charts = append(data.Charts, template.HTML(c.svg())) // built from escaped parts
	}
	return page.Execute(w, data)
}
