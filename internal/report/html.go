package report

import (
	"math"
	"runtime"

	"github.com/drover/drover/internal/emulator/results"
	"github.com/drover/drover/internal/render"
	"github.com/drover/drover/internal/render/doc"
)

// newChart is one of the report's charts (render.Chart, drawn standalone).
func newChart(title, xLabel, yLabel string, logY bool, ss ...render.Series) render.Chart {
	return render.Chart{Title: title, XLabel: xLabel, YLabel: yLabel, LogY: logY, YZero: true, Series: ss,
		Standalone: true, Width: 760, Height: 300}
}

// xy is a series of (x, y) points.
func xy(name string, pts [][2]float64, markers bool) render.Series {
	s := render.Series{Name: name, X: make([]float64, len(pts)), Y: make([]float64, len(pts)), Markers: markers}
	for i, p := range pts {
		s.X[i], s.Y[i] = p[0], p[1]
	}
	return s
}

func charts(m *results.Merged) []render.Chart {
	var out []render.Chart
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
		th := newChart("Throughput per second", "seconds since start", "operations/s", false,
			xy("pushes accepted", acc, false), xy("push errors", errs, false))
		if len(reg) > 0 {
			th.Series = append(th.Series, xy("registrations", reg, false))
		}
		out = append(out, th)
		if len(p99) > 0 {
			out = append(out, newChart("Push latency per second", "seconds since start", "ms", true,
				xy("p50", p50, false), xy("p99", p99, false), xy("max", pmax, false)))
		}
		out = append(out, newChart("Emulator CPU", "seconds since start", "cores busy", false,
			xy("emulator", cpu, false), xy("whole machine", busy, false)))
		out = append(out, newChart("Emulator memory and operations in flight", "seconds since start", "MiB / operations", false,
			xy("RSS MiB", rss, false), xy("in flight", inflight, false)))
	}
	if sum := m.Summary; sum != nil {
		c := newChart("Latency distribution", "percentile", "ms", true)
		var xt []render.Tick
		maxX := 1.0
		for _, n := range opNames(sum) {
			var pts [][2]float64
			for _, p := range sum.Ops[n].Latency.Distribution() {
				pts = append(pts, [2]float64{nines(p[0], sum.Ops[n].Latency.Count()), p[1]})
			}
			if len(pts) > 0 {
				maxX = max(maxX, pts[len(pts)-1][0])
				c.Series = append(c.Series, xy(n, pts, true))
			}
		}
		if sum.SendLag != nil && sum.SendLag.Count() > 0 {
			var pts [][2]float64
			for _, p := range sum.SendLag.Distribution() {
				pts = append(pts, [2]float64{nines(p[0], sum.SendLag.Count()), p[1]})
			}
			c.Series = append(c.Series, xy("send lag", pts, true))
		}
		for i, label := range []string{"0", "90", "99", "99.9", "99.99", "99.999", "99.9999"} {
			if float64(i) <= maxX+0.01 {
				xt = append(xt, render.Tick{V: float64(i), Label: label})
			}
		}
		c.XTicks = render.FixedTicks(xt)
		if len(c.Series) > 0 {
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
		out = append(out, newChart("Ramp: accepted pushes/s by workers", "workers", "pushes/s", false, xy("accepted/s", rate, true)))
		out = append(out, newChart("Ramp: push p99 by workers", "workers", "ms", true, xy("p99", p99, true)))
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

// style is the report's look: plain text, its own CSS, plots in figures.
var style = doc.Style{CSS: css, Figures: true}

const css = `body { font-family: sans-serif; margin: 2em auto; max-width: 960px; color: #222; padding: 0 1em; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 1.6em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; margin: .6em 0; font-size: .9em; }
th, td { padding: .25em .7em; border-bottom: 1px solid #eee; text-align: left; }
td.r, th.r { text-align: right; font-variant-numeric: tabular-nums; }
dl.meta { display: grid; grid-template-columns: max-content auto; gap: .2em 1em; font-size: .9em; }
dl.meta dt { font-weight: bold; } dl.meta dd { margin: 0; }
.warn { background: #fdecea; border: 2px solid #d62728; color: #8b0000; padding: .6em 1em; margin: .5em 0; font-weight: bold; }
p.note { font-size: .85em; color: #555; }
figure { margin: 1em 0; }`

// plots adds m's charts under "Plots" when withCharts is set.
func plots(d *doc.Doc, m *results.Merged, withCharts bool) {
	if !withCharts {
		return
	}
	cs := charts(m)
	if len(cs) > 0 {
		d.Heading("Plots")
	}
	for _, c := range cs {
		d.Chart(c)
	}
}
