// Package report renders emulator results (package results) as text,
// Markdown or a self-contained HTML page with inline SVG plots.
package report

import (
	"fmt"
	"io"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/drover/drover/internal/emulator/results"
	"github.com/drover/drover/internal/render"
	"github.com/drover/drover/internal/render/doc"
)

// Text renders m as plain text.
func Text(w io.Writer, m *results.Merged) error { return write(w, build(m, false).Text()) }

// Markdown renders m as Markdown.
func Markdown(w io.Writer, m *results.Merged) error { return write(w, build(m, false).Markdown()) }

// HTML renders m as a self-contained HTML page with plots.
func HTML(w io.Writer, m *results.Merged) error { return write(w, build(m, true).HTML()) }

func write(w io.Writer, s string) error {
	_, err := io.WriteString(w, s)
	return err
}

// build is m's report; withCharts adds the plots at the end (HTML).
func build(m *results.Merged, withCharts bool) *doc.Doc {
	d := doc.New("Drover emulator report", style)
	var meta [][2]string
	var st *results.Start
	if len(m.Starts) > 0 {
		st = m.Starts[0]
	}
	sum := m.Summary
	if st != nil {
		meta = append(meta, [2]string{"run", runIDs(m)})
		meta = append(meta, [2]string{"load model", modeText(st)})
		meta = append(meta, [2]string{"target", st.Target})
		meta = append(meta, [2]string{"connections", connText(st.Conn)})
		meta = append(meta, [2]string{"devices", fmt.Sprintf("%d (seed %q)", st.Devices, st.Seed)})
		meta = append(meta, [2]string{"shards", shardsText(m)})
		meta = append(meta, [2]string{"template", st.Template})
		meta = append(meta, [2]string{"emulator", emulatorText(m)})
	}
	if sum != nil {
		meta = append(meta, [2]string{"started", sum.Started.UTC().Format(time.RFC3339)})
		meta = append(meta, [2]string{"wall time", render.Duration(sum.Ended.Sub(sum.Started))})
	}
	d.Meta(meta)
	if len(m.Missing) > 0 {
		d.Warning(fmt.Sprintf("shards %s have no summary (still running, or killed): totals are incomplete", strings.Join(m.Missing, ", ")))
	}
	if sum == nil {
		d.Warning("no summary record: the run did not finish")
		plots(d, m, withCharts)
		return d
	}
	if sum.Err != "" {
		d.Warning("the run ended with an error: " + sum.Err)
	}
	for _, w := range sum.Warnings {
		d.Warning(w)
	}
	names := opNames(sum)
	if len(names) == 0 {
		section(d, "Outcomes", nil, "No operation was made.")
	} else {
		outcomes(d, sum, names)
		latencies(d, sum, names, st)
	}
	perSecond(d, m)
	if len(m.Steps) > 0 || sum.Ramp != nil {
		ramp(d, m)
	}
	if sum.Downloads != nil {
		downloads(d, sum)
	}
	conns(d, sum)
	resources(d, sum, st)
	if len(m.Shards) > 1 {
		shards(d, m)
	}
	plots(d, m, withCharts)
	return d
}

// section adds a heading, its table (if any), then its notes.
func section(d *doc.Doc, title string, t *doc.Table, notes ...string) {
	d.Heading(title)
	if t != nil {
		d.Table(t)
	}
	for _, n := range notes {
		d.Note(n)
	}
}

func runIDs(m *results.Merged) string {
	seen := map[string]bool{}
	var ids []string
	for _, s := range m.Starts {
		if !seen[s.RunID] {
			seen[s.RunID] = true
			ids = append(ids, s.RunID)
		}
	}
	return strings.Join(ids, ", ")
}

func modeText(st *results.Start) string {
	switch st.Mode {
	case "fleet":
		return fmt.Sprintf("fleet (open loop): each device pushes every %s at its own phase, for %s; at most %d in flight per shard",
			render.Duration(secs(st.Interval)), render.Duration(secs(st.Duration)), st.MaxInflight)
	case "benchmark":
		s := fmt.Sprintf("benchmark (closed loop): %d workers, %d immediate loops over all devices", st.Workers, st.Loops)
		if st.Duration > 0 {
			s += ", limited to " + render.Duration(secs(st.Duration))
		}
		return s
	case "ramp":
		return fmt.Sprintf("ramp (closed loop): workers rise step by step, up to %d per shard, until drops, retries or 5xx appear", st.Workers)
	}
	return st.Mode
}

