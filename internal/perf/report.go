package perf

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"time"

	"github.com/drover/drover/internal/logcat"
	"github.com/drover/drover/internal/render"
)

// markdownOf renders r's protocol as markdownOf.
func markdownOf(r *Result) string { return protocol(r, false).markdown() }

// htmlProtocol renders r's protocol as a self-contained HTML page with charts.
func htmlProtocol(r *Result) string { return protocol(r, true).html() }

// group writes an integer with thousands separators.
func group(n int64) string { return render.Group(n) }

func gi(n int) string { return group(int64(n)) }

func yesNo(b bool) string {
	if b {
		return "Yes"
	}
	return "No"
}

func stamp(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05 UTC") }

func orNA(ok bool, s string) string {
	if !ok {
		return "n/a"
	}
	return s
}

func protocol(r *Result, charts bool) *doc {
	c := Compute(r)
	p := r.Preset
	d := &doc{title: "Drover performance protocol: " + r.Title()}
	d.p("Verdict: **%s** — %s, %s to %s.", c.Verdict, kindName(p), stamp(r.Started), stamp(r.Ended))
	if r.Changes != "" {
		d.p("This is a **scaled-down** run (%s): a quick look, not a protocol of the %s test itself.", r.Changes, p.Name)
	}

	d.h("Test specs")
	t := newTable("ID", "SSL?", "# of devices", "push/work threads", "# of loops", "# of minutes", "loop time / s", "notes")
	loops, minutes := "N/A", "N/A"
	if p.Loops > 0 {
		loops = gi(p.Loops)
	}
	if p.Duration > 0 {
		minutes = render.TrimZeros(render.Fixed(p.Minutes(), 2))
	}
	hs := "as configured"
	if len(p.Handlers) > 0 && r.Setup.Local {
		hs = joinInts(p.Handlers)
	} else if r.Setup.Local {
		hs = "one per CPU"
	}
	t.row(p.Name, yesNo(p.SSL), gi(p.Devices), fmt.Sprintf("%d/%s", p.Threads, hs), loops, minutes, gi(p.LoopTime), specNote(p))
	d.tab(t)

	d.h("Environment")
	e := r.Env
	t = newTable("item", "value")
	if e.Label != "" {
		t.row("environment", e.Label)
	}
	t.row("host", e.Host)
	t.row("CPU", e.CPUModel)
	t.row("CPU cores / threads", fmt.Sprintf("%d / %d", e.Cores, e.Threads))
	t.row("RAM / MiB", render.Fixed(e.RAMMiB, 0))
	if e.Cgroup != "" {
		t.row("server limits", e.Cgroup)
	}
	if e.Source != "" {
		t.row("described by", e.Source)
	}
	t.row("kernel", e.Kernel)
	t.row("OS", e.OS)
	t.row("Go / Drover", e.GoVersion+" / "+e.DroverVersion)
	t.row("server", r.Setup.Target)
	t.row("backend / persistence", r.Setup.Backend+" / "+r.Setup.Persistence)
	t.row("TLS", yesNo(r.Setup.TLS))
	t.row("emulator connections", connName(r.Setup.Conn, r.Setup.TLS))
	t.row("emulator", e.Emulator)
	if e.OpenFiles > 0 {
		t.row("open files limit", group(int64(e.OpenFiles)))
	}
	if len(r.Setup.ServerArgs) > 0 {
		t.row("extra server flags", "`"+strings.Join(r.Setup.ServerArgs, " ")+"`")
	}
	d.tab(t)
	if len(e.LoadMachines) > 0 {
		loadMachinesSection(d, e.LoadMachines)
	}

	switch p.Kind {
	case stability:
		stabilitySections(d, r, &c)
	case fleet:
		fleetSection(d, r, &c)
		stabilitySections(d, r, &c)
	case overload:
		overloadSection(d, r, &c)
	case rollout:
		rolloutSection(d, r, &c)
	case registrar:
		registrarSections(d, r, &c)
	default:
		rowSections(d, r, &c)
	}

	d.h("Log analysis")
	logSection(d, r)

	d.h("Summary")
	t = newTable("item", "value")
	if p.Kind == stability || p.Kind == fleet {
		t.row("RAM utilisation note", orNA(c.RAMGrade != "", c.RAMGrade))
		t.row("CPU utilisation note", c.CPUGrade)
	}
	t.row("push errors (%)", render.Fixed(c.PushErrPct, 3))
	t.row("crashes / restarts", gi(c.Crashes))
	t.row("Verdict", "**"+c.Verdict+"**")
	d.tab(t)

	d.h("Verdict")
	if len(c.Reasons) == 0 {
		d.p("**%s**: every threshold below was met.", c.Verdict)
	} else {
		d.p("**%s**:", c.Verdict)
		d.list(c.Reasons...)
	}
	th := r.Thresholds
	t = newTable("threshold", "value")
	switch p.Kind {
	case stability:
		t.row("push errors (error-or-retried / performed) at most", render.Fixed(th.MaxPushErrorPct, 3)+" %")
		t.row("ERROR entries in the server log at most", gi(th.MaxLogErrors))
		t.row("crashes and restarts", "0")
		t.row("OS RAM utilisation after the test at most", render.Fixed(th.MaxRAMPct, 0)+" %")
		t.row("server RSS growth over the second half at most", render.Fixed(th.MaxLeakPct, 0)+" %")
		t.row("RAM utilisation grades (OS used / RAM)", gradeText(th.RAMGrades))
		t.row("CPU utilisation grades (server CPU, % of all CPU threads)", gradeText(th.CPUGrades))
	case fleet, overload, rollout:
		for _, ch := range c.Checks {
			t.row(ch.Name, ch.Limit)
		}
		t.row("ERROR entries in the server log at most", gi(th.MaxLogErrors))
		t.row("crashes and restarts", "0")
	case registrar:
		t.row("registration errors at most", render.Fixed(th.MaxPushErrorPct, 3)+" %")
		t.row("ERROR entries in the server log at most", gi(th.MaxLogErrors))
		t.row("crashes and restarts", "0")
	case benchmark:
		t.row("push errors at most", render.Fixed(th.MaxPushErrorPct, 3)+" %")
		t.row("ERROR entries in the server log at most", gi(th.MaxLogErrors))
		t.row("crashes and restarts", "0")
	case peak:
		t.row("FAILED", "a crash, a restart or ERROR entries in the server log")
		t.row("LIMIT REACHED", fmt.Sprintf("dropped, resent or deferred (503/429) requests, or less than %s %% accepted", render.Fixed(th.MinAcceptedPct, 0)))
		t.row("PASSED", "none of these at this thread count")
	}
	d.tab(t)

	if charts {
		d.h("Charts")
		if p.Kind == rollout && len(r.Parts) > 0 {
			rolloutCharts(d, r.Parts[0].Rollout)
		}
		chartSections(d, r)
	}

	d.h("Notes")
	d.list(notes(r, &c)...)
	return d
}

func kindName(p Preset) string {
	switch p.Kind {
	case stability:
		return "stability test"
	case benchmark:
		return "benchmark"
	case fleet:
		return "fleet test"
	case overload:
		return "overload test"
	case rollout:
		return "rollout test"
	case registrar:
		return "registrar test"
	default:
		return "peak test (" + p.Note + ")"
	}
}

func specNote(p Preset) string {
	switch p.Kind {
	case stability:
		return "open loop: every device pushes once per loop time"
	case benchmark:
		return "closed loop: " + gi(p.Loops) + " immediate loops"
	case fleet:
		return "registered first; then open loop: every device pushes once per loop time, a new connection per push"
	case overload:
		return "registered first; capacity (closed loop, these threads), then 1.5 × capacity offered open loop"
	case rollout:
		return "registered first; open loop while a firmware rollout runs (threads: pushes in flight at most); " + p.Note
	default:
		return p.Note
	}
}

func connName(c string, tls bool) string {
	switch {
	case c == "new" && tls:
		return "a new connection (and TLS handshake) per request, as device agents do"
	case c == "new":
		return "a new connection per request (plain HTTP: no TLS handshake), as device agents behind a TLS terminator do"
	case c == "resume":
		return "a new connection per request, TLS sessions resumed"
	case c == "keepalive":
		return "kept-alive connections"
	}
	return c
}

func gradeText(gs []grade) string {
	var parts []string
	lo := 0.0
	for _, g := range gs {
		if g.Below == 0 {
			parts = append(parts, fmt.Sprintf("≥ %s %%: %s", render.Fixed(lo, 0), g.Label))
			continue
		}
		parts = append(parts, fmt.Sprintf("< %s %%: %s", render.Fixed(g.Below, 0), g.Label))
		lo = g.Below
	}
	return strings.Join(parts, "; ")
}

func stabilitySections(d *doc, r *Result, c *Calc) {
	var part resultPart
	if len(r.Parts) > 0 {
		part = r.Parts[0]
	}
	machine := part.Before.Machine
	d.h("Resources")
	t := newTable("", "", "value")
	t.row("HW specs", "CPU cores / threads", fmt.Sprintf("%d / %d", r.Env.Cores, r.Env.Threads))
	t.row("", "RAM / MiB", render.Fixed(r.Env.RAMMiB, 0))
	if r.Env.CPULimit > 0 {
		t.row("", "server CPU limit (cgroup), CPUs", render.Fixed(r.Env.CPULimit, 2))
	}
	if r.Env.MemLimitMiB > 0 {
		t.row("", "server memory limit (cgroup), MiB", render.Fixed(r.Env.MemLimitMiB, 0))
	}
	t.row("Pre-test", "available MiB OS", orNA(machine, render.Fixed(part.Before.AvailMiB, 0)))
	t.row("", "used MiB OS", orNA(machine, render.Fixed(part.Before.UsedMiB, 0)))
	t.row("", "drover RSS (MiB)", render.Fixed(c.RSSBefore, 1))
	t.row("Post-test", "available MiB OS", orNA(part.After.Machine, render.Fixed(part.After.AvailMiB, 0)))
	t.row("", "used MiB OS", orNA(part.After.Machine, render.Fixed(part.After.UsedMiB, 0)))
	t.row("", "drover RSS (MiB)", render.Fixed(c.RSSAfter, 1))
	t.row("", "avg load 15", orNA(part.After.Machine, render.Fixed(c.Load15, 2)))
	t.row("", "avg load 15 / CPU core", orNA(part.After.Machine, render.Fixed(c.LoadPerCore, 2)))
	t.row("", "drover CPU, avg / max (% of the CPU threads it may use)", render.Fixed(c.CPUAvgPct, 2)+" / "+render.Fixed(c.CPUMaxPct, 2))
	d.tab(t)

	d.h("Results")
	t = newTable("", "", "value")
	t.row("Test numbers", "processed loops", render.Fixed(c.ProcessedLoops, 2))
	t.row("", "total time / s", render.Fixed(c.TotalSec, 0))
	t.row("", "real loop time / s", render.Fixed(c.RealLoopTime, 0))
	t.row("", "estimated data-pushes", render.Fixed(c.EstPushes, 0))
	t.row("", "performed pushes", group(c.Performed))
	t.row("", "accepted pushes", group(c.Accepted))
	t.row("", "estimated avg req/s", render.Fixed(c.EstReqPerSec, 2))
	t.row("", "rough avg req/s", render.Fixed(c.RoughReqPerSec, 2))
	t.row("", "push latency p50 / p99 / max (ms, from the intended send time)", latencyText(part.Push.LatencyMs))
	t.row("", "late sends (more than 100 ms behind schedule)", group(part.Push.Late))
	t.row("Errors", "data errors / retries", group(c.ErrOrRetried))
	t.row("", "push errors (%)", render.Fixed(c.PushErrPct, 3))
	t.row("", "crashes", gi(c.Crashes))
	t.row("", "log entries (warnings + errors)", gi(c.LogWarnings+c.LogErrors))
	d.tab(t)
	opBreakdown(d, r)

	d.h("Calculations")
	t = newTable("item", "value", "formula")
	t.row("RSS increase MiB", render.Fixed(c.RSSIncMiB, 1), "RSS after − RSS before")
	t.row("RSS increase %", render.Fixed(c.RSSIncPct, 2), "increase / RSS before")
	t.row("MiB per device", render.Fixed(c.MiBPerDevice, 4), "increase / devices")
	t.row("KiB per device", render.Fixed(c.KiBPerDevice, 2), "increase × 1024 / devices")
	t.row("RAM utilisation %", orNA(c.RAMGrade != "", render.Fixed(c.RAMUtilPct, 2)), "OS used memory after / RAM")
	t.row("max safe # of devices", orNA(c.RAMGrade != "", gi(c.MaxSafe)), "devices / RAM utilisation")
	t.row("RSS growth over the second half %", render.Fixed(c.LeakPct, 2), "RSS at the end / RSS at max(½ duration, 1.5 loops) − 1")
	d.tab(t)
}

// overloadSection is an overload test's capacity phase and criteria
// (issue 11 point 4).
func overloadSection(d *doc, r *Result, c *Calc) {
	checksTable(d, "Overload test criteria", c)
	if len(r.Parts) == 0 || r.Parts[0].Capacity == nil {
		return
	}
	part := r.Parts[0]
	capa := part.Capacity
	d.h("Capacity and overload")
	t := newTable("phase", "value")
	t.row("registration (not measured)", fmt.Sprintf("%s devices in %s s", group(part.Register.Accepted), render.Fixed(part.Register.ElapsedSec, 1)))
	t.row("capacity: pushes back to back", fmt.Sprintf("%d workers, %s s: %s accepted, %s/s; rejected %s, dropped %s, retried %s",
		capa.Workers, render.Fixed(capa.Seconds, 1), group(capa.Push.Accepted), render.Fixed(capa.PerSec, 0), mapText(capa.Push.Rejected), mapText(capa.Push.Dropped), group(capa.Push.Retried)))
	t.row("overload: offered open loop", fmt.Sprintf("%s pushes/s (%s × capacity): %s devices, each every %s ms, for %s",
		render.Fixed(capa.Offered, 0), render.Fixed(overloadFactor, 1), gi(r.Preset.Devices), render.Fixed(capa.IntervalMs, 0), fmtDuration(r.Preset.Duration)))
	t.row("overload: accepted", fmt.Sprintf("%s pushes; median second %s/s, lowest %s/s", group(part.Push.Accepted), render.Fixed(c.MedianPerSec, 0), render.Fixed(c.MinPerSec, 0)))
	t.row("overload: latency from the intended send p50 / p99 / max (ms)", latencyText(part.Push.LatencyMs))
	t.row("overload: server RSS before / after (MiB)", render.Fixed(part.Before.RSSMiB, 1)+" / "+render.Fixed(part.After.RSSMiB, 1))
	d.tab(t)
	opBreakdown(d, r)
}

// fleetSection is a fleet test's criteria (issue 11 point 1).
func fleetSection(d *doc, r *Result, c *Calc) {
	checksTable(d, "Fleet test criteria", c)
	if len(r.Parts) > 0 {
		reg := r.Parts[0].Register
		d.p("Before the test the fleet registered (not measured, kept-alive connections): %s devices in %s s, %s rejected, %s dropped.",
			group(reg.Accepted), render.Fixed(reg.ElapsedSec, 1), group(sumMap(reg.Rejected)), group(sumMap(reg.Dropped)))
	}
}

func checksTable(d *doc, title string, c *Calc) {
	d.h(title)
	t := newTable("criterion", "measured", "limit", "result")
	for _, ch := range c.Checks {
		res := "pass"
		if !ch.OK {
			res = "**FAIL**"
		}
		t.row(ch.Name, ch.Measured, ch.Limit, res)
	}
	d.tab(t)
}

// ChecksText is a fleet or overload test's criteria as plain lines, for
// the terminal (none for other tests).
func ChecksText(r *Result) []string {
	c := Compute(r)
	var out []string
	for _, ch := range c.Checks {
		res := "pass"
		if !ch.OK {
			res = "FAIL"
		}
		out = append(out, fmt.Sprintf("  %-4s %s: %s (limit %s)", res, ch.Name, ch.Measured, ch.Limit))
	}
	return out
}

func latencyText(l latency) string {
	return render.Fixed(l.P50, 1) + " / " + render.Fixed(l.P99, 1) + " / " + render.Fixed(l.Max, 1)
}

func opBreakdown(d *doc, r *Result) {
	t := newTable("part", "operation", "accepted", "rejected", "dropped", "retried", "aborted at the end", "skipped / unregistered", "configs received")
	for _, part := range r.Parts {
		name := partName(r, part)
		for _, o := range []struct {
			n  string
			op opFigures
		}{{"register", part.Register}, {"push", part.Push}} {
			if o.op.Performed() == 0 && o.op.Aborted == 0 {
				continue
			}
			t.row(name, o.n, group(o.op.Accepted), mapText(o.op.Rejected), mapText(o.op.Dropped), group(o.op.Retried),
				group(o.op.Aborted), group(o.op.Skipped)+" / "+group(o.op.Unregistered), group(o.op.ConfigsSeen))
		}
	}
	if len(t.rows) > 0 {
		d.tab(t)
	}
}

func partName(r *Result, part resultPart) string {
	if part.Persistence != "" {
		return registrarPartName(part)
	}
	if part.HandlerThreads > 0 && len(r.Parts) == 1 {
		return fmt.Sprintf("%s, %d handler thread(s)", r.Preset.Name, part.HandlerThreads)
	}
	if part.HandlerThreads > 0 {
		return fmt.Sprintf("%d handler thread(s)", part.HandlerThreads)
	}
	return r.Preset.Name
}

func mapText(m map[string]int64) string {
	if len(m) == 0 {
		return "0"
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s: %s", k, group(m[k])))
	}
	return strings.Join(parts, ", ")
}

func rowSections(d *doc, r *Result, c *Calc) {
	p := r.Preset
	d.h("Resources")
	t := newTable("part", "RSS before (MiB)", "RSS after (MiB)", "server CPU avg (% of one core)", "OS used MiB after", "load 15 after", "emulator CPU (cores)")
	for _, part := range r.Parts {
		cpu := 0.0
		if dt := part.After.At.Sub(part.Before.At).Seconds(); dt > 0 {
			cpu = (part.After.CPUSecs - part.Before.CPUSecs) / dt * 100
		}
		t.row(partName(r, part), render.Fixed(part.Before.RSSMiB, 1), render.Fixed(part.After.RSSMiB, 1), render.Fixed(cpu, 0),
			orNA(part.After.Machine, render.Fixed(part.After.UsedMiB, 0)), orNA(part.After.Machine, render.Fixed(part.After.Load15, 2)), render.Fixed(part.Emulator.CPUAvg, 2))
	}
	d.tab(t)

	d.h("Results")
	what := "pushes"
	if p.Kind == peak && p.Mode == peakRegister {
		what = "registrations"
	}
	t = newTable("handler threads", "elapsed time / s", "accepted "+what, what+" / s", "p50 / p99 latency (ms)", "errors (%)", "drops or retries")
	for i, row := range c.Rows {
		h := handlersText(r, row.Handlers)
		_ = i
		t.row(h, render.Fixed(row.ElapsedSec, 2), group(row.Pushes), render.Fixed(row.PushesPerSec, 2), render.Fixed(row.P50, 1)+" / "+render.Fixed(row.P99, 1), render.Fixed(row.ErrPct, 3), yesNo(row.Broke))
	}
	d.tab(t)
	opBreakdown(d, r)
	if p.Kind == peak && p.Mode == peakFull {
		var changes int
		var seen int64
		for _, part := range r.Parts {
			changes += part.ConfigChanges
			seen += part.Push.ConfigsSeen
		}
		d.p("Configuration: the profiles were changed %d time(s) during the test; devices received a new configuration %s times and report its version in their next push, which acknowledges it.", changes, group(seen))
		for _, part := range r.Parts {
			if len(part.SyncStates) > 0 {
				d.p("Devices by sync state at the end: %s.", floatMapText(part.SyncStates))
			}
		}
	}

	d.h("Calculations")
	if p.Kind == benchmark {
		t = newTable("handler threads", "pushes / s", fmt.Sprintf("ideal max # devs (× %d s)", p.LoopTime), "rec. max # devs (20 %, 0.6.0)", "safe max # devs (80 %)")
		for _, row := range c.Rows {
			h := handlersText(r, row.Handlers)
			t.row(h, render.Fixed(row.PushesPerSec, 2), gi(row.Ideal), gi(row.Rec020), gi(row.Safe080))
		}
		d.tab(t)
		if p.SSL {
			d.p("Sizing rule applied: %s. Lowest SSL throughput of this test: %s pushes/s → ideal max %s devices, **safe max %s devices** at a %d s push interval.",
				rule080.Text, render.Fixed(c.Lowest, 2), gi(c.Ideal080), gi(c.Safe080), p.LoopTime)
		} else {
			d.p("Without TLS the 0.8.0 rule does not apply (it takes the lowest SSL throughput); the table gives both rules per row: %s; and 80 %% of the row's ideal.", rule060.Text)
		}
	} else {
		t = newTable("item", "value", "formula")
		for _, row := range c.Rows {
			t.row(what+" / s", render.Fixed(row.PushesPerSec, 2), "accepted / elapsed")
			if p.Mode != peakRegister {
				t.row(fmt.Sprintf("ideal max # devs (× %d s)", p.LoopTime), gi(row.Ideal), "pushes/s × loop time")
			}
			t.row("drops, resends or deferrals at "+gi(p.Threads)+" threads", yesNo(row.Broke), "dropped + resent + retried + 503/429 > 0")
		}
		d.tab(t)
	}
}

func handlersText(r *Result, h int) string {
	switch {
	case h > 0:
		return gi(h)
	case r.Setup.Local:
		return "one per CPU"
	}
	return "as configured"
}

func floatMapText(m map[string]float64) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %s", k, render.Fixed(m[k], 0)))
	}
	return strings.Join(parts, ", ")
}

