package perf

import (
	"github.com/drover/drover/internal/render"
	"github.com/drover/drover/internal/render/doc"
)

// style is the protocols' look: Markdown inline text, cells aligned by
// content, the verdicts coloured.
var style = doc.Style{Markup: true, CSS: css, RightRule: "--:", NumericCells: true,
	Classes: map[string]string{passed: "pass", Failed: "fail", limited: "limit"}}

const css = `body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;max-width:1000px;margin:2em auto;padding:0 1em;color:#1d2330}
h1{font-size:1.6em}h2{font-size:1.25em;margin-top:1.8em;border-bottom:1px solid #d8dde6}
table{border-collapse:collapse;margin:.6em 0}th,td{border:1px solid #d8dde6;padding:.25em .6em;text-align:right;vertical-align:top}
th:first-child,td:first-child,td.t{text-align:left}th{background:#f1f4f8}code{background:#f1f4f8;padding:0 .2em}
.pass{color:#17803d;font-weight:bold}.fail{color:#b42318;font-weight:bold}.limit{color:#b54708;font-weight:bold}
svg{display:block;margin:.8em 0}svg text{font:11px system-ui,sans-serif;fill:#444}`

// chart is a line chart over the time since the start.
type chart struct {
	title  string
	unit   string
	xs     []float64 // seconds
	series []render.Series
}

func (c *chart) add(name string, ys []float64) {
	c.series = append(c.series, render.Series{Name: name, X: c.xs, Y: ys})
}

// chart is c as a render.Chart.
func (c *chart) chart() render.Chart {
	xmax := 1.0
	if len(c.xs) > 0 && c.xs[len(c.xs)-1] > 0 {
		xmax = c.xs[len(c.xs)-1]
	}
	return render.Chart{Title: c.title, XLabel: "time since start; " + c.unit, Series: c.series,
		XRange: &[2]float64{0, xmax}, XTicks: render.EvenTicks(4, render.Elapsed), YZero: true,
		Standalone: true, Width: 900, Height: 240}
}
