package perf

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/internal/emulator/results"
)

func near(t *testing.T, what string, got, want, tol float64) {
	t.Helper()
	if math.Abs(got-want) > tol {
		t.Errorf("%s = %.6f, want %.6f (±%g)", what, got, want, tol)
	}
}

// The Dwarfguard 0.8.0 stability table, column C1 (Stab-2-2): 1000 devices,
// 512 MiB, 120 min, loop 200 s.
func TestStabilityFormulasSeedC1(t *testing.T) {
	near(t, "estimated pushes", estimatedPushes(1000, 120, 200), 36000, 0)
	near(t, "estimated req/s", estimatedReqPerSec(1000, 200), 5.00, 0)
	near(t, "rough req/s", roughReqPerSec(34000, 7302), 4.66, 0.005)
	near(t, "processed loops", processedLoops(34000, 1000), 34, 0)
	near(t, "real loop time", realLoopTime(7302, 34), 215, 0.5)
	near(t, "RSS increase", rssIncrease(44, 57), 13, 0)
	near(t, "RSS increase %", rssIncreasePct(44, 57), 29.55, 0.005)
	near(t, "MiB per device", perDevice(13, 1000), 0.013, 0)
	near(t, "RAM utilisation", ramUtilisationPct(246, 512), 48.05, 0.005)
	if got := maxSafeDevices(1000, ramUtilisationPct(246, 512)); got != 2081 {
		t.Errorf("max safe = %d, want 2,081", got)
	}
	near(t, "load per core", loadPerCore(0.16, 2), 0.08, 1e-9)
	near(t, "push errors", pushErrorPct(0, 34000), 0, 0)
}

// Other columns of the same table, where the extraction is clean.
func TestStabilityFormulasSeedOtherColumns(t *testing.T) {
	// C2 (Stab-4-2): 3000 devices, 1024 MiB, RSS 44 → 75, used 336 MiB.
	near(t, "C2 RSS increase %", rssIncreasePct(44, 75), 70.45, 0.005)
	near(t, "C2 MiB per device", perDevice(31, 3000), 0.010, 0.0005)
	near(t, "C2 RAM utilisation", ramUtilisationPct(336, 1024), 32.81, 0.005)
	if got := maxSafeDevices(3000, ramUtilisationPct(336, 1024)); got != 9143 {
		t.Errorf("C2 max safe = %d, want 9,143", got)
	}
	near(t, "C2 rough req/s", roughReqPerSec(99000, 7308), 13.55, 0.005)
	near(t, "C3 rough req/s", roughReqPerSec(320000, 7260), 44.08, 0.005)
	near(t, "H1 push errors (1=100%)", pushErrorPct(31, 930000)/100, 0.000033333, 1e-9)
	near(t, "C3 load per core", loadPerCore(0.51, 4), 0.13, 0.005)
}

func TestBenchmarkFormulasSeed(t *testing.T) {
	// MAMAS 0.6.0, container 1, bench-4-SSL: 3000 devices × 10 loops in 210.66 s.
	pps := pushesPerSec(3000*10, 210.66)
	near(t, "pushes/s", pps, 142.41, 0.005)
	ideal := idealMaxDevices(pps, 260)
	if ideal != 37026 {
		t.Errorf("ideal = %d, want 37,026", ideal)
	}
	if got := recommendedMax(ideal, rule060.Pct); got != 7405 {
		t.Errorf("20 %% rule = %d, want 7,405", got)
	}
	// Container 2: 165.34 s → 181.44 pushes/s → 47,175 ideal, 9,435 recommended.
	pps = pushesPerSec(30000, 165.34)
	near(t, "C2 pushes/s", pps, 181.44, 0.005)
	if got := idealMaxDevices(pps, 260); got != 47175 {
		t.Errorf("C2 ideal = %d, want 47,175", got)
	}
	if got := recommendedMax(47175, 20); got != 9435 {
		t.Errorf("C2 recommended = %d, want 9,435", got)
	}
	// Dwarfguard 0.8.0: the lowest SSL throughput × 200 s, 80 % safe.
	for _, c := range []struct {
		pps         float64
		ideal, safe int
	}{{125.53, 25106, 20085}, {237.45, 47490, 37992}, {284.02, 56804, 45443}, {323.93, 64786, 51829}, {96.64, 19328, 15462}} {
		ideal := idealMaxDevices(c.pps, 200)
		safe := recommendedMax(ideal, rule080.Pct)
		if ideal != c.ideal || safe != c.safe {
			t.Errorf("%.2f pushes/s: ideal %d safe %d, want %d and %d", c.pps, ideal, safe, c.ideal, c.safe)
		}
	}
}