func logSection(d *doc, r *Result) {
	reviewed := false
	for _, part := range r.Parts {
		reviewed = reviewed || part.LogReviewed
	}
	if !reviewed {
		d.p("The server log was not reviewed (a running server: give `--server-log FILE` to review it).")
		return
	}
	t := newTable("part", "level", "message", "count", "first", "last", "catalogue")
	lines := 0
	type seen struct {
		e     logcat.Entry
		count int
	}
	var quoted []*seen
	byKey := map[string]*seen{}
	var unknown []string
	for _, part := range r.Parts {
		lines += part.Log.Lines
		for _, g := range part.Log.Groups {
			first, last := "", ""
			if !g.First.IsZero() {
				first = g.First.UTC().Format("15:04:05")
			}
			if !g.Last.IsZero() {
				last = g.Last.UTC().Format("15:04:05")
			}
			key := "not catalogued"
			if e, ok := logcat.Lookup(g.Level, g.Msg); ok {
				key = e.Key
				if byKey[key] == nil {
					byKey[key] = &seen{e: e}
					quoted = append(quoted, byKey[key])
				}
				byKey[key].count += g.Count
			} else {
				unknown = append(unknown, g.Msg)
			}
			t.row(partName(r, part), g.Level, g.Msg, gi(g.Count), first, last, key)
		}
	}
	if len(t.rows) == 0 {
		d.p("%s log lines reviewed: no warnings, no errors.", gi(lines))
		return
	}
	d.p("%s log lines reviewed; warnings and errors grouped by level and message:", gi(lines))
	d.tab(t)
	if len(quoted) > 0 {
		d.p("What they mean, from the log catalogue (docs/log-catalogue.md):")
		var items []string
		for _, q := range quoted {
			items = append(items, fmt.Sprintf("%s `%s` %q, %s times: %s Costs: %s Do: %s", q.e.Level, q.e.Key, q.e.Msg, gi(q.count), q.e.Means, q.e.Costs, q.e.Do))
		}
		d.list(items...)
	}
	if len(unknown) > 0 {
		d.p("Not in the log catalogue (another server version, or a crash's output): %s.", strings.Join(unknown, "; "))
	}
}

