package render

import (
	"math"
	"strings"
	"testing"
)

func TestChartLinesBreaksAndEscaping(t *testing.T) {
	c := Chart{Title: "a<b", Series: []Series{
		{Name: "x&y", X: []float64{0, 1, 2, 3, 4}, Y: []float64{1, 2, math.NaN(), 3, 4}},
		{Name: "one", X: []float64{2}, Y: []float64{5}, Markers: true},
	}}
	svg := c.SVG()
	if strings.Contains(svg, "a<b") || !strings.Contains(svg, "a&lt;b") || !strings.Contains(svg, "x&amp;y") {
		t.Fatalf("title or names not escaped: %s", svg)
	}
	// The NaN breaks the first series in two; a single point is a line too.
	if n := strings.Count(svg, `<polyline class="line s0"`); n != 2 {
		t.Fatalf("%d polylines for series 0, want 2: %s", n, svg)
	}
	if n := strings.Count(svg, `<polyline class="line s1"`); n != 1 || strings.Count(svg, `<circle class="dot s1"`) != 1 {
		t.Fatalf("single point: %s", svg)
	}
	// For the dashboard: classes only, no style, no colours, no script.
	for _, bad := range []string{"style=", "stroke=", "fill=", "<script", `width="720"`} {
		if strings.Contains(svg, bad) {
			t.Fatalf("%q in a stylesheet chart: %s", bad, svg)
		}
	}
	c.Standalone = true
	svg = c.SVG()
	for _, want := range []string{`stroke="#1f77b4"`, `font-family="sans-serif"`, `class="title"`, `width="720"`} {
		if !strings.Contains(svg, want) {
			t.Fatalf("standalone chart without %q: %s", want, svg)
		}
	}
	if strings.Contains(svg, "style=") {
		t.Fatalf("style attribute: %s", svg)
	}
}

func TestChartNoDataAndLogAxis(t *testing.T) {
	c := Chart{Title: "t", NoData: "nothing yet", Series: []Series{{Name: "s", X: []float64{1}, Y: []float64{math.NaN()}}}}
	if svg := c.SVG(); !strings.Contains(svg, `<text class="nodata"`) || !strings.Contains(svg, "nothing yet") || strings.Contains(svg, "polyline") {
		t.Fatalf("no data: %s", svg)
	}
	c = Chart{LogY: true, Series: []Series{{Name: "s", X: []float64{0, 1, 2}, Y: []float64{0, 3, 2000}}}}
	svg := c.SVG()
	for _, want := range []string{">1</text>", ">10</text>", ">100</text>", ">1000</text>", ">10k</text>"} {
		if !strings.Contains(svg, want) {
			t.Fatalf("log axis without %s: %s", want, svg)
		}
	}
	// The value 0 cannot be drawn on a log axis: two points remain.
	if pts := strings.Fields(between(svg, `points="`, `"`)); len(pts) != 2 {
		t.Fatalf("log line points %v", pts)
	}
}

// Thin keeps at most one point per pixel column and breaks lines at gaps.
func TestChartThin(t *testing.T) {
	var s Series
	for i := range 5000 {
		x := float64(i)
		if i >= 2500 {
			x += 10000 // a gap far over 3 median spacings
		}
		s.X, s.Y = append(s.X, x), append(s.Y, float64(i%7))
	}
	c := Chart{Thin: true, Series: []Series{s}}
	svg := c.SVG()
	if n := strings.Count(svg, `<polyline class="line s0"`); n != 2 {
		t.Fatalf("%d lines, want 2 (the gap breaks it)", n)
	}
	if n := strings.Count(svg, ","); n > 720-84-8 {
		t.Fatalf("%d points drawn, more than the plot's width", n)
	}
}

func TestTickHelpers(t *testing.T) {
	ev := EvenTicks(4, Elapsed)(0, 600)
	if len(ev) != 5 || ev[2].Label != "5 min" || ev[4].Label != "10 min" || ev[1].Label != "2.5 min" {
		t.Fatalf("even ticks %v", ev)
	}
	if got := NiceTicks(5, Number)(0, 97); len(got) != 5 || got[4].V != 80 {
		t.Fatalf("nice ticks %v", got)
	}
	for v, want := range map[float64]string{0: "0", 0.25: "0.25", 12.5: "12.5", 250: "250", 25000: "25k", 2.5e6: "2.5M"} {
		if got := Number(v); got != want {
			t.Errorf("Number(%g) = %q, want %q", v, got, want)
		}
	}
	for v, want := range map[float64]string{45: "45 s", 90.25: "90.2 s", 150: "2.5 min", 7200: "2 h"} {
		if got := Elapsed(v); got != want {
			t.Errorf("Elapsed(%g) = %q, want %q", v, got, want)
		}
	}
}

func between(s, a, b string) string {
	_, s, _ = strings.Cut(s, a)
	s, _, _ = strings.Cut(s, b)
	return s
}
