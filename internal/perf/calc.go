package perf

import (
	"fmt"
	"math"
	"sort"

	"github.com/drover/drover/internal/render"
)

// grade is a band of a utilisation scale: values below Below get Label;
// Below 0 takes every value (the last band).
type grade struct {
	Below float64 `json:"below"`
	Label string  `json:"label"`
}

// thresholds are the published limits a verdict is made against.
type thresholds struct {
	MaxPushErrorPct float64 `json:"max_push_error_pct"` // stability and benchmark pass at or below
	MaxLogErrors    int     `json:"max_log_errors"`     // ERROR entries in the server log
	MaxRAMPct       float64 `json:"max_ram_pct"`        // OS RAM utilisation after the test
	MaxLeakPct      float64 `json:"max_leak_pct"`       // RSS growth over the second half of a stability test
	RAMGrades       []grade `json:"ram_grades"`         // OS RAM utilisation %
	CPUGrades       []grade `json:"cpu_grades"`         // server CPU, % of all cores, average
	MinAcceptedPct  float64 `json:"min_accepted_pct"`   // peak: accepted share below which the server broke
}

// defaultThresholds are Drover's published thresholds (docs/perf.md). The
// RAM bands reproduce the reports' grades (48 % reasonable, 33 % ok, 11 %
// perfect (low)).
func defaultThresholds() thresholds {
	return thresholds{
		MaxPushErrorPct: 0.1,
		MaxLogErrors:    0,
		MaxRAMPct:       90,
		MaxLeakPct:      20,
		RAMGrades:       []grade{{25, "perfect (low)"}, {40, "ok"}, {60, "reasonable"}, {90, "high"}, {0, "critical"}},
		CPUGrades:       []grade{{25, "perfect (low)"}, {50, "ok"}, {75, "reasonable"}, {90, "high"}, {0, "critical"}},
		MinAcceptedPct:  99,
	}
}

// gradeOf returns the label of v on a scale.
func gradeOf(gs []grade, v float64) string {
	for _, g := range gs {
		if v < g.Below || g.Below == 0 {
			return g.Label
		}
	}
	if len(gs) > 0 {
		return gs[len(gs)-1].Label
	}
	return ""
}

// Verdicts.
const (
	passed  = "PASSED"
	Failed  = "FAILED"
	limited = "LIMIT REACHED" // peak: the server dropped or deferred requests at this load
)

// Calc is every derived figure of a result.
type Calc struct {
	// all tests
	Performed    int64
	Accepted     int64
	ErrOrRetried int64
	PushErrPct   float64
	Crashes      int
	LogWarnings  int
	LogErrors    int

	// stability
	Minutes        float64
	EstPushes      float64
	EstReqPerSec   float64
	RoughReqPerSec float64
	TotalSec       float64
	ProcessedLoops float64
	RealLoopTime   float64
	RSSBefore      float64 // MiB
	RSSAfter       float64
	RSSIncMiB      float64
	RSSIncPct      float64
	MiBPerDevice   float64
	KiBPerDevice   float64
	RAMUtilPct     float64 // 0 when OS memory was not measured
	MaxSafe        int
	Load15         float64
	LoadPerCore    float64
	CPUAvgPct      float64 // server CPU, % of all cores
	CPUMaxPct      float64
	LeakPct        float64 // RSS growth over the second half
	RAMGrade       string
	CPUGrade       string

	// benchmark and peak, one row per part
	Rows []row
	// the 0.8.0 rule, from the lowest SSL throughput (benchmark, SSL only)
	Ideal080, Safe080 int
	Lowest            float64

	// registrar test, one cell per persistence × handlers × machine IDs
	Cells []registrarCell

	// fleet test
	Checks       []check
	MedianPerSec float64 // accepted pushes per second, median of the complete seconds
	MinPerSec    float64
	BytesPerDev  float64 // server RSS at the end / devices
	P99Ms        float64 // push latency from the intended send time
	// a scaled fleet test: RSS per device projected to the full fleet
	ProjectedDevices     int
	ProjectedBytesPerDev float64
	// server CPU time per accepted push, µs, in the first loop (over TLS
	// each device's first connection: a full handshake) and after it
	// (resumed sessions); 0: not measured
	CPUPerPushFirstUS, CPUPerPushLaterUS float64

	Verdict string
	Reasons []string // why, one line each
}

// check is one pass/fail criterion of a fleet test.
type check struct {
	Name     string
	Measured string
	Limit    string
	OK       bool
}