func chartSections(d *doc, r *Result) {
	for _, part := range r.Parts {
		name := ""
		if len(r.Parts) > 1 {
			name = " — " + partName(r, part)
		}
		xs := make([]float64, len(part.Series))
		done, acc, errs, regs, p50, p90, p99 := make([]float64, len(xs)), make([]float64, len(xs)), make([]float64, len(xs)),
			make([]float64, len(xs)), make([]float64, len(xs)), make([]float64, len(xs)), make([]float64, len(xs))
		anyRegs := false
		for i, pt := range part.Series {
			xs[i] = pt.T
			done[i], acc[i], errs[i], regs[i] = pt.Done, pt.Accepted, pt.Errors, pt.Regs
			p50[i], p90[i], p99[i] = pt.P50, pt.P90, pt.P99
			anyRegs = anyRegs || pt.Regs > 0
		}
		th := &chart{title: "Throughput" + name, unit: "requests/s", xs: xs}
		th.add("pushes done/s", done)
		th.add("pushes accepted/s", acc)
		if anyRegs {
			th.add("registrations/s", regs)
		}
		if capa := part.Capacity; capa != nil {
			line := func(v float64) []float64 {
				ys := make([]float64, len(xs))
				for i := range ys {
					ys[i] = v
				}
				return ys
			}
			th.add("capacity", line(capa.PerSec))
			th.add(render.Fixed(overloadMinOfCapacity, 1)+" × capacity", line(overloadMinOfCapacity*capa.PerSec))
		}
		if r.Preset.Kind == fleet {
			if c := Compute(r); c.MedianPerSec > 0 {
				floor := make([]float64, len(xs))
				for i := range floor {
					floor[i] = fleetMinRateOfMedian * c.MedianPerSec
				}
				th.add("0.8 × median accepted/s", floor)
			}
		}
		d.chartBlock(th)
		lat := &chart{title: "Latency percentiles" + name, unit: "ms", xs: xs}
		lat.add("p50", p50)
		lat.add("p90", p90)
		lat.add("p99", p99)
		d.chartBlock(lat)
		ec := &chart{title: "Errors" + name, unit: "rejected, dropped or retried per s", xs: xs}
		ec.add("errors/s", errs)
		d.chartBlock(ec)
		sx := make([]float64, len(part.Samples))
		rss, cpu := make([]float64, len(sx)), make([]float64, len(sx))
		for i, s := range part.Samples {
			sx[i], rss[i], cpu[i] = s.T, s.RSSMiB, s.CPUPct
		}
		rc := &chart{title: "Server RSS" + name, unit: "MiB", xs: sx}
		rc.add("RSS", rss)
		d.chartBlock(rc)
		cc := &chart{title: "Server CPU" + name, unit: "% of one core", xs: sx}
		cc.add("CPU", cpu)
		d.chartBlock(cc)
	}
}

