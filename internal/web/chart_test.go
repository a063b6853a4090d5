package web

import (
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/internal/fleet"
)

var axisLabel = regexp.MustCompile(`<text class="axis" x="80" y="[0-9.]+" text-anchor="end">([^<]*)</text>`)

// Value axes are labelled with round numbers: 0/20/40/60 %, not 47 %;
// 1/2/3 kbit/s, not 3.06 kbit/s.
func TestChartAxisTicksAreNice(t *testing.T) {
	start := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	var samples []fleet.Sample
	var rx uint64
	for i := range 10 {
		cpu := float64(5 + i*42/9)        // 5 … 47
		rx += uint64(1000+i*229) * 60 / 8 // 1,229 … 3,061 bit/s over 60 s steps
		r := rx
		samples = append(samples, fleet.Sample{At: start.Add(time.Duration(i) * time.Minute), CPU: &cpu, RxBytes: &r})
	}
	charts := deviceCharts(samples, start, start.Add(10*time.Minute))
	labels := func(svg string) string {
		var out []string
		for _, m := range axisLabel.FindAllStringSubmatch(svg, -1) {
			out = append(out, m[1])
		}
		return strings.Join(out, "|")
	}
	if got, want := labels(string(charts[0])), "0 %|20 %|40 %|60 %"; got != want {
		t.Errorf("CPU axis %q, want %q", got, want)
	}
	if got, want := labels(string(charts[2])), "1 kbit/s|1.5 kbit/s|2 kbit/s|2.5 kbit/s|3 kbit/s|3.5 kbit/s"; got != want {
		t.Errorf("traffic axis %q, want %q", got, want)
	}
}
