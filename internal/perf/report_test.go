package perf

import (
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// withSeries adds a deterministic time series and samples to every part.
func withSeries(r *Result) *Result {
	for pi := range r.Parts {
		part := &r.Parts[pi]
		for i := 0; i < 60; i++ {
			f := float64(i)
			part.Series = append(part.Series, point{T: f * 10, Dur: 10, Done: 5 + float64(i%7), Accepted: 5 + float64(i%7) - float64(i%13)/10,
				Errors: float64(i%13) / 10, P50: 4 + float64(i%5), P90: 8 + float64(i%6), P99: 12 + float64(i%9)})
			part.Samples = append(part.Samples, sample{T: f * 10, RSSMiB: part.Before.RSSMiB + f/5, CPUPct: 3 + float64(i%4)})
		}
	}
	return r
}

func seedPeakF() *Result {
	start := time.Date(2023, 10, 5, 9, 0, 0, 0, time.UTC)
	p, _ := Lookup("PeakF-256-max")
	return &Result{Format: resultFormat, Preset: p, Changes: "", Command: "drover perf run PeakF-256-max", Started: start, Ended: start.Add(11 * time.Minute),
		Env:        environment{Host: "h1", CPUModel: "Core i5 1.7GHz", Cores: 4, Threads: 8, RAMMiB: 16384, GoVersion: "go1.26", DroverVersion: "v0.1.0", Emulator: "this machine"},
		Setup:      setup{Target: "http://10.0.0.2:8080", Backend: "as configured on the server", Persistence: "as configured on the server", Conn: "new"},
		Thresholds: defaultThresholds(),
		Parts: []resultPart{{Started: start, Ended: start.Add(10 * time.Minute),
			Push:          opFigures{Accepted: 1200000, Retried: 40, Rejected: map[string]int64{"503": 12}, ConfigsSeen: 614400, ElapsedSec: 590, LatencyMs: latency{P50: 30, P90: 80, P99: 250, Max: 2100, Mean: 41}},
			Register:      opFigures{Accepted: 61440, ElapsedSec: 25},
			ConfigChanges: 10,
			Before:        snapshot{At: start, RSSMiB: 30},
			After:         snapshot{At: start.Add(10 * time.Minute), RSSMiB: 180, CPUSecs: 900},
			SyncStates:    map[string]float64{"in_sync": 61000, "pending": 440},
			Restarts:      0,
			Emulator:      emuStats{CPUAvg: 1.6, CPUMax: 2, RSSMiB: 300, Cores: 8, Warnings: []string{"the emulator used most of this machine's CPU"}},
		}}}
}

func TestGoldenReports(t *testing.T) {
	cases := map[string]*Result{
		"stab":  withSeries(seedStab()),
		"bench": withSeries(seedBench()),
		"peakf": withSeries(seedPeakF()),
	}
	for name, r := range cases {
		for ext, render := range map[string]func(*Result) string{"md": markdownOf, "html": htmlProtocol} {
			got := render(r)
			path := filepath.Join("testdata", name+".golden."+ext)
			if *update {
				os.MkdirAll("testdata", 0o755)
				if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
				continue
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run go test -update to create it)", err)
			}
			if got != string(want) {
				t.Errorf("%s differs from the golden file (go test ./internal/perf -run Golden -update, then review the diff)", path)
			}
		}
	}
}

func TestReportContents(t *testing.T) {
	md := markdownOf(withSeries(seedStab()))
	for _, want := range []string{
		"# Drover performance protocol: Stab-2-2\n",
		"## Test specs", "## Environment", "## Resources", "## Results", "## Calculations", "## Summary", "## Verdict", "## Notes",
		"| Stab-2-2 | Yes | 1,000 | 2/one per CPU | N/A | 120 | 200 |",
		"| estimated data-pushes | 36,000 |", "| rough avg req/s | 4.66 |", "| real loop time / s | 215 |",
		"| RSS increase % | 29.55 |", "| RAM utilisation % | 48.05 |", "| max safe # of devices | 2,081 |",
		"| RAM utilisation note | reasonable |", "| WARN | overloaded | 2 |", "Verdict: **PASSED**",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("Markdown lacks %q", want)
		}
	}
	bench := markdownOf(seedBench())
	for _, want := range []string{"| 1 | 125.53 | 25,106 | 5,021 | 20,085 |", "**safe max 20,085 devices**", "Sizing rule applied: safe max = 80 %"} {
		if !strings.Contains(bench, want) {
			t.Errorf("benchmark Markdown lacks %q", want)
		}
	}
	r := seedStab()
	r.Changes = "100 devices instead of 1000"
	if md := markdownOf(r); !strings.HasPrefix(md, "# Drover performance protocol: Stab-2-2 (scaled down: 100 devices instead of 1000)\n") {
		t.Errorf("a scaled run's title: %q", md[:80])
	}
	peak := markdownOf(seedPeakF())
	for _, want := range []string{"Verdict: **LIMIT REACHED**", "changed 10 time(s)", "in_sync 61,000, pending 440", "not reviewed"} {
		if !strings.Contains(peak, want) {
			t.Errorf("peak Markdown lacks %q", want)
		}
	}
}

func TestHTMLIsSelfContained(t *testing.T) {
	h := htmlProtocol(withSeries(seedBench()))
	if n := strings.Count(h, "<svg"); n != 4*5 {
		t.Errorf("%d charts, want 5 per part", n)
	}
	// Nothing is fetched: no scripts, no external references (the SVG
	// namespace is an identifier, not a fetch).
	ext := regexp.MustCompile(`(?i)(src=|href=|<script|<link|@import|url\()`)
	if m := ext.FindString(h); m != "" {
		t.Errorf("the HTML report references something external: %q", m)
	}
	if !strings.Contains(h, `<span class="pass">PASSED</span>`) || !strings.Contains(h, "<polyline") {
		t.Error("verdict styling or chart lines missing")
	}
	if strings.Contains(htmlProtocol(seedStab()), "NaN") {
		t.Error("NaN in the output")
	}
}

// The loop-time note appears only when the real loop time differs from
// the set one, and says why.
func TestLoopTimeNote(t *testing.T) {
	exact := seedStab()
	part := &exact.Parts[0]
	part.Ended = part.Started.Add(7200 * time.Second)
	part.Push.Accepted = 36000
	if md := markdownOf(exact); strings.Contains(md, "real loop time (") {
		t.Errorf("exact figures (36 whole loops, every push performed) got the note:\n%s", md)
	}
	if c := Compute(exact); c.RealLoopTime != 200 {
		t.Errorf("real loop time %v, want 200", c.RealLoopTime)
	}
	short := seedStab()
	part = &short.Parts[0]
	part.Ended = part.Started.Add(7200 * time.Second)
	part.Push.Accepted, part.Push.Aborted, part.Push.Skipped = 35000, 2, 998
	md := markdownOf(short)
	for _, want := range []string{"The real loop time (206 s) differs from the set loop time (200 s): 35,000 pushes were performed of about 36,000", "2 cut off by the end of the test (aborted)", "998 not sent because the device was still busy"} {
		if !strings.Contains(md, want) {
			t.Errorf("note lacks %q:\n%s", want, md)
		}
	}
	if strings.Contains(md, "not a whole number") {
		t.Error("36 whole loops called partial")
	}
}