func TestPctOfPreviousSeed(t *testing.T) {
	// 0.7.0 vs 0.6.0, C1: RSS 57 vs 49 MiB = 116 %, KiB/device 20 vs 15 = 133 %, 143 vs 142 pushes/s = 101 %.
	for _, c := range []struct{ v, prev, want float64 }{{57, 49, 116}, {20, 15, 133}, {143, 142, 101}, {665, 665, 100}, {175, 182, 96}} {
		if got := math.Round(pctOfPrevious(c.v, c.prev)); got != c.want {
			t.Errorf("%g / %g = %g %%, want %g %%", c.v, c.prev, got, c.want)
		}
	}
	if judge(116, true) != "acceptable" || judge(133, true) != "regression" || judge(96, false) != "acceptable" || judge(79, false) != "regression" || judge(100, true) != "success" {
		t.Error("judge does not follow the reports' rule")
	}
}

// seedStab is the 0.8.0 C1 stability column as a result, to check the
// whole Compute pipeline against the report.
func seedStab() *Result {
	start := time.Date(2023, 10, 3, 8, 0, 0, 0, time.UTC)
	p, _ := Lookup("Stab-2-2")
	return &Result{
		Format: resultFormat, Preset: p, Command: "drover perf run Stab-2-2", Started: start, Ended: start.Add(7310 * time.Second),
		Env:        environment{Host: "c1", CPUModel: "Intel Xeon E5 2.2GHz", Cores: 1, Threads: 1, RAMMiB: 512, Kernel: "linux 6.1", GoVersion: "go1.26", DroverVersion: "v0.1.0", Emulator: "another machine"},
		Setup:      setup{Target: "local https://127.0.0.1:8443", Local: true, Backend: "SQLite (embedded)", Persistence: "write-through", TLS: true, Conn: "new"},
		Thresholds: defaultThresholds(),
		Parts: []resultPart{{
			Started: start, Ended: start.Add(7302 * time.Second),
			Push:     opFigures{Accepted: 34000, ElapsedSec: 7300, LatencyMs: latency{P50: 4, P90: 7, P99: 12, Max: 80, Mean: 5}},
			Register: opFigures{Accepted: 1000, ElapsedSec: 200},
			Before:   snapshot{At: start, RSSMiB: 44, CPUSecs: 1, UsedMiB: 215, AvailMiB: 296, Load15: 0.02, Machine: true},
			After:    snapshot{At: start.Add(7302 * time.Second), RSSMiB: 57, CPUSecs: 74.02, UsedMiB: 246, AvailMiB: 265, Load15: 0.07, Machine: true},
			Log: logSummary{Lines: 40, Groups: []logGroup{{Level: "WARN", Msg: "overloaded", Count: 2,
				First: start.Add(10 * time.Second), Last: start.Add(11 * time.Second), Example: `{"level":"WARN","msg":"overloaded"}`}}},
			LogReviewed: true,
			Emulator:    emuStats{CPUAvg: 0.02, CPUMax: 0.1, RSSMiB: 30, Cores: 1},
		}},
	}
}

func TestComputeStabilitySeedC1(t *testing.T) {
	c := Compute(seedStab())
	near(t, "estimated pushes", c.EstPushes, 36000, 0)
	near(t, "estimated req/s", c.EstReqPerSec, 5, 0)
	near(t, "rough req/s", c.RoughReqPerSec, 4.66, 0.005)
	near(t, "real loop time", math.Round(c.RealLoopTime), 215, 0)
	near(t, "RSS increase", c.RSSIncMiB, 13, 0)
	near(t, "RSS increase %", c.RSSIncPct, 29.55, 0.005)
	near(t, "MiB per device", c.MiBPerDevice, 0.013, 0)
	near(t, "RAM utilisation", c.RAMUtilPct, 48.05, 0.005)
	if c.MaxSafe != 2081 {
		t.Errorf("max safe %d, want 2,081", c.MaxSafe)
	}
	near(t, "load per core", c.LoadPerCore, 0.07, 1e-9)
	if c.RAMGrade != "reasonable" || c.CPUGrade != "perfect (low)" {
		t.Errorf("grades %q / %q, want reasonable / perfect (low) as in the report", c.RAMGrade, c.CPUGrade)
	}
	if c.Verdict != passed || c.LogWarnings != 2 {
		t.Errorf("verdict %s (%v), warnings %d", c.Verdict, c.Reasons, c.LogWarnings)
	}
}