func notes(r *Result, c *Calc) []string {
	p := r.Preset
	var n []string
	if r.Changes != "" {
		n = append(n, "Scaled down: "+r.Changes+". Figures that depend on the fleet size or duration (RSS increase, loops, max devices) are those of the smaller test.")
	}
	n = append(n, "Command: `"+r.Command+"`")
	switch p.Kind {
	case stability:
		if note := loopTimeNote(r, c); note != "" {
			n = append(n, note)
		}
		n = append(n,
			"Estimated data-pushes = devices × minutes × 60 / loop time; rough avg req/s = performed pushes / total time; real loop time = total time / (performed pushes / devices).",
			"Max safe # of devices = devices / RAM utilisation: the fleet at which the OS memory would be fully used if it grew with the fleet. OS used memory = MemTotal − MemAvailable and includes everything else on the machine.",
			fmt.Sprintf("Each device pushes once per %d s at its own phase (open loop); at most %d requests are in flight at once (the emulator threads).", p.LoopTime, p.Threads))
	case fleet:
		n = append(n,
			"Issue 11's fleet test: the devices register first (a storm on kept-alive connections, not measured; the RSS before the test is that of the registered fleet), then each pushes once per loop time at its own phase (open loop), over plain HTTP with a new TCP connection per push. Latency counts from each push's intended send time, so a late send counts against the server.",
			fmt.Sprintf("At most %s pushes are in flight at once; beyond, sends wait (and are late). Rejected counts every error status, including 503/429 answers the emulator retried after their Retry-After; dropped counts pushes without an answer, not sent (device still busy or unregistered) or cut off at the end.", gi(p.Threads)),
			"Per-second throughput: accepted pushes per chart bucket, over the buckets wholly inside the schedule (the first and the last are partial and left out). RSS per device: the server's RSS at the end divided by the devices.",
			"Scaled runs (`--scale F`) keep the loop time and the duration: F × the devices and F × the pushes per second.")
	case overload:
		n = append(n,
			fmt.Sprintf("Issue 11's overload test: the devices register first (not measured); then %d workers push back to back for %s (a new connection per push, as the test's connections): the capacity is their accepted pushes per second. Then the fleet offers %s × that, open loop (each device once per interval at its own phase), for the duration; the emulator retries 503/429 answers after their Retry-After plus up to half again of random jitter (at most 5 retries), as the agent does.", p.Threads, fmtDuration(capacityTime), render.Fixed(overloadFactor, 1)),
			"Accepted per second: the median of the chart's buckets wholly inside the overload phase. Retry-After spread: every 503/429 answer of the overload phase counted by its Retry-After value.")
	case benchmark:
		n = append(n, fmt.Sprintf("Elapsed time runs from the first push to the last answer of the %d loops; registration is before it and not counted. Pushes/s = accepted pushes / elapsed (devices × loops / elapsed when all are accepted).", p.Loops),
			"Each handler-thread count is a fresh server (`--threads N`, Go's GOMAXPROCS) with a fresh database.")
	case registrar:
		n = append(n, registrarNotes(r)...)
	case peak:
		switch p.Mode {
		case peakRegister:
			n = append(n, "R = registration storm: every device registers at once, as after a server reinstall; the test ends when all have registered or the duration is over.")
		case peakData:
			n = append(n, "D = data-push storm: the fleet registered first (not measured), then pushes as fast as the threads allow for the duration.")
		case peakFull:
			n = append(n, "F = full cycle: devices register, push and receive the configuration, which the test changes every third of its duration; a device acknowledges a configuration by reporting its version in the next push, and the server then counts it as synchronized.")
		}
		n = append(n, "A peak test looks for the thread count at which requests start to be dropped and resent; run the 64, 256 and 1024 variants to find it.")
	}
	for _, part := range r.Parts {
		if part.HandlerThreads > r.Env.Threads && r.Env.Threads > 0 {
			n = append(n, fmt.Sprintf("%d handler threads on a machine with %d CPU thread(s): the extra threads only take turns; this part has no more CPU than the machine's threads, only more scheduling.", part.HandlerThreads, r.Env.Threads))
		}
	}
	if r.Setup.Local {
		n = append(n, "The emulator ran on the same machine as the server and shared its CPU: on small machines it limits the throughput it measures. Its own CPU use is in the Resources table.")
	}
	for _, part := range r.Parts {
		for _, w := range part.Emulator.Warnings {
			n = append(n, "Emulator warning ("+partName(r, part)+"): "+w)
		}
	}
	n = append(n, r.Notes...)
	return n
}