// Fleet test criteria (docs/perf.md, the fleet test).
const (
	fleetMaxP99Ms        = 1000.0 // latency from the intended send time
	fleetMinRateOfMedian = 0.8    // every second's accepted pushes against the median second
	fleetMaxBytesPerDev  = 1024.0 // server RSS at the end per device
	// Fleet-TLS-500k: server CPU per push once the devices resume their
	// TLS sessions (after the first loop).
	fleetTLSMaxCPUPerPushUS = 150.0
	// cpuWindowMargin keeps the CPU-per-push windows clear of the loop's
	// edges (pushes answered late, the schedule's start).
	cpuWindowMargin = 5.0
)

// row is one part of a benchmark or peak test.
type row struct {
	Handlers     int
	ElapsedSec   float64
	Pushes       int64 // accepted pushes (registrations for PeakR)
	PushesPerSec float64
	Ideal        int // × loop time
	Rec020       int // 20 % rule
	Safe080      int // 80 % of this row's ideal
	ErrPct       float64
	P50, P99     float64
	Broke        bool // dropped, resent or deferred requests
	EmuCPU       float64
}

// Compute derives every figure of the methodology from r.
func Compute(r *Result) Calc {
	var c Calc
	th := r.Thresholds
	p := r.Preset
	for _, part := range r.Parts {
		op := part.Push
		if (p.Kind == peak && p.Mode == peakRegister) || p.Kind == registrar {
			op = part.Register
		}
		c.Performed += op.Performed()
		c.Accepted += op.Accepted
		c.ErrOrRetried += op.ErrOrRetried()
		if part.ServerExit != "" {
			c.Crashes++
		}
		c.Crashes += part.Restarts
		c.LogWarnings += part.Log.Count("WARN")
		c.LogErrors += part.Log.Count("ERROR")
	}
	c.PushErrPct = pushErrorPct(c.ErrOrRetried, c.Performed)

	switch p.Kind {
	case stability:
		computeStability(r, &c)
	case fleet:
		computeStability(r, &c)
		computeFleet(r, &c)
	case overload:
		computeOverload(r, &c)
	case rollout:
		computeRollout(r, &c)
	case registrar:
		computeRegistrar(r, &c)
	default:
		computeRows(r, &c)
	}

	// Verdict.
	fail := func(format string, a ...any) { c.Reasons = append(c.Reasons, fmt.Sprintf(format, a...)) }
	if c.Crashes > 0 {
		fail("the server crashed or restarted %d time(s)", c.Crashes)
	}
	for _, part := range r.Parts {
		if part.Err != "" {
			fail("the run failed: %s", part.Err)
		}
	}
	if c.LogErrors > th.MaxLogErrors {
		fail("%d ERROR entries in the server log (at most %d allowed)", c.LogErrors, th.MaxLogErrors)
	}
	if c.Performed == 0 {
		fail("no request was performed")
	}
	switch p.Kind {
	case stability, benchmark, registrar:
		if c.PushErrPct > th.MaxPushErrorPct {
			fail("push errors %.3f %% exceed %.3g %%", c.PushErrPct, th.MaxPushErrorPct)
		}
		if p.Kind == stability {
			if c.RAMUtilPct > th.MaxRAMPct {
				fail("RAM utilisation %.2f %% exceeds %.3g %%", c.RAMUtilPct, th.MaxRAMPct)
			}
			if c.LeakPct > th.MaxLeakPct {
				fail("server RSS grew %.1f %% over the second half of the test (more than %.3g %%: a leak?)", c.LeakPct, th.MaxLeakPct)
			}
		}
		c.Verdict = passed
		if len(c.Reasons) > 0 {
			c.Verdict = Failed
		}
	case fleet, overload, rollout:
		for _, ch := range c.Checks {
			if !ch.OK {
				fail("%s: %s (limit %s)", ch.Name, ch.Measured, ch.Limit)
			}
		}
		c.Verdict = passed
		if len(c.Reasons) > 0 {
			c.Verdict = Failed
		}
	case peak:
		if len(c.Reasons) > 0 {
			c.Verdict = Failed
			break
		}
		c.Verdict = passed
		acc := 100.0
		if c.Performed > 0 {
			acc = float64(c.Accepted) / float64(c.Performed) * 100
		}
		for _, row := range c.Rows {
			if row.Broke || acc < th.MinAcceptedPct {
				c.Verdict = limited
				c.Reasons = append(c.Reasons, fmt.Sprintf("at %d threads the server dropped, deferred or refused requests: %.2f %% accepted, %.3f %% error-or-retried", p.Threads, acc, c.PushErrPct))
				break
			}
		}
	}
	return c
}

