package perf

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"time"

	"github.com/drover/drover/internal/logcat"
	"github.com/drover/drover/internal/render"
	"github.com/drover/drover/internal/render/doc"
)

// markdownOf renders r's protocol as markdownOf.
func markdownOf(r *Result) string { return protocol(r, false).Markdown() }

// htmlProtocol renders r's protocol as a self-contained HTML page with charts.
func htmlProtocol(r *Result) string { return protocol(r, true).HTML() }

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

func protocol(r *Result, charts bool) *doc.Doc {
	c := Compute(r)
	p := r.Preset
	d := doc.New("Drover performance protocol: "+r.Title(), style)
	d.Paraf("Verdict: **%s** — %s, %s to %s.", c.Verdict, kindName(p), stamp(r.Started), stamp(r.Ended))
	if r.Changes != "" {
		d.Paraf("This is a **scaled-down** run (%s): a quick look, not a protocol of the %s test itself.", r.Changes, p.Name)
	}

	d.Heading("Test specs")
	t := doc.NewTable("ID", "SSL?", "# of devices", "push/work threads", "# of loops", "# of minutes", "loop time / s", "notes")
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
	t.Row(p.Name, yesNo(p.SSL), gi(p.Devices), fmt.Sprintf("%d/%s", p.Threads, hs), loops, minutes, gi(p.LoopTime), specNote(p))
	d.Table(t)

	d.Heading("Environment")
	e := r.Env
	t = doc.NewTable("item", "value")
	if e.Label != "" {
		t.Row("environment", e.Label)
	}
	t.Row("host", e.Host)
	t.Row("CPU", e.CPUModel)
	t.Row("CPU cores / threads", fmt.Sprintf("%d / %d", e.Cores, e.Threads))
	t.Row("RAM / MiB", render.Fixed(e.RAMMiB, 0))
	if e.CPUProbeStartUS > 0 {
		t.Row("CPU probe: µs per JSON round trip on one thread of drover perf's machine, before / after", render.Fixed(e.CPUProbeStartUS, 1)+" / "+render.Fixed(e.CPUProbeEndUS, 1))
	}
	if e.Cgroup != "" {
		t.Row("server limits", e.Cgroup)
	}
	if e.Source != "" {
		t.Row("described by", e.Source)
	}
	t.Row("kernel", e.Kernel)
	t.Row("OS", e.OS)
	t.Row("Go / Drover", e.GoVersion+" / "+e.DroverVersion)
	t.Row("server", r.Setup.Target)
	t.Row("backend / persistence", r.Setup.Backend+" / "+r.Setup.Persistence)
	tlsRow := yesNo(r.Setup.TLS)
	if r.Setup.TLS && r.Setup.TLSMaxVersion != "" {
		tlsRow += fmt.Sprintf(" (devices offer up to TLS %s, key exchange %s)", r.Setup.TLSMaxVersion, r.Setup.TLSKeyExchange)
	}
	t.Row("TLS", tlsRow)
	t.Row("emulator connections", connName(r.Setup.Conn, r.Setup.TLS))
	t.Row("emulator", e.Emulator)
	if e.OpenFiles > 0 {
		t.Row("open files limit", group(int64(e.OpenFiles)))
	}
	if len(r.Setup.ServerArgs) > 0 {
		t.Row("extra server flags", "`"+strings.Join(r.Setup.ServerArgs, " ")+"`")
	}
	d.Table(t)
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

	d.Heading("Log analysis")
	logSection(d, r)

	d.Heading("Summary")
	t = doc.NewTable("item", "value")
	if p.Kind == stability || p.Kind == fleet {
		t.Row("RAM utilisation note", orNA(c.RAMGrade != "", c.RAMGrade))
		t.Row("CPU utilisation note", c.CPUGrade)
	}
	t.Row("push errors (%)", render.Fixed(c.PushErrPct, 3))
	t.Row("crashes / restarts", gi(c.Crashes))
	t.Row("Verdict", "**"+c.Verdict+"**")
	d.Table(t)

	d.Heading("Verdict")
	if len(c.Reasons) == 0 {
		d.Paraf("**%s**: every threshold below was met.", c.Verdict)
	} else {
		d.Paraf("**%s**:", c.Verdict)
		d.List(c.Reasons...)
	}
	th := r.Thresholds
	t = doc.NewTable("threshold", "value")
	switch p.Kind {
	case stability:
		t.Row("push errors (error-or-retried / performed) at most", render.Fixed(th.MaxPushErrorPct, 3)+" %")
		t.Row("ERROR entries in the server log at most", gi(th.MaxLogErrors))
		t.Row("crashes and restarts", "0")
		t.Row("OS RAM utilisation after the test at most", render.Fixed(th.MaxRAMPct, 0)+" %")
		t.Row("server RSS growth over the second half at most", render.Fixed(th.MaxLeakPct, 0)+" %")
		t.Row("RAM utilisation grades (OS used / RAM)", gradeText(th.RAMGrades))
		t.Row("CPU utilisation grades (server CPU, % of all CPU threads)", gradeText(th.CPUGrades))
	case fleet, overload, rollout:
		for _, ch := range c.Checks {
			t.Row(ch.Name, ch.Limit)
		}
		t.Row("ERROR entries in the server log at most", gi(th.MaxLogErrors))
		t.Row("crashes and restarts", "0")
	case registrar:
		t.Row("registration errors at most", render.Fixed(th.MaxPushErrorPct, 3)+" %")
		t.Row("ERROR entries in the server log at most", gi(th.MaxLogErrors))
		t.Row("crashes and restarts", "0")
	case benchmark:
		t.Row("push errors at most", render.Fixed(th.MaxPushErrorPct, 3)+" %")
		t.Row("ERROR entries in the server log at most", gi(th.MaxLogErrors))
		t.Row("crashes and restarts", "0")
	case peak:
		t.Row("FAILED", "a crash, a restart or ERROR entries in the server log")
		t.Row("LIMIT REACHED", fmt.Sprintf("dropped, resent or deferred (503/429) requests, or less than %s %% accepted", render.Fixed(th.MinAcceptedPct, 0)))
		t.Row("PASSED", "none of these at this thread count")
	}
	d.Table(t)

	if charts {
		d.Heading("Charts")
		if p.Kind == rollout && len(r.Parts) > 0 {
			rolloutCharts(d, r.Parts[0].Rollout)
		}
		chartSections(d, r)
	}

	d.Heading("Notes")
	d.List(notes(r, &c)...)
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
		return "a new connection per request, each device resuming its own TLS session (as the agent keeps it)"
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

func stabilitySections(d *doc.Doc, r *Result, c *Calc) {
	var part resultPart
	if len(r.Parts) > 0 {
		part = r.Parts[0]
	}
	machine := part.Before.Machine
	d.Heading("Resources")
	t := doc.NewTable("", "", "value")
	t.Row("HW specs", "CPU cores / threads", fmt.Sprintf("%d / %d", r.Env.Cores, r.Env.Threads))
	t.Row("", "RAM / MiB", render.Fixed(r.Env.RAMMiB, 0))
	if r.Env.CPULimit > 0 {
		t.Row("", "server CPU limit (cgroup), CPUs", render.Fixed(r.Env.CPULimit, 2))
	}
	if r.Env.MemLimitMiB > 0 {
		t.Row("", "server memory limit (cgroup), MiB", render.Fixed(r.Env.MemLimitMiB, 0))
	}
	t.Row("Pre-test", "available MiB OS", orNA(machine, render.Fixed(part.Before.AvailMiB, 0)))
	t.Row("", "used MiB OS", orNA(machine, render.Fixed(part.Before.UsedMiB, 0)))
	t.Row("", "drover RSS (MiB)", render.Fixed(c.RSSBefore, 1))
	t.Row("Post-test", "available MiB OS", orNA(part.After.Machine, render.Fixed(part.After.AvailMiB, 0)))
	t.Row("", "used MiB OS", orNA(part.After.Machine, render.Fixed(part.After.UsedMiB, 0)))
	t.Row("", "drover RSS (MiB)", render.Fixed(c.RSSAfter, 1))
	t.Row("", "avg load 15", orNA(part.After.Machine, render.Fixed(c.Load15, 2)))
	t.Row("", "avg load 15 / CPU core", orNA(part.After.Machine, render.Fixed(c.LoadPerCore, 2)))
	t.Row("", "drover CPU, avg / max (% of the CPU threads it may use)", render.Fixed(c.CPUAvgPct, 2)+" / "+render.Fixed(c.CPUMaxPct, 2))
	d.Table(t)

	d.Heading("Results")
	t = doc.NewTable("", "", "value")
	t.Row("Test numbers", "processed loops", render.Fixed(c.ProcessedLoops, 2))
	t.Row("", "total time / s", render.Fixed(c.TotalSec, 0))
	t.Row("", "real loop time / s", render.Fixed(c.RealLoopTime, 0))
	t.Row("", "estimated data-pushes", render.Fixed(c.EstPushes, 0))
	t.Row("", "performed pushes", group(c.Performed))
	t.Row("", "accepted pushes", group(c.Accepted))
	t.Row("", "estimated avg req/s", render.Fixed(c.EstReqPerSec, 2))
	t.Row("", "rough avg req/s", render.Fixed(c.RoughReqPerSec, 2))
	t.Row("", "push latency p50 / p99 / max (ms, from the intended send time)", latencyText(part.Push.LatencyMs))
	t.Row("", "late sends (more than 100 ms behind schedule)", group(part.Push.Late))
	t.Row("Errors", "data errors / retries", group(c.ErrOrRetried))
	t.Row("", "push errors (%)", render.Fixed(c.PushErrPct, 3))
	t.Row("", "crashes", gi(c.Crashes))
	t.Row("", "log entries (warnings + errors)", gi(c.LogWarnings+c.LogErrors))
	d.Table(t)
	opBreakdown(d, r)

	d.Heading("Calculations")
	t = doc.NewTable("item", "value", "formula")
	t.Row("RSS increase MiB", render.Fixed(c.RSSIncMiB, 1), "RSS after − RSS before")
	t.Row("RSS increase %", render.Fixed(c.RSSIncPct, 2), "increase / RSS before")
	t.Row("MiB per device", render.Fixed(c.MiBPerDevice, 4), "increase / devices")
	t.Row("KiB per device", render.Fixed(c.KiBPerDevice, 2), "increase × 1024 / devices")
	t.Row("RAM utilisation %", orNA(c.RAMGrade != "", render.Fixed(c.RAMUtilPct, 2)), "OS used memory after / RAM")
	t.Row("max safe # of devices", orNA(c.RAMGrade != "", gi(c.MaxSafe)), "devices / RAM utilisation")
	t.Row("RSS growth over the second half %", render.Fixed(c.LeakPct, 2), "RSS at the end / RSS at max(½ duration, 1.5 loops) − 1")
	d.Table(t)
}

// overloadSection is an overload test's capacity phase and criteria.
func overloadSection(d *doc.Doc, r *Result, c *Calc) {
	checksTable(d, "Overload test criteria", c)
	if len(r.Parts) == 0 || r.Parts[0].Capacity == nil {
		return
	}
	part := r.Parts[0]
	capa := part.Capacity
	d.Heading("Capacity and overload")
	t := doc.NewTable("phase", "value")
	t.Row("registration (not measured)", fmt.Sprintf("%s devices in %s s", group(part.Register.Accepted), render.Fixed(part.Register.ElapsedSec, 1)))
	t.Row("capacity: pushes back to back", fmt.Sprintf("%d workers, %s s: %s accepted, %s/s; rejected %s, dropped %s, retried %s",
		capa.Workers, render.Fixed(capa.Seconds, 1), group(capa.Push.Accepted), render.Fixed(capa.PerSec, 0), mapText(capa.Push.Rejected), mapText(capa.Push.Dropped), group(capa.Push.Retried)))
	t.Row("overload: offered open loop", fmt.Sprintf("%s pushes/s (%s × capacity): %s devices, each every %s ms, for %s",
		render.Fixed(capa.Offered, 0), render.Fixed(overloadFactor, 1), gi(r.Preset.Devices), render.Fixed(capa.IntervalMs, 0), fmtDuration(r.Preset.Duration)))
	t.Row("overload: accepted", fmt.Sprintf("%s pushes; median second %s/s, lowest %s/s", group(part.Push.Accepted), render.Fixed(c.MedianPerSec, 0), render.Fixed(c.MinPerSec, 0)))
	t.Row("overload: latency from the intended send p50 / p99 / max (ms)", latencyText(part.Push.LatencyMs))
	t.Row("overload: server RSS before / after (MiB)", render.Fixed(part.Before.RSSMiB, 1)+" / "+render.Fixed(part.After.RSSMiB, 1))
	d.Table(t)
	opBreakdown(d, r)
}

// fleetSection is a fleet test's criteria.
func fleetSection(d *doc.Doc, r *Result, c *Calc) {
	checksTable(d, "Fleet test criteria", c)
	overTLS := len(r.Parts) > 0 && r.Parts[0].Conns != nil && r.Parts[0].Conns.TLSFull+r.Parts[0].Conns.TLSResumed > 0
	if overTLS {
		cn := r.Parts[0].Conns
		d.Paraf("TLS handshakes during the test: %s full, %s resumed (%s full after a refused session), %s failed.",
			group(cn.TLSFull), group(cn.TLSResumed), group(cn.TLSResumeFailed), group(cn.TLSErrors))
	}
	switch first, later := render.Fixed(c.CPUPerPushFirstUS, 0), render.Fixed(c.CPUPerPushLaterUS, 0); {
	case overTLS && c.CPUPerPushLaterUS > 0:
		d.Paraf("Server CPU time per accepted push: %s µs in the first loop (each device's first connection, a full handshake), %s µs after it (resumed sessions).", first, later)
	case c.CPUPerPushLaterUS > 0:
		d.Paraf("Server CPU time per accepted push: %s µs in the first loop, %s µs after it.", first, later)
	case c.CPUPerPushFirstUS > 0:
		d.Paraf("Server CPU time per accepted push: %s µs in the first loop (the test ended before a second).", first)
	}
	if len(r.Parts) > 0 {
		reg := r.Parts[0].Register
		d.Paraf("Before the test the fleet registered (not measured, kept-alive connections): %s devices in %s s, %s rejected, %s dropped.",
			group(reg.Accepted), render.Fixed(reg.ElapsedSec, 1), group(sumMap(reg.Rejected)), group(sumMap(reg.Dropped)))
	}
}

func checksTable(d *doc.Doc, title string, c *Calc) {
	d.Heading(title)
	t := doc.NewTable("criterion", "measured", "limit", "result")
	for _, ch := range c.Checks {
		res := "pass"
		if !ch.OK {
			res = "**FAIL**"
		}
		t.Row(ch.Name, ch.Measured, ch.Limit, res)
	}
	d.Table(t)
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

func opBreakdown(d *doc.Doc, r *Result) {
	t := doc.NewTable("part", "operation", "accepted", "rejected", "dropped", "retried", "aborted at the end", "skipped / unregistered", "configs received")
	for _, part := range r.Parts {
		name := partName(r, part)
		for _, o := range []struct {
			n  string
			op opFigures
		}{{"register", part.Register}, {"push", part.Push}} {
			if o.op.Performed() == 0 && o.op.Aborted == 0 {
				continue
			}
			t.Row(name, o.n, group(o.op.Accepted), mapText(o.op.Rejected), mapText(o.op.Dropped), group(o.op.Retried),
				group(o.op.Aborted), group(o.op.Skipped)+" / "+group(o.op.Unregistered), group(o.op.ConfigsSeen))
		}
	}
	if len(t.Rows) > 0 {
		d.Table(t)
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

func rowSections(d *doc.Doc, r *Result, c *Calc) {
	p := r.Preset
	d.Heading("Resources")
	t := doc.NewTable("part", "RSS before (MiB)", "RSS after (MiB)", "server CPU avg (% of one core)", "OS used MiB after", "load 15 after", "emulator CPU (cores)")
	for _, part := range r.Parts {
		cpu := 0.0
		if dt := part.After.At.Sub(part.Before.At).Seconds(); dt > 0 {
			cpu = (part.After.CPUSecs - part.Before.CPUSecs) / dt * 100
		}
		t.Row(partName(r, part), render.Fixed(part.Before.RSSMiB, 1), render.Fixed(part.After.RSSMiB, 1), render.Fixed(cpu, 0),
			orNA(part.After.Machine, render.Fixed(part.After.UsedMiB, 0)), orNA(part.After.Machine, render.Fixed(part.After.Load15, 2)), render.Fixed(part.Emulator.CPUAvg, 2))
	}
	d.Table(t)

	d.Heading("Results")
	what := "pushes"
	if p.Kind == peak && p.Mode == peakRegister {
		what = "registrations"
	}
	t = doc.NewTable("handler threads", "elapsed time / s", "accepted "+what, what+" / s", "p50 / p99 latency (ms)", "errors (%)", "drops or retries")
	for i, row := range c.Rows {
		h := handlersText(r, row.Handlers)
		_ = i
		t.Row(h, render.Fixed(row.ElapsedSec, 2), group(row.Pushes), render.Fixed(row.PushesPerSec, 2), render.Fixed(row.P50, 1)+" / "+render.Fixed(row.P99, 1), render.Fixed(row.ErrPct, 3), yesNo(row.Broke))
	}
	d.Table(t)
	opBreakdown(d, r)
	if p.Kind == peak && p.Mode == peakFull {
		var changes int
		var seen int64
		for _, part := range r.Parts {
			changes += part.ConfigChanges
			seen += part.Push.ConfigsSeen
		}
		d.Paraf("Configuration: the profiles were changed %d time(s) during the test; devices received a new configuration %s times and report its version in their next push, which acknowledges it.", changes, group(seen))
		for _, part := range r.Parts {
			if len(part.SyncStates) > 0 {
				d.Paraf("Devices by sync state at the end: %s.", floatMapText(part.SyncStates))
			}
		}
	}

	d.Heading("Calculations")
	if p.Kind == benchmark {
		t = doc.NewTable("handler threads", "pushes / s", fmt.Sprintf("ideal max # devs (× %d s)", p.LoopTime), "rec. max # devs (20 %, 0.6.0)", "safe max # devs (80 %)")
		for _, row := range c.Rows {
			h := handlersText(r, row.Handlers)
			t.Row(h, render.Fixed(row.PushesPerSec, 2), gi(row.Ideal), gi(row.Rec020), gi(row.Safe080))
		}
		d.Table(t)
		if p.SSL {
			d.Paraf("Sizing rule applied: %s. Lowest SSL throughput of this test: %s pushes/s → ideal max %s devices, **safe max %s devices** at a %d s push interval.",
				rule080.Text, render.Fixed(c.Lowest, 2), gi(c.Ideal080), gi(c.Safe080), p.LoopTime)
		} else {
			d.Paraf("Without TLS the 0.8.0 rule does not apply (it takes the lowest SSL throughput); the table gives both rules per row: %s; and 80 %% of the row's ideal.", rule060.Text)
		}
	} else {
		t = doc.NewTable("item", "value", "formula")
		for _, row := range c.Rows {
			t.Row(what+" / s", render.Fixed(row.PushesPerSec, 2), "accepted / elapsed")
			if p.Mode != peakRegister {
				t.Row(fmt.Sprintf("ideal max # devs (× %d s)", p.LoopTime), gi(row.Ideal), "pushes/s × loop time")
			}
			t.Row("drops, resends or deferrals at "+gi(p.Threads)+" threads", yesNo(row.Broke), "dropped + resent + retried + 503/429 > 0")
		}
		d.Table(t)
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

func logSection(d *doc.Doc, r *Result) {
	reviewed := false
	for _, part := range r.Parts {
		reviewed = reviewed || part.LogReviewed
	}
	if !reviewed {
		d.Paraf("The server log was not reviewed (a running server: give `--server-log FILE` to review it).")
		return
	}
	t := doc.NewTable("part", "level", "message", "count", "first", "last", "catalogue")
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
			t.Row(partName(r, part), g.Level, g.Msg, gi(g.Count), first, last, key)
		}
	}
	if len(t.Rows) == 0 {
		d.Paraf("%s log lines reviewed: no warnings, no errors.", gi(lines))
		return
	}
	d.Paraf("%s log lines reviewed; warnings and errors grouped by level and message:", gi(lines))
	d.Table(t)
	if len(quoted) > 0 {
		d.Paraf("What they mean, from the log catalogue (docs/log-catalogue.md):")
		var items []string
		for _, q := range quoted {
			items = append(items, fmt.Sprintf("%s `%s` %q, %s times: %s Costs: %s Do: %s", q.e.Level, q.e.Key, q.e.Msg, gi(q.count), q.e.Means, q.e.Costs, q.e.Do))
		}
		d.List(items...)
	}
	if len(unknown) > 0 {
		d.Paraf("Not in the log catalogue (another server version, or a crash's output): %s.", strings.Join(unknown, "; "))
	}
}

func chartSections(d *doc.Doc, r *Result) {
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
		d.Chart(th.chart())
		lat := &chart{title: "Latency percentiles" + name, unit: "ms", xs: xs}
		lat.add("p50", p50)
		lat.add("p90", p90)
		lat.add("p99", p99)
		d.Chart(lat.chart())
		ec := &chart{title: "Errors" + name, unit: "rejected, dropped or retried per s", xs: xs}
		ec.add("errors/s", errs)
		d.Chart(ec.chart())
		sx := make([]float64, len(part.Samples))
		rss, cpu := make([]float64, len(sx)), make([]float64, len(sx))
		for i, s := range part.Samples {
			sx[i], rss[i], cpu[i] = s.T, s.RSSMiB, s.CPUPct
		}
		rc := &chart{title: "Server RSS" + name, unit: "MiB", xs: sx}
		rc.add("RSS", rss)
		d.Chart(rc.chart())
		cc := &chart{title: "Server CPU" + name, unit: "% of one core", xs: sx}
		cc.add("CPU", cpu)
		d.Chart(cc.chart())
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
			"The fleet test: the devices register first (a storm on kept-alive connections, not measured; the RSS before the test is that of the registered fleet), then each pushes once per loop time at its own phase (open loop), over plain HTTP with a new TCP connection per push. Latency counts from each push's intended send time, so a late send counts against the server.",
			fmt.Sprintf("At most %s pushes are in flight at once; beyond, sends wait (and are late). Rejected counts every error status, including 503/429 answers the emulator retried after their Retry-After; dropped counts pushes without an answer, not sent (device still busy or unregistered) or cut off at the end.", gi(p.Threads)),
			"Per-second throughput: accepted pushes per chart bucket, over the buckets wholly inside the schedule, which starts when the emulator's clock starts (after it built its devices) and lasts the duration (the first and the last bucket are partial and left out). RSS per device: the server's RSS at the end divided by the devices.",
			"Scaled runs (`--scale F`) keep the loop time and the duration: F × the devices and F × the pushes per second.")
	case overload:
		n = append(n,
			fmt.Sprintf("The overload test: the devices register first (not measured); then %d workers push back to back for %s (a new connection per push, as the test's connections): the capacity is their accepted pushes per second. Then the fleet offers %s × that, open loop (each device once per interval at its own phase), for the duration; the emulator retries 503/429 answers after their Retry-After plus up to half again of random jitter (at most 5 retries), as the agent does.", p.Threads, fmtDuration(capacityTime), render.Fixed(overloadFactor, 1)),
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
func loadMachinesSection(d *doc.Doc, ms []loadMachine) {
	d.Heading("Load machines")
	d.Paraf("The emulated fleet was split over %d load machines (`drover perf worker`), started together; every figure of this protocol is the exact merge of their results (counts add up, latency histograms merge).", len(ms))
	t := doc.NewTable("address", "host", "CPU", "cores / threads", "RAM / MiB", "shard", "devices", "emulator CPU avg / max (cores)", "emulator RSS / MiB", "clock offset / ms")
	for _, m := range ms {
		t.Row(m.Addr, m.Host, m.CPUModel, fmt.Sprintf("%d / %d", m.Cores, m.Threads), render.Fixed(m.RAMMiB, 0), m.Shard, gi(m.Devices),
			render.Fixed(m.CPUAvg, 2)+" / "+render.Fixed(m.CPUMax, 2), render.Fixed(m.RSSMiB, 1), render.Fixed(m.ClockOffsetMs, 1))
	}
	d.Table(t)
}
