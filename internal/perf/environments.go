package perf

import (
	"fmt"
	"math"
	"sort"
	"strings"

	"github.com/drover/drover/internal/render"
	"github.com/drover/drover/internal/render/doc"
)

// envName is a result's environment: its --env-label, else its host and,
// when the server was limited, the limits.
func envName(r *Result) string {
	if r.Env.Label != "" {
		return r.Env.Label
	}
	n := r.Env.Host
	if n == "" {
		n = "?"
	}
	if r.Env.CPULimit > 0 || r.Env.MemLimitMiB > 0 {
		n += fmt.Sprintf(" (%s CPU, %s MiB)", render.Fixed(r.Env.cpus(), 2), render.Fixed(r.Env.ram(), 0))
	}
	return n
}

// hardware is what makes two machines of the same host name different
// environments: CPU model, cores and threads, RAM in whole GiB.
func hardware(e environment) string {
	return fmt.Sprintf("%s, %d/%d, %.0f GiB", e.CPUModel, e.Cores, e.Threads, e.RAMMiB/1024)
}

// envNames names every result's environment (envName). Results without
// --env-label that share a host name but not their hardware (a VM rebuilt on
// another CPU keeps its host name) get the hardware in their names, so that
// their figures are not compared as one environment's.
func envNames(rs []*Result) map[*Result]string {
	kinds := map[string]map[string]bool{}
	for _, r := range rs {
		if r.Env.Label != "" {
			continue
		}
		n := envName(r)
		if kinds[n] == nil {
			kinds[n] = map[string]bool{}
		}
		kinds[n][hardware(r.Env)] = true
	}
	names := make(map[*Result]string, len(rs))
	for _, r := range rs {
		n := envName(r)
		if r.Env.Label == "" && len(kinds[n]) > 1 {
			n += " [" + hardware(r.Env) + "]"
		}
		names[r] = n
	}
	return names
}

// envGroup is the results of one Drover version in one environment.
type envGroup struct {
	version, env string
	first        *Result
	rs           []*Result
}

// groupResults groups results by version and environment, versions in the
// order of their earliest test, environments by name.
func groupResults(rs []*Result) []*envGroup {
	byKey := map[[2]string]*envGroup{}
	names := envNames(rs)
	var out []*envGroup
	for _, r := range rs {
		k := [2]string{r.Env.DroverVersion, names[r]}
		g := byKey[k]
		if g == nil {
			g = &envGroup{version: k[0], env: k[1], first: r}
			byKey[k] = g
			out = append(out, g)
		}
		if r.Started.Before(g.first.Started) {
			g.first = r
		}
		g.rs = append(g.rs, r)
	}
	vStart := map[string]int64{}
	for _, g := range out {
		if t, ok := vStart[g.version]; !ok || g.first.Started.UnixNano() < t {
			vStart[g.version] = g.first.Started.UnixNano()
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.version != b.version {
			return vStart[a.version] < vStart[b.version]
		}
		return a.env < b.env
	})
	return out
}

// environmentsSection is the seed reports' environment specs, test-run
// map and benchmark table across versions and environments.
func environmentsSection(b *strings.Builder, rs []*Result) {
	if len(rs) == 0 {
		return
	}
	groups := groupResults(rs)
	b.WriteString("\n## Environments\n\n| environment | CPU | cores / threads | RAM MiB | server limits | tests |\n|---|---|--:|--:|---|---|\n")
	seen := map[string]bool{}
	for _, g := range groups {
		if seen[g.env] {
			continue
		}
		seen[g.env] = true
		e := g.first.Env
		limits := "none"
		if e.Cgroup != "" {
			limits = e.Cgroup
		}
		var tests []string
		for _, h := range groups {
			if h.env == g.env {
				for _, r := range h.rs {
					tests = append(tests, r.Preset.Name+" ("+h.version+")")
				}
			}
		}
		fmt.Fprintf(b, "| %s | %s | %d / %d | %s | %s | %s |\n", doc.Cell(g.env), doc.Cell(e.CPUModel), e.Cores, e.Threads, render.Fixed(e.RAMMiB, 0), doc.Cell(limits), doc.Cell(strings.Join(tests, ", ")))
	}

	b.WriteString("\n## Benchmark table\n\nAs the seed reports': server RSS after the largest stability test, its KiB per device, the lowest SSL benchmark's pushes/s (any benchmark's without SSL ones), each as % of the previous version in the same environment (100 % is success; 101–120 % of resources and 80–99 % of throughput are acceptable).\n\n")
	b.WriteString("| version | environment | RAM – RSS MiB | % of previous | KiB per device | % of previous | pushes/s | % of previous |\n|---|---|--:|--:|--:|--:|--:|--:|\n")
	prev := map[string]figures{}
	val := func(v float64, prec int) string {
		if math.IsNaN(v) {
			return "—"
		}
		return render.Fixed(v, prec)
	}
	pct := func(v, p float64, ok bool) string {
		if !ok || math.IsNaN(v) || math.IsNaN(p) || p == 0 {
			return "—"
		}
		return render.Fixed(pctOfPrevious(v, p), 0)
	}
	for _, g := range groups {
		f := figuresOf(g.rs)
		p, ok := prev[g.env]
		fmt.Fprintf(b, "| %s | %s | %s | %s | %s | %s | %s | %s |\n", doc.Cell(g.version), doc.Cell(g.env),
			val(f.RSSMiB, 1), pct(f.RSSMiB, p.RSSMiB, ok), val(f.KiBPerDevice, 2), pct(f.KiBPerDevice, p.KiBPerDevice, ok),
			val(f.PushesPerSec, 2), pct(f.PushesPerSec, p.PushesPerSec, ok))
		prev[g.env] = f
	}
	peakSection(b, groups)
}