func computeStability(r *Result, c *Calc) {
	p := r.Preset
	if len(r.Parts) == 0 {
		return
	}
	part := r.Parts[0]
	c.Minutes = p.Minutes()
	c.EstPushes = estimatedPushes(p.Devices, c.Minutes, float64(p.LoopTime))
	c.EstReqPerSec = estimatedReqPerSec(p.Devices, float64(p.LoopTime))
	c.TotalSec = part.Ended.Sub(part.Started).Seconds()
	c.RoughReqPerSec = roughReqPerSec(c.Performed, c.TotalSec)
	c.ProcessedLoops = processedLoops(c.Performed, p.Devices)
	c.RealLoopTime = realLoopTime(c.TotalSec, c.ProcessedLoops)
	c.RSSBefore, c.RSSAfter = part.Before.RSSMiB, part.After.RSSMiB
	c.RSSIncMiB = rssIncrease(c.RSSBefore, c.RSSAfter)
	c.RSSIncPct = rssIncreasePct(c.RSSBefore, c.RSSAfter)
	c.MiBPerDevice = perDevice(c.RSSIncMiB, p.Devices)
	c.KiBPerDevice = perDevice(c.RSSIncMiB*1024, p.Devices)
	if part.After.Machine && r.Env.ram() > 0 {
		c.RAMUtilPct = ramUtilisationPct(part.After.UsedMiB, r.Env.ram())
		c.MaxSafe = maxSafeDevices(p.Devices, c.RAMUtilPct)
		c.Load15 = part.After.Load15
		c.LoadPerCore = loadPerCore(c.Load15, r.Env.Cores)
		c.RAMGrade = gradeOf(r.Thresholds.RAMGrades, c.RAMUtilPct)
	}
	// CPU is a share of the CPU the server may use: its cgroup's quota
	// when that is below the machine's threads.
	if cpus := r.Env.cpus(); cpus > 0 {
		if c.TotalSec > 0 {
			c.CPUAvgPct = (part.After.CPUSecs - part.Before.CPUSecs) / c.TotalSec / cpus * 100
		}
		for _, s := range part.Samples {
			c.CPUMaxPct = max(c.CPUMaxPct, s.CPUPct/cpus)
		}
	}
	c.CPUGrade = gradeOf(r.Thresholds.CPUGrades, c.CPUAvgPct)
	c.LeakPct = secondHalfGrowth(part.Samples, float64(p.LoopTime), c.TotalSec)
}

// secondHalfGrowth is the RSS growth in % from the middle of a test (or
// one and a half loops, when that is later: the fleet has registered and
// pushed by then) to its end; 0 when the test is too short to tell.
func secondHalfGrowth(samples []sample, loopTime, total float64) float64 {
	from := max(total/2, 1.5*loopTime)
	if len(samples) < 4 || from >= total*0.9 {
		return 0
	}
	i := sort.Search(len(samples), func(i int) bool { return samples[i].T >= from })
	if i >= len(samples)-1 {
		return 0
	}
	mid, end := samples[i].RSSMiB, samples[len(samples)-1].RSSMiB
	if mid <= 0 {
		return 0
	}
	return max(0, (end-mid)/mid*100)
}

func computeRows(r *Result, c *Calc) {
	p := r.Preset
	c.Lowest = math.Inf(1)
	for _, part := range r.Parts {
		op := part.Push
		if p.Kind == peak && p.Mode == peakRegister {
			op = part.Register
		}
		row := row{Handlers: part.HandlerThreads, ElapsedSec: op.ElapsedSec, Pushes: op.Accepted,
			ErrPct: pushErrorPct(op.ErrOrRetried(), op.Performed()), P50: op.LatencyMs.P50, P99: op.LatencyMs.P99,
			EmuCPU: part.Emulator.CPUAvg}
		row.PushesPerSec = pushesPerSec(op.Accepted, op.ElapsedSec)
		row.Ideal = idealMaxDevices(row.PushesPerSec, float64(p.LoopTime))
		row.Rec020 = recommendedMax(row.Ideal, rule060.Pct)
		row.Safe080 = recommendedMax(row.Ideal, rule080.Pct)
		row.Broke = sumMap(op.Dropped) > 0 || op.Resent > 0 || op.Retried > 0 || op.Rejected["503"] > 0 || op.Rejected["429"] > 0
		c.Rows = append(c.Rows, row)
		if row.PushesPerSec > 0 && row.PushesPerSec < c.Lowest {
			c.Lowest = row.PushesPerSec
		}
	}
	if math.IsInf(c.Lowest, 1) {
		c.Lowest = 0
	}
	if p.Kind == benchmark && p.SSL && c.Lowest > 0 {
		c.Ideal080 = idealMaxDevices(c.Lowest, float64(p.LoopTime))
		c.Safe080 = recommendedMax(c.Ideal080, rule080.Pct)
	}
}