func secs(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

func connText(c string) string {
	switch c {
	case "new":
		return "new: a new TCP connection (and full TLS handshake) per request"
	case "resume":
		return "resume: a new TCP connection per request, TLS session resumed"
	case "keepalive":
		return "keepalive: connections reused"
	}
	return c
}

func shardsText(m *results.Merged) string {
	if len(m.Starts) == 1 {
		return m.Starts[0].Shard
	}
	var parts []string
	for _, s := range m.Starts {
		parts = append(parts, s.Shard)
	}
	return fmt.Sprintf("%d: %s", len(m.Starts), strings.Join(parts, ", "))
}

func emulatorText(m *results.Merged) string {
	hosts := map[string]int{}
	var order []string
	for _, s := range m.Starts {
		if hosts[s.Host] == 0 {
			order = append(order, s.Host)
		}
		hosts[s.Host]++
	}
	var parts []string
	for _, h := range order {
		parts = append(parts, fmt.Sprintf("%s ×%d", h, hosts[h]))
	}
	st := m.Starts[0]
	return fmt.Sprintf("%s; %d CPUs, GOMAXPROCS %d; version %s", strings.Join(parts, ", "), st.CPUs, st.GOMAXPROCS, st.Version)
}

func opNames(sum *results.Summary) []string {
	var names []string
	for _, n := range []string{results.OpRegister, results.OpPush} {
		if sum.Ops[n] != nil {
			names = append(names, n)
		}
	}
	for _, n := range results.SortedKeys(sum.Ops) {
		if n != results.OpRegister && n != results.OpPush {
			names = append(names, n)
		}
	}
	return names
}

func outcomes(d *doc.Doc, sum *results.Summary, names []string) {
	t := &doc.Table{
		Head:  []string{"operation", "done", "accepted", "rejected", "dropped", "aborted", "retried", "elapsed", "done/s", "accepted/s"},
		Right: []bool{false, true, true, true, true, true, true, true, true, true},
	}
	var notes []string
	for _, n := range names {
		o := sum.Ops[n]
		t.Rows = append(t.Rows, []string{n, num(o.Done()), num(o.Accepted), num(o.RejectedTotal()), num(o.DroppedTotal()),
			num(o.Aborted), num(o.Retried), render.Duration(o.Elapsed()), render.Rate(o.Rate()), render.Rate(o.AcceptedRate())})
		var det []string
		if len(o.Rejected) > 0 {
			det = append(det, "rejected by status "+kv(o.Rejected))
		}
		if len(o.Dropped) > 0 {
			det = append(det, "dropped by reason "+kv(o.Dropped))
		}
		for _, f := range []struct {
			v    int64
			text string
		}{
			{o.New, "new devices (the server's count)"}, {o.Reregistered, "answered 401 and registered again"},
			{o.Late, "sent late"}, {o.Skipped, "skipped (device still busy)"}, {o.Unregistered, "not sent (registration failed)"},
			{o.Resent, "resent after a closed keep-alive connection"}, {o.ConfigsSeen, "configurations received and applied"},
		} {
			if f.v != 0 {
				det = append(det, fmt.Sprintf("%d %s", f.v, f.text))
			}
		}
		if len(det) > 0 {
			notes = append(notes, n+": "+strings.Join(det, "; ")+".")
		}
	}
	notes = append(notes, "Every operation ends once: accepted (2xx), rejected (an HTTP error status, after retries), dropped (no HTTP answer: network error or timeout) or aborted (cut off by the end of the run while waiting to retry). Retries after 503/429 honour Retry-After with backoff and jitter.")
	section(d, "Outcomes", t, notes...)
}

func kv(m map[string]int64) string {
	var parts []string
	for _, k := range results.SortedKeys(m) {
		parts = append(parts, fmt.Sprintf("%s: %d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}

func latencies(d *doc.Doc, sum *results.Summary, names []string, st *results.Start) {
	t := &doc.Table{
		Head:  []string{"latency", "count", "mean", "p50", "p90", "p99", "p99.9", "max"},
		Right: []bool{false, true, true, true, true, true, true, true},
	}
	for _, n := range names {
		t.Rows = append(t.Rows, latRow(n, sum.Ops[n].Latency.Stats()))
	}
	var notes []string
	if sum.SendLag != nil && sum.SendLag.Count() > 0 {
		t.Rows = append(t.Rows, latRow("send lag", sum.SendLag.Stats()))
		notes = append(notes, "Send lag is how far behind its schedule each push was sent.")
	}
	if st != nil && st.Mode == "fleet" {
		notes = append(notes, "Open loop: push latency counts from the intended send time, so a slow server or emulator shows in it (no coordinated omission); it includes retry waits. A push that had to register first counts from the registration's end.")
	} else {
		notes = append(notes, "Closed loop: latency counts from each operation's start and includes retry waits; a worker waits for its answer before the next send, so server stalls delay sends instead of showing as latency (coordinated omission): use fleet mode for latency.")
	}
	notes = append(notes, "Latency of accepted and rejected operations (dropped ones have none), HdrHistogram, 3 significant digits.")
	section(d, "Latency", t, notes...)
}

func latRow(name string, s results.LatStats) []string {
	return []string{name, num(s.Count), render.Duration(s.Mean), render.Duration(s.P50), render.Duration(s.P90), render.Duration(s.P99), render.Duration(s.P999), render.Duration(s.Max)}
}

// perSecond describes the spread of per-second push rates.
func perSecond(d *doc.Doc, m *results.Merged) {
	var rates []float64
	var p99s []time.Duration
	for _, iv := range m.Intervals {
		op := iv.Ops[results.OpPush]
		if iv.Dur < 0.99 || op == nil {
			continue
		}
		rates = append(rates, float64(op.Done())/iv.Dur)
		if op.Stats != nil && op.Stats.Count > 0 {
			p99s = append(p99s, op.Stats.P99)
		}
	}
	if len(rates) < 2 {
		return
	}
	sort.Float64s(rates)
	sort.Slice(p99s, func(i, j int) bool { return p99s[i] < p99s[j] })
	t := &doc.Table{Head: []string{"per second", "min", "median", "max"}, Right: []bool{false, true, true, true}}
	t.Rows = append(t.Rows, []string{"pushes done/s", render.Rate(rates[0]), render.Rate(rates[len(rates)/2]), render.Rate(rates[len(rates)-1])})
	if len(p99s) > 0 {
		t.Rows = append(t.Rows, []string{"push p99", render.Duration(p99s[0]), render.Duration(p99s[len(p99s)/2]), render.Duration(p99s[len(p99s)-1])})
	}
	section(d, "Per second", t, fmt.Sprintf("Over %d whole seconds with pushes.", len(rates)))
}

func ramp(d *doc.Doc, m *results.Merged) {
	t := &doc.Table{
		Head:  []string{"step", "workers", "done/s", "accepted/s", "p50", "p99", "max", "dropped", "retried", "5xx", "breaks"},
		Right: []bool{true, true, true, true, true, true, true, true, true, true, false},
	}
	for _, st := range m.Steps {
		o := st.Ops[results.OpPush]
		if o == nil {
			o = &results.Op{}
		}
		d := st.End.Sub(st.Start).Seconds()
		acc := 0.0
		if d > 0 {
			acc = float64(o.Accepted) / d
		}
		l := o.Latency.Stats()
		broke := ""
		if st.Broke {
			broke = "yes"
		}
		t.Rows = append(t.Rows, []string{strconv.Itoa(st.Index + 1), strconv.Itoa(st.Concurrency), render.Rate(st.Rate(results.OpPush)), render.Rate(acc),
			render.Duration(l.P50), render.Duration(l.P99), render.Duration(l.Max), num(o.DroppedTotal() + o.Aborted), num(o.Retried), num(o.Rejected5xx()), broke})
	}
	var notes []string
	if r := m.Summary.Ramp; r != nil {
		if r.BreakingConcurrency > 0 {
			notes = append(notes, fmt.Sprintf("Breaking point: %d workers (%s).", r.BreakingConcurrency, r.Reason))
		} else if r.Reason != "" {
			notes = append(notes, "No breaking point: "+r.Reason+".")
		}
		if r.BestConcurrency > 0 {
			notes = append(notes, fmt.Sprintf("Best step without drops, retries or 5xx: %d workers, %s accepted pushes/s.", r.BestConcurrency, render.Rate(r.BestRate)))
		}
	}
	section(d, "Ramp", t, notes...)
}

// downloads is the emulated firmware downloads of a rollout.
func downloads(d *doc.Doc, sum *results.Summary) {
	dl := sum.Downloads
	t := &doc.Table{Head: []string{"firmware downloads", "count"}, Right: []bool{false, true}}
	t.Rows = [][]string{
		{"offers acted on", num(dl.Started)}, {"files complete", num(dl.Completed)},
		{"attempts cut (--download-fail-rate)", num(dl.Interrupted)}, {"attempts resumed (Range)", num(dl.Resumed)},
		{"reported failed", num(dl.Failed)}, {"installed (reported the new firmware)", num(dl.Installed)},
		{"bytes received", num(dl.Bytes)}, {"downloads at once, at most", num(dl.MaxActive)},
	}
	var notes []string
	if wall := sum.Ended.Sub(sum.Started).Seconds(); wall > 0 {
		notes = append(notes, "Received "+render.SI(float64(dl.Bytes)/wall, []string{"B/s", "kB/s", "MB/s", "GB/s"})+" over the run on average.")
	}
	if dl.Time != nil && dl.Time.Count() > 0 {
		l := dl.Time.Stats()
		notes = append(notes, fmt.Sprintf("Offer to complete file: p50 %s, p99 %s, max %s.", render.Duration(l.P50), render.Duration(l.P99), render.Duration(l.Max)))
	}
	section(d, "Firmware downloads", t, notes...)
}

func conns(d *doc.Doc, sum *results.Summary) {
	c := sum.Conns
	t := &doc.Table{Head: []string{"connections", "count"}, Right: []bool{false, true}}
	t.Rows = [][]string{
		{"requests sent", num(c.Requests)}, {"on a reused connection", num(c.ReusedConns)},
		{"connections opened", num(c.Dials)}, {"connect errors", num(c.DialErrors)},
		{"TLS full handshakes", num(c.TLSFull)}, {"TLS resumed handshakes", num(c.TLSResumed)},
		{"TLS handshake errors", num(c.TLSErrors)}, {"most open at once", num(c.MaxOpen)},
	}
	if c.TLSResumeFailed > 0 {
		t.Rows = slices.Insert(t.Rows, 6, []string{"full handshakes after a refused session", num(c.TLSResumeFailed)})
	}
	section(d, "Connections", t)
}

func resources(d *doc.Doc, sum *results.Summary, st *results.Start) {
	r := sum.Resources
	t := &doc.Table{Head: []string{"emulator resources", "value"}, Right: []bool{false, true}}
	t.Rows = [][]string{
		{"CPU time", fmt.Sprintf("%.1f s", r.CPUSeconds)},
		{"CPU, average", fmt.Sprintf("%.2f cores", r.CPUAvg)},
		{"cores it may use", coresText(r, st)},
		{"CPU, busiest second", fmt.Sprintf("%.2f cores", r.CPUMax)},
		{"resident memory, most", render.BinaryBytes(r.RSSMax)},
		{"machine CPU busy, average", fmt.Sprintf("%.0f%%", r.MachineBusy*100)},
	}
	var notes []string
	if push := sum.Op(results.OpPush); push.Done() > 0 && r.CPUSeconds > 0 {
		notes = append(notes, fmt.Sprintf("%.1f µs of emulator CPU per finished operation (all work of the run included).", r.CPUSeconds*1e6/float64(push.Done()+sum.Op(results.OpRegister).Done())))
	}
	section(d, "Emulator", t, notes...)
}

func coresText(r results.Resources, st *results.Start) string {
	if st == nil || st.GOMAXPROCS == 0 || r.Cores == st.GOMAXPROCS {
		return strconv.Itoa(r.Cores)
	}
	return fmt.Sprintf("%d (GOMAXPROCS %d per process)", r.Cores, st.GOMAXPROCS)
}

func shards(d *doc.Doc, m *results.Merged) {
	t := &doc.Table{
		Head:  []string{"shard", "pushes accepted", "push errors", "push/s", "push p99", "CPU avg", "RSS max", "warnings"},
		Right: []bool{false, true, true, true, true, true, true, true},
	}
	for _, s := range m.Shards {
		p := s.Op(results.OpPush)
		t.Rows = append(t.Rows, []string{s.Shard, num(p.Accepted), num(p.Errors()), render.Rate(p.Rate()), render.Duration(p.Latency.Quantile(0.99)),
			fmt.Sprintf("%.2f", s.Resources.CPUAvg), render.BinaryBytes(s.Resources.RSSMax), strconv.Itoa(len(s.Warnings))})
	}
	section(d, "Shards", t, "Totals above add the shards' counters and merge their histograms exactly.")
}

func num(n int64) string { return strconv.FormatInt(n, 10) }