// loopTimeNote explains a real loop time that differs from the set one.
// Each device pushes at fixed times (its phase, then once per loop time;
// its registration happens inside its first push's slot and shifts
// nothing), so the figures are exact — real loop time = loop time, as
// shown — when the duration holds whole loops and every scheduled push was
// performed; otherwise the note says which pushes are missing.
func loopTimeNote(r *Result, c *Calc) string {
	p := r.Preset
	if p.LoopTime <= 0 || c.RealLoopTime <= 0 || render.Fixed(c.RealLoopTime, 0) == render.Fixed(float64(p.LoopTime), 0) {
		return ""
	}
	var aborted, skipped, unreg int64
	for _, part := range r.Parts {
		aborted += part.Push.Aborted
		skipped += part.Push.Skipped
		unreg += part.Push.Unregistered
	}
	var why []string
	if aborted > 0 {
		why = append(why, gi(int(aborted))+" cut off by the end of the test (aborted)")
	}
	if skipped > 0 {
		why = append(why, gi(int(skipped))+" not sent because the device was still busy with its previous push")
	}
	if unreg > 0 {
		why = append(why, gi(int(unreg))+" not sent because the device's registration failed")
	}
	if loops := c.TotalSec / float64(p.LoopTime); math.Abs(loops-math.Round(loops)) > 0.01 {
		why = append(why, fmt.Sprintf("the total time holds %s loops, not a whole number (the last loop is partial)", render.Fixed(loops, 2)))
	}
	if len(why) == 0 {
		why = append(why, "pushes sent late (the emulator or the server could not keep up)")
	}
	scheduled := float64(p.Devices) * c.TotalSec / float64(p.LoopTime)
	return fmt.Sprintf("The real loop time (%s s) differs from the set loop time (%d s): %s pushes were performed of about %s the total time held; total time / (performed pushes / devices) counts every push the test did not perform: %s. Each device pushes at its fixed times (its registration happens in its first push's slot and shifts nothing), so with whole loops and every push performed the two are equal.",
		render.Fixed(c.RealLoopTime, 0), p.LoopTime, gi(int(c.Performed)), gi(int(scheduled)), strings.Join(why, "; "))
}

// loadMachinesSection names the load machines a test's fleet was split
// over, with each one's share and costs (the last part's).
func loadMachinesSection(d *doc, ms []loadMachine) {
	d.h("Load machines")
	d.p("The emulated fleet was split over %d load machines (`drover perf worker`), started together; every figure of this protocol is the exact merge of their results (counts add up, latency histograms merge).", len(ms))
	t := newTable("address", "host", "CPU", "cores / threads", "RAM / MiB", "shard", "devices", "emulator CPU avg / max (cores)", "emulator RSS / MiB", "clock offset / ms")
	for _, m := range ms {
		t.row(m.Addr, m.Host, m.CPUModel, fmt.Sprintf("%d / %d", m.Cores, m.Threads), render.Fixed(m.RAMMiB, 0), m.Shard, gi(m.Devices),
			render.Fixed(m.CPUAvg, 2)+" / "+render.Fixed(m.CPUMax, 2), render.Fixed(m.RSSMiB, 1), render.Fixed(m.ClockOffsetMs, 1))
	}
	d.tab(t)
}