// computeFleet checks the fleet test's criteria: nothing rejected or dropped, p99
// latency from the intended send time, every second's throughput against
// the median second, server RSS per device at the end.
func computeFleet(r *Result, c *Calc) {
	p := r.Preset
	if len(r.Parts) == 0 {
		return
	}
	part := r.Parts[0]
	push := part.Push
	c.P99Ms = push.LatencyMs.P99
	add := func(name, measured, limit string, ok bool) {
		c.Checks = append(c.Checks, check{name, measured, limit, ok})
	}
	rejected := sumMap(push.Rejected) + push.Retried
	add("rejected pushes (an error status, or 503/429 retried later)", group(rejected), "0", rejected == 0)
	dropped := sumMap(push.Dropped) + push.Skipped + push.Unregistered + push.Aborted
	add("dropped pushes (no answer, not sent, or cut off)", group(dropped), "0", dropped == 0)
	add("p99 latency from the intended send time", render.Fixed(push.LatencyMs.P99, 1)+" ms", render.Fixed(fleetMaxP99Ms, 0)+" ms",
		push.Accepted > 0 && push.LatencyMs.P99 <= fleetMaxP99Ms)
	rates := completeSeconds(part.Series, part.ScheduleStart, p.Duration.Seconds())
	if len(rates) > 0 {
		sorted := append([]float64(nil), rates...)
		sort.Float64s(sorted)
		c.MedianPerSec = median(sorted)
		c.MinPerSec = sorted[0]
	}
	add("lowest accepted pushes per second / median second", fmt.Sprintf("%s / %s = %s", render.Fixed(c.MinPerSec, 0), render.Fixed(c.MedianPerSec, 0), render.Fixed(safeDiv(c.MinPerSec, c.MedianPerSec), 3)),
		"≥ "+render.Fixed(fleetMinRateOfMedian, 1), len(rates) > 0 && c.MinPerSec >= fleetMinRateOfMedian*c.MedianPerSec)
	c.BytesPerDev = part.After.RSSMiB * (1 << 20) / float64(max(p.Devices, 1))
	measured := render.Fixed(c.BytesPerDev, 0) + " bytes (" + render.Fixed(part.After.RSSMiB, 1) + " MiB)"
	judged := c.BytesPerDev
	// A scaled run judges its RSS projected to the full fleet: the empty
	// server's RSS plus the growth per device times the full fleet.
	if full, ok := Lookup(p.Name); ok && full.Devices > p.Devices && part.Empty != nil && part.Empty.RSSMiB > 0 {
		grow := (part.After.RSSMiB - part.Empty.RSSMiB) / float64(max(p.Devices, 1))
		judged = (part.Empty.RSSMiB + grow*float64(full.Devices)) * (1 << 20) / float64(full.Devices)
		c.ProjectedDevices, c.ProjectedBytesPerDev = full.Devices, judged
		measured += fmt.Sprintf("; projected to %s devices (empty server %s MiB + growth × devices): %s bytes",
			gi(full.Devices), render.Fixed(part.Empty.RSSMiB, 1), render.Fixed(judged, 0))
	}
	add("server RSS at the end per device", measured, render.Fixed(fleetMaxBytesPerDev, 0)+" bytes",
		part.After.RSSMiB > 0 && judged <= fleetMaxBytesPerDev)
	loop, end := part.ScheduleStart+float64(p.LoopTime), part.ScheduleStart+p.Duration.Seconds()
	margin := min(cpuWindowMargin, float64(p.LoopTime)/10)
	c.CPUPerPushFirstUS = cpuPerPushUS(part, part.ScheduleStart+margin, min(loop, end)-margin)
	c.CPUPerPushLaterUS = cpuPerPushUS(part, loop+margin, end-margin)
	if p.MaxCPUPerPushUS > 0 {
		add("server CPU per push after the first loop (sessions resumed)",
			render.Fixed(c.CPUPerPushLaterUS, 0)+" µs (first loop, full handshakes: "+render.Fixed(c.CPUPerPushFirstUS, 0)+" µs)",
			render.Fixed(p.MaxCPUPerPushUS, 0)+" µs", c.CPUPerPushLaterUS > 0 && c.CPUPerPushLaterUS <= p.MaxCPUPerPushUS)
	}
}

