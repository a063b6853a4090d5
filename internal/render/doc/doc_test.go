package doc

import (
	"strings"
	"testing"

	"github.com/drover/drover/internal/render"
)

// The report and protocol goldens (internal/report, internal/perf) pin the
// whole output; these pin the choices between the two styles.

func sample(s Style) *Doc {
	d := New("T <1>", s)
	d.Meta([][2]string{{"run", "a_b"}})
	d.Warning("w1")
	d.Warning("w2")
	d.Heading("H")
	d.Paraf("Verdict: **%s**, `x|y` a_b", "PASSED")
	d.Paraf("")
	d.List("one", "two")
	d.List()
	t := NewTable("name", "value")
	t.Row("a|b", "12")
	t.Row("c", "n/a")
	t.Row("d", "text")
	d.Table(t)
	d.Note("n*1")
	d.Chart(render.Chart{Title: "c", Series: []render.Series{{Name: "s", X: []float64{0, 1}, Y: []float64{1, 2}}}, Standalone: true, Width: 100, Height: 60})
	return d
}

func TestPlain(t *testing.T) {
	d := sample(Style{})
	for _, c := range []struct{ got, want string }{
		{d.Markdown(), "# T &lt;1&gt;\n\n- **run:** a\\_b\n\n> **WARNING:** w1\n\n> **WARNING:** w2\n\n## H\n\n" +
			"Verdict: \\*\\*PASSED\\*\\*, `x\\|y` a\\_b\n\n- one\n- two\n\n" +
			"| name | value |\n|---|---:|\n| a\\|b | 12 |\n| c | n/a |\n| d | text |\n\nn\\*1\n"},
		{d.Text(), "T <1>\n=====\n\nrun:  a_b\n\n!!! WARNING: w1\n!!! WARNING: w2\n\nH\n-\n" +
			"Verdict: **PASSED**, `x|y` a_b\n- one\n- two\n" +
			"name  value\n----  -----\na|b      12\nc       n/a\nd      text\nn*1\n"},
	} {
		if c.got != c.want {
			t.Errorf("got\n%q\nwant\n%q", c.got, c.want)
		}
	}
	if w := wrap(strings.Repeat("word ", 30), 100); strings.Count(w, "\n") != 1 || len(strings.Split(w, "\n")[0]) > 100 {
		t.Errorf("wrap: %q", w)
	}
}

func TestMarkdownMarkup(t *testing.T) {
	got := sample(Style{Markup: true, RightRule: "--:"}).Markdown()
	for _, want := range []string{"# T <1>\n", "\nVerdict: **PASSED**, `x|y` a_b\n", "| name | value |\n|---|--:|\n| a\\|b | 12 |\n", "\nn*1\n"} {
		if !strings.Contains(got, want) {
			t.Errorf("no %q in\n%s", want, got)
		}
	}
	if strings.Contains(got, "<svg") {
		t.Error("a chart in Markdown")
	}
}

func TestHTML(t *testing.T) {
	plain := sample(Style{CSS: "p{}"}).HTML()
	for _, want := range []string{
		"<title>T &lt;1&gt;</title>\n<style>\np{}\n</style>\n", "<h1>T &lt;1&gt;</h1>\n<dl class=\"meta\"><dt>run</dt><dd>a_b</dd></dl>\n",
		"<div class=\"warn\">WARNING: w1</div>\n", "<p>Verdict: **PASSED**, `x|y` a_b</p>\n<ul>\n<li>one</li>\n<li>two</li>\n</ul>\n",
		"<tr><th>name</th><th class=\"r\">value</th></tr>\n<tr><td>a|b</td><td class=\"r\">12</td></tr>\n",
		"<p class=\"note\">n*1</p>\n", "\n<svg", "</svg>\n</body>\n</html>\n",
	} {
		if !strings.Contains(plain, want) {
			t.Errorf("plain: no %q in\n%s", want, plain)
		}
	}
	if strings.Count(plain, "<ul>") != 1 || strings.Count(plain, "<p>") != 1 {
		t.Errorf("empty paragraph or list written:\n%s", plain)
	}
	markup := sample(Style{Markup: true, NumericCells: true, Figures: true, Classes: map[string]string{"PASSED": "pass"}}).HTML()
	for _, want := range []string{
		"<p>Verdict: <span class=\"pass\">PASSED</span>, <code>x|y</code> a_b</p>\n",
		"<tr><th>name</th><th>value</th></tr>\n<tr><td class=\"t\">a|b</td><td>12</td></tr>\n<tr><td class=\"t\">c</td><td>n/a</td></tr>\n<tr><td class=\"t\">d</td><td class=\"t\">text</td></tr>\n",
		"<figure><svg", "</svg></figure>\n",
	} {
		if !strings.Contains(markup, want) {
			t.Errorf("markup: no %q in\n%s", want, markup)
		}
	}
}
