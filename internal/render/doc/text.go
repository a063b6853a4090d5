package doc

import (
	"fmt"
	"strings"
)

// Text writes d as plain text for a terminal: underlined headings, aligned
// tables, paragraphs wrapped at 100 columns; charts are left out and
// Markup is written as it is.
func (d *Doc) Text() string {
	var b strings.Builder
	b.WriteString(d.Title + "\n" + strings.Repeat("=", len(d.Title)) + "\n\n")
	for i, bl := range d.blocks {
		switch bl.kind {
		case heading:
			b.WriteString("\n" + bl.text + "\n" + strings.Repeat("-", len([]rune(bl.text))) + "\n")
		case para, note:
			if bl.text != "" {
				b.WriteString(wrap(bl.text, 100) + "\n")
			}
		case list:
			for _, it := range bl.items {
				b.WriteString("- " + it + "\n")
			}
		case warning:
			if i == 0 || d.blocks[i-1].kind != warning {
				b.WriteString("\n")
			}
			b.WriteString("!!! WARNING: " + bl.text + "\n")
		case meta:
			width := 0
			for _, kv := range bl.pairs {
				width = max(width, len(kv[0])+1)
			}
			for _, kv := range bl.pairs {
				fmt.Fprintf(&b, "%-*s  %s\n", width, kv[0]+":", kv[1])
			}
		case table:
			textTable(&b, bl.table)
		}
	}
	return b.String()
}

func textTable(b *strings.Builder, t *Table) {
	widths := make([]int, len(t.Head))
	for i, h := range t.Head {
		widths[i] = len([]rune(h))
	}
	for _, r := range t.Rows {
		for i, c := range r {
			widths[i] = max(widths[i], len([]rune(c)))
		}
	}
	line := func(cells []string) {
		var parts []string
		for i, c := range cells {
			pad := strings.Repeat(" ", widths[i]-len([]rune(c)))
			if t.right(i) {
				parts = append(parts, pad+c)
			} else {
				parts = append(parts, c+pad)
			}
		}
		b.WriteString(strings.TrimRight(strings.Join(parts, "  "), " ") + "\n")
	}
	line(t.Head)
	var rule []string
	for _, w := range widths {
		rule = append(rule, strings.Repeat("-", w))
	}
	b.WriteString(strings.Join(rule, "  ") + "\n")
	for _, r := range t.Rows {
		line(r)
	}
}

// wrap breaks s into lines of at most width runes, at spaces.
func wrap(s string, width int) string {
	var out, line []string
	n := 0
	for _, word := range strings.Fields(s) {
		if n > 0 && n+1+len([]rune(word)) > width {
			out = append(out, strings.Join(line, " "))
			line, n = nil, 0
		}
		if n > 0 {
			n++
		}
		line = append(line, word)
		n += len([]rune(word))
	}
	if len(line) > 0 {
		out = append(out, strings.Join(line, " "))
	}
	return strings.Join(out, "\n")
}
