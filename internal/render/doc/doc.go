// Package doc is the document model of Drover's reports (internal/report,
// internal/perf): a title and a list of blocks (headings, paragraphs, notes,
// lists, warnings, key/value lists, tables, charts), written as Markdown, as
// one self-contained HTML page, or as plain text.
package doc

import (
	"fmt"
	"strings"

	"github.com/drover/drover/internal/render"
)

// Style is how a family of documents is written: what its text means, its
// page's CSS and the few spellings in which Drover's reports differ.
type Style struct {
	// Markup: paragraphs, notes, list items, warnings, meta values and cells
	// are Markdown's inline subset (`code`, **bold**), written to Markdown
	// as they are (cells with | escaped) and to HTML as <code> and
	// <strong>. Otherwise all text is plain and is escaped in Markdown.
	Markup bool
	// CSS is the HTML page's style sheet.
	CSS string
	// RightRule is the Markdown rule under a right-aligned column's head;
	// "---:" when empty.
	RightRule string
	// NumericCells: an HTML cell that does not read as a number gets class
	// "t" (the CSS aligns the rest right) and head cells get none.
	// Otherwise the cells of right-aligned columns get class "r".
	NumericCells bool
	// Classes are bold texts that HTML shows as <span class="…"> instead
	// of <strong>: {"PASSED": "pass"}.
	Classes map[string]string
	// Figures wraps each HTML chart in <figure>.
	Figures bool
}

// Doc is a document. Build it with the methods below, in reading order.
type Doc struct {
	Title  string
	style  Style
	blocks []block
}

type kind int

const (
	heading kind = iota
	para
	note
	list
	warning
	meta
	table
	chart
)

type block struct {
	kind  kind
	text  string      // heading, para, note, warning
	items []string    // list
	pairs [][2]string // meta
	table *Table
	chart render.Chart
}

// New is an empty document written in style s.
func New(title string, s Style) *Doc { return &Doc{Title: title, style: s} }

// Heading starts a section.
func (d *Doc) Heading(s string) { d.add(block{kind: heading, text: s}) }

// Paraf is a paragraph, formatted as by fmt.Sprintf; an empty one is left
// out.
func (d *Doc) Paraf(format string, a ...any) {
	d.add(block{kind: para, text: fmt.Sprintf(format, a...)})
}

// Note is a paragraph of commentary (HTML: class "note").
func (d *Doc) Note(s string) { d.add(block{kind: note, text: s}) }

// List is a bullet list; an empty one is left out.
func (d *Doc) List(items ...string) { d.add(block{kind: list, items: items}) }

// Warning is a warning that stands out.
func (d *Doc) Warning(s string) { d.add(block{kind: warning, text: s}) }

// Meta is a list of key/value pairs describing the document; it is written
// even when empty.
func (d *Doc) Meta(pairs [][2]string) { d.add(block{kind: meta, pairs: pairs}) }

// Table adds t; rows added to t later still show.
func (d *Doc) Table(t *Table) { d.add(block{kind: table, table: t}) }

// Chart adds a chart, drawn in HTML only.
func (d *Doc) Chart(c render.Chart) { d.add(block{kind: chart, chart: c}) }

func (d *Doc) add(b block) { d.blocks = append(d.blocks, b) }

// Table is a table with a head row.
type Table struct {
	Head  []string
	Rows  [][]string
	Right []bool // right-aligned columns; missing ones are left-aligned
}

// NewTable is a table whose first column is aligned left and the others
// right (labels, then numbers).
func NewTable(head ...string) *Table {
	t := &Table{Head: head, Right: make([]bool, len(head))}
	for i := 1; i < len(head); i++ {
		t.Right[i] = true
	}
	return t
}

// Row adds a row.
func (t *Table) Row(cells ...string) { t.Rows = append(t.Rows, cells) }

func (t *Table) right(i int) bool { return i < len(t.Right) && t.Right[i] }

// Cell escapes Markdown inline text for a table cell: | and line breaks
// would end the cell.
func Cell(s string) string {
	s = strings.ReplaceAll(s, "|", `\|`)
	return strings.ReplaceAll(s, "\n", " ")
}

var plainMarkdown = strings.NewReplacer("|", `\|`, "*", `\*`, "_", `\_`, "<", "&lt;", ">", "&gt;")

// mdText is s as Markdown.
func (d *Doc) mdText(s string) string {
	if d.style.Markup {
		return s
	}
	return plainMarkdown.Replace(s)
}

func (d *Doc) mdCell(s string) string {
	if d.style.Markup {
		return Cell(s)
	}
	return strings.ReplaceAll(plainMarkdown.Replace(s), "\n", " ")
}

// Markdown writes d as GitHub-flavoured Markdown; charts are left out.
func (d *Doc) Markdown() string {
	var b strings.Builder
	b.WriteString("# " + d.mdText(d.Title) + "\n")
	for _, bl := range d.blocks {
		s, ok := d.mdBlock(bl)
		if ok {
			b.WriteString("\n" + s + "\n")
		}
	}
	return b.String()
}

func (d *Doc) mdBlock(bl block) (string, bool) {
	switch bl.kind {
	case heading:
		return "## " + d.mdText(bl.text), true
	case para, note:
		return d.mdText(bl.text), bl.text != ""
	case warning:
		return "> **WARNING:** " + d.mdText(bl.text), true
	case list:
		var lines []string
		for _, it := range bl.items {
			lines = append(lines, "- "+d.mdText(it))
		}
		return strings.Join(lines, "\n"), len(lines) > 0
	case meta:
		var lines []string
		for _, kv := range bl.pairs {
			lines = append(lines, "- **"+d.mdText(kv[0])+":** "+d.mdText(kv[1]))
		}
		return strings.Join(lines, "\n"), true
	case table:
		t := bl.table
		var b strings.Builder
		row := func(cells []string) {
			b.WriteString("|")
			for _, c := range cells {
				b.WriteString(" " + d.mdCell(c) + " |")
			}
		}
		row(t.Head)
		b.WriteString("\n|")
		rr := d.style.RightRule
		if rr == "" {
			rr = "---:"
		}
		for i := range t.Head {
			if t.right(i) {
				b.WriteString(rr + "|")
			} else {
				b.WriteString("---|")
			}
		}
		for _, r := range t.Rows {
			b.WriteString("\n")
			row(r)
		}
		return b.String(), true
	}
	return "", false
}
