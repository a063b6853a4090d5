package perf

import (
	"fmt"
	"html"
	"strings"

	"github.com/drover/drover/internal/render"
)

// doc is a protocol as a list of blocks, rendered to Markdown or HTML.
type doc struct {
	title  string
	blocks []block
}

type block struct {
	heading string   // a section heading
	para    string   // a paragraph (Markdown inline: only `code` and **bold**)
	table   *table   // a table
	items   []string // a bullet list
	chart   *chart   // HTML only
}

type table struct {
	head []string
	rows [][]string
}

func (d *doc) h(s string)           { d.blocks = append(d.blocks, block{heading: s}) }
func (d *doc) p(f string, a ...any) { d.blocks = append(d.blocks, block{para: fmt.Sprintf(f, a...)}) }
func (d *doc) list(items ...string) { d.blocks = append(d.blocks, block{items: items}) }
func (d *doc) tab(t *table)         { d.blocks = append(d.blocks, block{table: t}) }
func (d *doc) chartBlock(c *chart)  { d.blocks = append(d.blocks, block{chart: c}) }

func newTable(head ...string) *table { return &table{head: head} }
func (t *table) row(cells ...string) { t.rows = append(t.rows, cells) }

func mdCell(s string) string {
	s = strings.ReplaceAll(s, "|", `\|`)
	return strings.ReplaceAll(s, "\n", " ")
}

// markdown renders d as GitHub-flavoured Markdown.
func (d *doc) markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "# %s\n", d.title)
	for _, bl := range d.blocks {
		switch {
		case bl.heading != "":
			fmt.Fprintf(&b, "\n## %s\n", bl.heading)
		case bl.para != "":
			fmt.Fprintf(&b, "\n%s\n", bl.para)
		case bl.items != nil:
			b.WriteString("\n")
			for _, it := range bl.items {
				fmt.Fprintf(&b, "- %s\n", it)
			}
		case bl.table != nil:
			t := bl.table
			b.WriteString("\n|")
			for _, h := range t.head {
				fmt.Fprintf(&b, " %s |", mdCell(h))
			}
			b.WriteString("\n|")
			for i := range t.head {
				if i == 0 {
					b.WriteString("---|")
				} else {
					b.WriteString("--:|")
				}
			}
			b.WriteString("\n")
			for _, r := range t.rows {
				b.WriteString("|")
				for _, c := range r {
					fmt.Fprintf(&b, " %s |", mdCell(c))
				}
				b.WriteString("\n")
			}
		}
	}
	return b.String()
}

// inline turns the Markdown subset of paragraphs into HTML.
func inline(s string) string {
	s = html.EscapeString(s)
	s = replacePairs(s, "`", "<code>", "</code>")
	s = replacePairs(s, "**", "<strong>", "</strong>")
	return s
}

func replacePairs(s, mark, open, close string) string {
	var b strings.Builder
	on := false
	for {
		i := strings.Index(s, mark)
		if i < 0 {
			break
		}
		b.WriteString(s[:i])
		if on {
			b.WriteString(close)
		} else {
			b.WriteString(open)
		}
		on = !on
		s = s[i+len(mark):]
	}
	b.WriteString(s)
	if on {
		b.WriteString(close)
	}
	return b.String()
}

const htmlStyle = `body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;max-width:1000px;margin:2em auto;padding:0 1em;color:#1d2330}
h1{font-size:1.6em}h2{font-size:1.25em;margin-top:1.8em;border-bottom:1px solid #d8dde6}
table{border-collapse:collapse;margin:.6em 0}th,td{border:1px solid #d8dde6;padding:.25em .6em;text-align:right;vertical-align:top}
th:first-child,td:first-child,td.t{text-align:left}th{background:#f1f4f8}code{background:#f1f4f8;padding:0 .2em}
.pass{color:#17803d;font-weight:bold}.fail{color:#b42318;font-weight:bold}.limit{color:#b54708;font-weight:bold}
svg{display:block;margin:.8em 0}svg text{font:11px system-ui,sans-serif;fill:#444}`

// html renders d as one self-contained HTML page: inline CSS and SVG, no
// script, nothing fetched.
func (d *doc) html() string {
	var b strings.Builder
	b.WriteString("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n")
	fmt.Fprintf(&b, "<title>%s</title>\n<style>\n%s\n</style>\n</head>\n<body>\n<h1>%s</h1>\n", html.EscapeString(d.title), htmlStyle, html.EscapeString(d.title))
	for _, bl := range d.blocks {
		switch {
		case bl.heading != "":
			fmt.Fprintf(&b, "<h2>%s</h2>\n", html.EscapeString(bl.heading))
		case bl.para != "":
			fmt.Fprintf(&b, "<p>%s</p>\n", verdictClass(inline(bl.para)))
		case bl.items != nil:
			b.WriteString("<ul>\n")
			for _, it := range bl.items {
				fmt.Fprintf(&b, "<li>%s</li>\n", inline(it))
			}
			b.WriteString("</ul>\n")
		case bl.table != nil:
			b.WriteString("<table>\n<tr>")
			for _, h := range bl.table.head {
				fmt.Fprintf(&b, "<th>%s</th>", html.EscapeString(h))
			}
			b.WriteString("</tr>\n")
			for _, r := range bl.table.rows {
				b.WriteString("<tr>")
				for _, c := range r {
					if numeric(c) {
						fmt.Fprintf(&b, "<td>%s</td>", verdictClass(inline(c)))
					} else {
						fmt.Fprintf(&b, "<td class=\"t\">%s</td>", verdictClass(inline(c)))
					}
				}
				b.WriteString("</tr>\n")
			}
			b.WriteString("</table>\n")
		case bl.chart != nil:
			b.WriteString(bl.chart.svg())
		}
	}
	b.WriteString("</body>\n</html>\n")
	return b.String()
}

// numeric tells a cell that reads as a number (right-aligned) from text.
func numeric(s string) bool {
	if s == "" || s == "—" || s == "n/a" {
		return true
	}
	c := s[0]
	return c >= '0' && c <= '9' || c == '-' && len(s) > 1
}

func verdictClass(s string) string {
	s = strings.ReplaceAll(s, "<strong>"+passed+"</strong>", `<span class="pass">`+passed+`</span>`)
	s = strings.ReplaceAll(s, "<strong>"+Failed+"</strong>", `<span class="fail">`+Failed+`</span>`)
	return strings.ReplaceAll(s, "<strong>"+limited+"</strong>", `<span class="limit">`+limited+`</span>`)
}

// chart is a line chart over the time since the start, drawn by
// render.Chart.
type chart struct {
	title  string
	unit   string
	xs     []float64 // seconds
	series []render.Series
}

func (c *chart) add(name string, ys []float64) {
	c.series = append(c.series, render.Series{Name: name, X: c.xs, Y: ys})
}

// svg draws the chart; coordinates are printed with fixed precision so that
// the output is stable.
func (c *chart) svg() string {
	xmax := 1.0
	if len(c.xs) > 0 && c.xs[len(c.xs)-1] > 0 {
		xmax = c.xs[len(c.xs)-1]
	}
	rc := render.Chart{Title: c.title, XLabel: "time since start; " + c.unit, Series: c.series,
		XRange: &[2]float64{0, xmax}, XTicks: render.EvenTicks(4, render.Elapsed), YZero: true,
		Standalone: true, Width: 900, Height: 240}
	return rc.SVG() + "\n"
}