func TestComputeStabilityFailures(t *testing.T) {
	r := seedStab()
	r.Parts[0].Push.Rejected = map[string]int64{"503": 30}
	r.Parts[0].Push.Retried = 10
	r.Parts[0].Log.Groups = append(r.Parts[0].Log.Groups, logGroup{Level: "ERROR", Msg: "store commit failed", Count: 1})
	r.Parts[0].After.UsedMiB = 500
	c := Compute(r)
	if c.Verdict != Failed || len(c.Reasons) != 3 {
		t.Fatalf("verdict %s, reasons %q: want FAILED for errors, log and RAM", c.Verdict, c.Reasons)
	}
	near(t, "push errors", c.PushErrPct, 40.0/34030*100, 1e-9)

	r = seedStab()
	r.Parts[0].ServerExit = "signal: killed"
	if c := Compute(r); c.Verdict != Failed || c.Crashes != 1 {
		t.Errorf("a crash: verdict %s, crashes %d", c.Verdict, c.Crashes)
	}

	// A leak: RSS climbs through the second half.
	r = seedStab()
	for i := 0; i <= 100; i++ {
		r.Parts[0].Samples = append(r.Parts[0].Samples, sample{T: float64(i) * 73.02, RSSMiB: 44 + float64(i)})
	}
	if c := Compute(r); c.Verdict != Failed || c.LeakPct < 20 {
		t.Errorf("leak: verdict %s, growth %.1f %%", c.Verdict, c.LeakPct)
	}
}

// seedBench is Dwarfguard 0.8.0's Bench-6-SSL on C1: 125.53, 143.52, 155.61
// and 163.62 pushes/s with 1, 2, 4 and 8 handler threads.
func seedBench() *Result {
	start := time.Date(2023, 10, 4, 9, 0, 0, 0, time.UTC)
	p, _ := Lookup("Bench-6-SSL")
	r := &Result{Format: resultFormat, Preset: p, Command: "drover perf run Bench-6-SSL", Started: start, Ended: start.Add(10 * time.Minute),
		Env:        environment{Host: "c1", CPUModel: "Intel Xeon E5 2.2GHz", Cores: 1, Threads: 1, RAMMiB: 512, GoVersion: "go1.26", DroverVersion: "v0.1.0", Emulator: "another machine"},
		Setup:      setup{Target: "local https://127.0.0.1:8443", Local: true, Backend: "SQLite (embedded)", Persistence: "write-through", TLS: true, Conn: "new"},
		Thresholds: defaultThresholds()}
	for i, pps := range []float64{125.53, 143.52, 155.61, 163.62} {
		at := start.Add(time.Duration(i) * 2 * time.Minute)
		el := 12000 / pps
		r.Parts = append(r.Parts, resultPart{HandlerThreads: 1 << i, Started: at, Ended: at.Add(time.Duration(el * float64(time.Second))),
			Push:     opFigures{Accepted: 12000, ElapsedSec: el, LatencyMs: latency{P50: 40, P90: 50, P99: 60, Max: 90, Mean: 42}},
			Register: opFigures{Accepted: 1200, ElapsedSec: 9},
			Before:   snapshot{At: at, RSSMiB: 40, Machine: true, UsedMiB: 200, AvailMiB: 300},
			After:    snapshot{At: at.Add(100 * time.Second), RSSMiB: 50, CPUSecs: 80, Machine: true, UsedMiB: 220, AvailMiB: 280, Load15: 0.5},
			Log:      logSummary{Lines: 8}, LogReviewed: true, Emulator: emuStats{CPUAvg: 0.3}})
	}
	return r
}

func TestComputeBenchmarkSeed(t *testing.T) {
	c := Compute(seedBench())
	if len(c.Rows) != 4 {
		t.Fatalf("%d rows", len(c.Rows))
	}
	near(t, "lowest", c.Lowest, 125.53, 1e-9)
	if c.Ideal080 != 25106 || c.Safe080 != 20085 {
		t.Errorf("0.8.0 rule: ideal %d safe %d, want 25,106 and 20,085", c.Ideal080, c.Safe080)
	}
	if c.Verdict != passed {
		t.Errorf("verdict %s %v", c.Verdict, c.Reasons)
	}
}