// cpuPerPushUS is the server's CPU time per accepted push, µs, between from
// and to (seconds since the part started): the CPU of the server samples
// within the window over the accepted pushes of the same span (buckets
// counted by their overlap). 0 when the window holds no two samples or no
// push.
func cpuPerPushUS(part resultPart, from, to float64) float64 {
	var cpu, a, b float64
	prev, first := 0.0, true
	for _, s := range part.Samples {
		if prev >= from && s.T <= to {
			if first {
				a, first = prev, false
			}
			cpu += s.CPUPct / 100 * (s.T - prev)
			b = s.T
		}
		prev = s.T
	}
	if first || b <= a {
		return 0
	}
	var pushes float64
	for _, pt := range part.Series {
		if pt.Dur <= 0 {
			continue
		}
		if ov := min(pt.T+pt.Dur, b) - max(pt.T, a); ov > 0 {
			pushes += pt.Accepted * ov
		}
	}
	if pushes <= 0 {
		return 0
	}
	return cpu / pushes * 1e6
}

// Overload test criteria (docs/perf.md, the overload test).
const (
	overloadMinOfCapacity = 0.9 // accepted pushes per second, median second, against the capacity
	overloadMaxSameRetry  = 0.6 // the largest share of 503 answers with one Retry-After value
)

// computeOverload checks the overload test: offered OverloadFactor × the
// capacity, the server still accepts at least 0.9 × the capacity, and its
// 503 answers spread their Retry-After.
func computeOverload(r *Result, c *Calc) {
	if len(r.Parts) == 0 || r.Parts[0].Capacity == nil {
		return
	}
	part := r.Parts[0]
	capa := part.Capacity
	rates := completeSeconds(part.Series, part.ScheduleStart, r.Preset.Duration.Seconds())
	if len(rates) > 0 {
		sorted := append([]float64(nil), rates...)
		sort.Float64s(sorted)
		c.MedianPerSec, c.MinPerSec = median(sorted), sorted[0]
	}
	c.P99Ms = part.Push.LatencyMs.P99
	c.Checks = append(c.Checks, check{"accepted pushes per second (median second) / capacity",
		fmt.Sprintf("%s / %s = %s (offered %s/s; lowest second %s)", render.Fixed(c.MedianPerSec, 0), render.Fixed(capa.PerSec, 0),
			render.Fixed(safeDiv(c.MedianPerSec, capa.PerSec), 3), render.Fixed(capa.Offered, 0), render.Fixed(c.MinPerSec, 0)),
		"≥ " + render.Fixed(overloadMinOfCapacity, 1), len(rates) > 0 && c.MedianPerSec >= overloadMinOfCapacity*capa.PerSec})
	var total, most int64
	values := 0
	for k, n := range part.Push.RetryAfter {
		if k == "none" {
			continue
		}
		total += n
		most = max(most, n)
		values++
	}
	none := part.Push.RetryAfter["none"]
	measured := fmt.Sprintf("%s answers, %d values (%s); most common %s", group(total), values, mapText(part.Push.RetryAfter), render.Fixed(100*safeDiv(float64(most), float64(total)), 1)+" %")
	ok := none == 0 && (total == 0 || (values >= 2 && float64(most) <= overloadMaxSameRetry*float64(total)))
	if total == 0 && none == 0 {
		measured = "no 503 or 429 answer"
	}
	c.Checks = append(c.Checks, check{"Retry-After of the 503/429 answers spread", measured,
		fmt.Sprintf("every one has a Retry-After; ≥ 2 values, none on more than %s %%", render.Fixed(100*overloadMaxSameRetry, 0)), ok})
}

// completeSeconds is the accepted pushes per second of the series buckets
// that lie wholly inside the schedule, which starts when the emulator's
// clock started (start, seconds into the series; it builds its devices
// first) and lasts duration: the first and the last bucket are partial and
// left out, as are those before the schedule and after it (answers to the
// last pushes).
func completeSeconds(series []point, start, duration float64) []float64 {
	var out []float64
	for i, pt := range series {
		if i == 0 || i == len(series)-1 || pt.T < start || pt.T+pt.Dur > start+duration || pt.Dur <= 0 {
			continue
		}
		out = append(out, pt.Accepted)
	}
	return out
}

func median(sorted []float64) float64 {
	n := len(sorted)
	if n%2 == 1 {
		return sorted[n/2]
	}
	return (sorted[n/2-1] + sorted[n/2]) / 2
}

func safeDiv(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}