// breakingPoint is where a peak test's drops begin in one environment:
// the smallest thread count whose run dropped, resent or deferred
// requests, and the largest below it that did not.
type breakingPoint struct {
	Mode      peakMode
	Threads   []int           // measured thread counts, ascending
	Rate      map[int]float64 // accepted per second by threads
	ErrPct    map[int]float64
	Broke     map[int]bool
	BeginsAt  int // 0: no drops at any measured count
	LastClean int // 0: none clean below BeginsAt
}

// breakingPoints combines a envGroup's peak results by mode.
func breakingPoints(rs []*Result) []breakingPoint {
	byMode := map[peakMode]*breakingPoint{}
	for _, r := range rs {
		if r.Preset.Kind != peak {
			continue
		}
		c := Compute(r)
		if len(c.Rows) == 0 {
			continue
		}
		bp := byMode[r.Preset.Mode]
		if bp == nil {
			bp = &breakingPoint{Mode: r.Preset.Mode, Rate: map[int]float64{}, ErrPct: map[int]float64{}, Broke: map[int]bool{}}
			byMode[r.Preset.Mode] = bp
		}
		t := r.Preset.Threads
		if _, dup := bp.Rate[t]; !dup {
			bp.Threads = append(bp.Threads, t)
		}
		row := c.Rows[len(c.Rows)-1]
		bp.Rate[t], bp.ErrPct[t] = row.PushesPerSec, row.ErrPct
		bp.Broke[t] = c.Verdict == limited || row.Broke
	}
	var out []breakingPoint
	for _, m := range []peakMode{peakRegister, peakData, peakFull} {
		bp := byMode[m]
		if bp == nil {
			continue
		}
		sort.Ints(bp.Threads)
		for _, t := range bp.Threads {
			if bp.Broke[t] {
				bp.BeginsAt = t
				break
			}
			bp.LastClean = t
		}
		out = append(out, *bp)
	}
	return out
}

// text says where drops begin.
func (bp breakingPoint) text() string {
	top := bp.Threads[len(bp.Threads)-1]
	switch {
	case bp.BeginsAt == 0:
		return fmt.Sprintf("no drops up to %d threads", top)
	case bp.LastClean == 0:
		return fmt.Sprintf("at %d threads or fewer (drops at the lowest count measured)", bp.BeginsAt)
	default:
		return fmt.Sprintf("between %d and %d threads", bp.LastClean, bp.BeginsAt)
	}
}

// peakSection is the seed reports' Peak summary: per environment and
// mode, throughput at each thread count and where drops begin.
func peakSection(b *strings.Builder, groups []*envGroup) {
	var lines []string
	for _, g := range groups {
		for _, bp := range breakingPoints(g.rs) {
			var cells []string
			for _, t := range bp.Threads {
				mark := "no drops"
				if bp.Broke[t] {
					mark = "drops, " + render.Fixed(bp.ErrPct[t], 3) + " % error-or-retried"
				}
				cells = append(cells, fmt.Sprintf("%d: %s/s (%s)", t, render.Fixed(bp.Rate[t], 0), mark))
			}
			lines = append(lines, fmt.Sprintf("| %s | %s | Peak%s | %s | %s |\n", doc.Cell(g.version), doc.Cell(g.env), bp.Mode, strings.Join(cells, "; "), bp.text()))
		}
	}
	if len(lines) == 0 {
		return
	}
	b.WriteString("\n## Peak: where drops begin\n\nThe pushing threads at which requests start to be dropped, resent or deferred (503/429), from the PeakX-64/256/1024 tests of each environment: throughput (accepted per second; registrations for PeakR) at each thread count measured.\n\n")
	b.WriteString("| version | environment | test | threads: accepted/s | drops begin |\n|---|---|---|---|---|\n")
	for _, l := range lines {
		b.WriteString(l)
	}
}