func TestComputePeakLimit(t *testing.T) {
	p, _ := Lookup("PeakD-1024-max")
	r := &Result{Format: resultFormat, Preset: p, Thresholds: defaultThresholds(), Parts: []resultPart{{
		Push: opFigures{Accepted: 900000, Retried: 120, Dropped: map[string]int64{"timeout": 5}, ElapsedSec: 600}}}}
	c := Compute(r)
	if c.Verdict != limited || !c.Rows[0].Broke {
		t.Errorf("verdict %s, want %s", c.Verdict, limited)
	}
	r.Parts[0].Push.Retried, r.Parts[0].Push.Dropped = 0, nil
	if c := Compute(r); c.Verdict != passed {
		t.Errorf("verdict %s, want PASSED", c.Verdict)
	}
}

func TestFleetChecks(t *testing.T) {
	r := &Result{Preset: Preset{Name: FleetPreset, Kind: fleet, Devices: 100_000, Duration: 10 * time.Second, LoopTime: 200}}
	part := resultPart{Push: opFigures{Accepted: 5000, LatencyMs: latency{P99: 900}}, After: snapshot{RSSMiB: 90}}
	for i := 0; i < 12; i++ { // buckets 0 and 11 are partial; 10 is past the schedule
		part.Series = append(part.Series, point{T: float64(i), Dur: 1, Accepted: 500})
	}
	part.Series[0].Accepted, part.Series[10].Accepted, part.Series[11].Accepted = 3, 1, 1
	part.Series[4].Accepted = 401
	r.Parts = []resultPart{part}
	c := Compute(r)
	if c.Verdict != passed || c.MedianPerSec != 500 || c.MinPerSec != 401 || len(c.Checks) != 5 {
		t.Fatalf("%s %v median %g min %g", c.Verdict, c.Reasons, c.MedianPerSec, c.MinPerSec)
	}
	// Each criterion fails on its own.
	for name, change := range map[string]func(p *resultPart){
		"rejected": func(p *resultPart) { p.Push.Rejected = map[string]int64{"500": 1} },
		"retried":  func(p *resultPart) { p.Push.Retried = 1 },
		"dropped":  func(p *resultPart) { p.Push.Dropped = map[string]int64{"timeout": 1} },
		"skipped":  func(p *resultPart) { p.Push.Skipped = 1 },
		"p99":      func(p *resultPart) { p.Push.LatencyMs.P99 = 1001 },
		"rate":     func(p *resultPart) { p.Series = append([]point(nil), p.Series...); p.Series[4].Accepted = 399 },
		"rss":      func(p *resultPart) { p.After.RSSMiB = 98 },
	} {
		bad := *r
		bp := part
		change(&bp)
		bad.Parts = []resultPart{bp}
		if c := Compute(&bad); c.Verdict != Failed || len(c.Reasons) != 1 {
			t.Errorf("%s: %s %v", name, c.Verdict, c.Reasons)
		}
	}
}

// A scaled fleet test judges the RSS projected to the full fleet.
func TestFleetRSSProjected(t *testing.T) {
	r := &Result{Preset: Preset{Name: FleetPreset, Kind: fleet, Devices: 100_000, Duration: 10 * time.Second, LoopTime: 200}}
	r.Parts = []resultPart{{Empty: &snapshot{RSSMiB: 20}, After: snapshot{RSSMiB: 110}}}
	c := Compute(r)
	// growth 90 MiB / 100,000 = 943.7 B; projected (20 MiB + 943.7 B × 1e6) / 1e6 = 964.7 B
	if c.ProjectedDevices != 1_000_000 || c.ProjectedBytesPerDev < 964 || c.ProjectedBytesPerDev > 965.5 || !c.Checks[4].OK {
		t.Fatalf("projected %d devices, %g B, %+v", c.ProjectedDevices, c.ProjectedBytesPerDev, c.Checks[4])
	}
	r.Parts[0].After.RSSMiB = 120 // growth 1,048.6 B per device
	if c := Compute(r); c.Checks[4].OK {
		t.Fatalf("%+v", c.Checks[4])
	}
}

