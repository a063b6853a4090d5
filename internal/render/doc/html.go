package doc

import (
	"html"
	"maps"
	"slices"
	"strings"
)

// HTML writes d as one self-contained HTML page: inline CSS and SVG, no
// script, nothing fetched.
func (d *Doc) HTML() string {
	var b strings.Builder
	title := html.EscapeString(d.Title)
	b.WriteString("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n")
	b.WriteString("<title>" + title + "</title>\n<style>\n" + d.style.CSS + "\n</style>\n</head>\n<body>\n<h1>" + title + "</h1>\n")
	for _, bl := range d.blocks {
		switch bl.kind {
		case heading:
			b.WriteString("<h2>" + html.EscapeString(bl.text) + "</h2>\n")
		case para:
			if bl.text != "" {
				b.WriteString("<p>" + d.inline(bl.text) + "</p>\n")
			}
		case note:
			b.WriteString("<p class=\"note\">" + d.inline(bl.text) + "</p>\n")
		case warning:
			b.WriteString("<div class=\"warn\">WARNING: " + d.inline(bl.text) + "</div>\n")
		case list:
			if len(bl.items) > 0 {
				b.WriteString("<ul>\n")
				for _, it := range bl.items {
					b.WriteString("<li>" + d.inline(it) + "</li>\n")
				}
				b.WriteString("</ul>\n")
			}
		case meta:
			b.WriteString("<dl class=\"meta\">")
			for _, kv := range bl.pairs {
				b.WriteString("<dt>" + html.EscapeString(kv[0]) + "</dt><dd>" + d.inline(kv[1]) + "</dd>")
			}
			b.WriteString("</dl>\n")
		case table:
			d.htmlTable(&b, bl.table)
		case chart:
			if d.style.Figures {
				b.WriteString("<figure>" + bl.chart.SVG() + "</figure>\n")
			} else {
				b.WriteString(bl.chart.SVG() + "\n")
			}
		}
	}
	b.WriteString("</body>\n</html>\n")
	return b.String()
}

func (d *Doc) htmlTable(b *strings.Builder, t *Table) {
	cell := func(tag string, i int, s string) {
		class := ""
		switch {
		case d.style.NumericCells:
			if tag == "td" && !numeric(s) {
				class = "t"
			}
		case t.right(i):
			class = "r"
		}
		if class != "" {
			b.WriteString("<" + tag + " class=\"" + class + "\">")
		} else {
			b.WriteString("<" + tag + ">")
		}
		b.WriteString(d.inline(s) + "</" + tag + ">")
	}
	b.WriteString("<table>\n<tr>")
	for i, h := range t.Head {
		cell("th", i, h)
	}
	b.WriteString("</tr>\n")
	for _, r := range t.Rows {
		b.WriteString("<tr>")
		for i, c := range r {
			cell("td", i, c)
		}
		b.WriteString("</tr>\n")
	}
	b.WriteString("</table>\n")
}

// numeric tells a cell that reads as a number from text.
func numeric(s string) bool {
	if s == "" || s == "—" || s == "n/a" {
		return true
	}
	c := s[0]
	return c >= '0' && c <= '9' || c == '-' && len(s) > 1
}

// inline is text as HTML: escaped, and in Markup style with `code` and
// **bold** turned into elements.
func (d *Doc) inline(s string) string {
	s = html.EscapeString(s)
	if !d.style.Markup {
		return s
	}
	s = replacePairs(s, "`", "<code>", "</code>")
	s = replacePairs(s, "**", "<strong>", "</strong>")
	for _, text := range slices.Sorted(maps.Keys(d.style.Classes)) {
		s = strings.ReplaceAll(s, "<strong>"+html.EscapeString(text)+"</strong>",
			`<span class="`+d.style.Classes[text]+`">`+html.EscapeString(text)+`</span>`)
	}
	return s
}

// replacePairs replaces mark alternately by open and close, closing an
// unpaired last one.
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