func TestOverloadChecks(t *testing.T) {
	r := &Result{Preset: Preset{Name: "Overload-1.5x", Kind: overload, Devices: 1000, Duration: 6 * time.Second, LoopTime: 200}}
	part := resultPart{Capacity: &capacity{PerSec: 1000, Offered: 1500}, Push: opFigures{Accepted: 5000,
		RetryAfter: map[string]int64{"2": 30, "3": 35, "4": 35}}}
	for i := 0; i < 8; i++ {
		part.Series = append(part.Series, point{T: float64(i), Dur: 1, Accepted: 950})
	}
	r.Parts = []resultPart{part}
	if c := Compute(r); c.Verdict != passed || len(c.Checks) != 2 || c.MedianPerSec != 950 {
		t.Fatalf("%s %v %+v", c.Verdict, c.Reasons, c.Checks)
	}
	for name, change := range map[string]func(p *resultPart){
		"collapse":     func(p *resultPart) { p.Capacity = &capacity{PerSec: 1100, Offered: 1650} },
		"one value":    func(p *resultPart) { p.Push.RetryAfter = map[string]int64{"2": 100} },
		"mostly one":   func(p *resultPart) { p.Push.RetryAfter = map[string]int64{"2": 70, "3": 30} },
		"without one":  func(p *resultPart) { p.Push.RetryAfter = map[string]int64{"2": 50, "3": 50, "none": 1} },
		"no capacity?": func(p *resultPart) { p.Series = nil },
	} {
		bp := part
		change(&bp)
		bad := *r
		bad.Parts = []resultPart{bp}
		if c := Compute(&bad); c.Verdict != Failed {
			t.Errorf("%s: %s %+v", name, c.Verdict, c.Checks)
		}
	}
}

// The fleet test over TLS also judges the server's CPU per push once the
// devices resume their sessions (after the first loop); the first loop,
// full handshakes, is reported beside it.
func TestFleetCPUPerPush(t *testing.T) {
	r := &Result{Preset: Preset{Name: fleetTLSPreset, Kind: fleet, SSL: true, Devices: 40_000, Duration: 100 * time.Second,
		LoopTime: 40, MaxCPUPerPushUS: 150}}
	part := resultPart{ScheduleStart: 2, Push: opFigures{Accepted: 100_000, LatencyMs: latency{P99: 20}}, After: snapshot{RSSMiB: 30}}
	for i := 0; i < 104; i++ {
		part.Series = append(part.Series, point{T: float64(i), Dur: 1, Accepted: 1000})
		// 1,000 pushes/s: 0.5 cores in the first loop (500 µs a push),
		// 0.12 cores after it (120 µs).
		cpu := 50.0
		if float64(i+1) > 2+40 {
			cpu = 12
		}
		part.Samples = append(part.Samples, sample{T: float64(i + 1), CPUPct: cpu})
	}
	r.Parts = []resultPart{part}
	c := Compute(r)
	if c.CPUPerPushFirstUS < 499 || c.CPUPerPushFirstUS > 501 || c.CPUPerPushLaterUS < 119 || c.CPUPerPushLaterUS > 121 {
		t.Fatalf("CPU per push: first loop %g µs, later %g µs", c.CPUPerPushFirstUS, c.CPUPerPushLaterUS)
	}
	if len(c.Checks) != 6 || !c.Checks[5].OK || c.Verdict != passed {
		t.Fatalf("%s %v %+v", c.Verdict, c.Reasons, c.Checks)
	}
	for i := range part.Samples {
		part.Samples[i].CPUPct *= 1.5 // 180 µs after the first loop
	}
	if c := Compute(r); c.Verdict != Failed || len(c.Reasons) != 1 || !strings.Contains(c.Reasons[0], "CPU per push") {
		t.Fatalf("%s %v", c.Verdict, c.Reasons)
	}
	// Other fleet tests report the figures without judging them.
	r.Preset.MaxCPUPerPushUS = 0
	if c := Compute(r); len(c.Checks) != 5 || c.CPUPerPushLaterUS < 179 || c.CPUPerPushLaterUS > 181 {
		t.Fatalf("%+v, later %g µs", c.Checks, c.CPUPerPushLaterUS)
	}
	// The protocol speaks of handshakes only where there were some.
	if md := markdownOf(r); !strings.Contains(md, "Server CPU time per accepted push: 750 µs in the first loop, 180 µs after it.") {
		t.Errorf("plain HTTP: %s", md)
	}
	r.Parts[0].Conns = &results.Conns{TLSFull: 40_000, TLSResumed: 60_000}
	if md := markdownOf(r); !strings.Contains(md, "750 µs in the first loop (each device's first connection, a full handshake), 180 µs after it (resumed sessions).") {
		t.Errorf("over TLS: %s", md)
	}
}
