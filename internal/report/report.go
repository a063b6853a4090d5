// Package report renders emulator results (package results) as text,
// Markdown or a self-contained HTML page with inline SVG plots.
package report

import (
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/drover/drover/internal/emulator/results"
	"github.com/drover/drover/internal/render"
)

// doc is a rendering-neutral report: text, Markdown and HTML render it.
type doc struct {
	title    string
	meta     [][2]string
	warnings []string
	sections []section
	charts   []render.Chart // HTML only
}

type section struct {
	title  string
	tables []table
	notes  []string
}

type table struct {
	head  []string
	rows  [][]string
	right []bool // right-aligned columns
}

// Text renders m as plain text.
func Text(w io.Writer, m *results.Merged) error { return renderText(w, build(m)) }

// Markdown renders m as Markdown.
func Markdown(w io.Writer, m *results.Merged) error { return renderMarkdown(w, build(m)) }

// HTML renders m as a self-contained HTML page with plots.
func HTML(w io.Writer, m *results.Merged) error {
	d := build(m)
	d.charts = charts(m)
	return renderHTML(w, d)
}

func build(m *results.Merged) *doc {
	d := &doc{title: "Drover emulator report"}
	var st *results.Start
	if len(m.Starts) > 0 {
		st = m.Starts[0]
	}
	sum := m.Summary
	if st != nil {
		d.meta = append(d.meta, [2]string{"run", runIDs(m)})
		d.meta = append(d.meta, [2]string{"load model", modeText(st)})
		d.meta = append(d.meta, [2]string{"target", st.Target})
		d.meta = append(d.meta, [2]string{"connections", connText(st.Conn)})
		d.meta = append(d.meta, [2]string{"devices", fmt.Sprintf("%d (seed %q)", st.Devices, st.Seed)})
		d.meta = append(d.meta, [2]string{"shards", shardsText(m)})
		d.meta = append(d.meta, [2]string{"template", st.Template})
		d.meta = append(d.meta, [2]string{"emulator", emulatorText(m)})
	}
	if sum != nil {
		d.meta = append(d.meta, [2]string{"started", sum.Started.UTC().Format(time.RFC3339)})
		d.meta = append(d.meta, [2]string{"wall time", render.Duration(sum.Ended.Sub(sum.Started))})
	}
	if len(m.Missing) > 0 {
		d.warnings = append(d.warnings, fmt.Sprintf("shards %s have no summary (still running, or killed): totals are incomplete", strings.Join(m.Missing, ", ")))
	}
	if sum == nil {
		d.warnings = append(d.warnings, "no summary record: the run did not finish")
		return d
	}
	if sum.Err != "" {
		d.warnings = append(d.warnings, "the run ended with an error: "+sum.Err)
	}
	d.warnings = append(d.warnings, sum.Warnings...)
	names := opNames(sum)
	if len(names) == 0 {
		d.sections = append(d.sections, section{title: "Outcomes", notes: []string{"No operation was made."}})
	} else {
		d.sections = append(d.sections, outcomes(sum, names), latencies(sum, names, st))
	}
	if s, ok := perSecond(m); ok {
		d.sections = append(d.sections, s)
	}
	if len(m.Steps) > 0 || sum.Ramp != nil {
		d.sections = append(d.sections, ramp(m))
	}
	if sum.Downloads != nil {
		d.sections = append(d.sections, downloads(sum))
	}
	d.sections = append(d.sections, conns(sum), resources(sum, st))
	if len(m.Shards) > 1 {
		d.sections = append(d.sections, shards(m))
	}
	return d
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

func outcomes(sum *results.Summary, names []string) section {
	t := table{
		head:  []string{"operation", "done", "accepted", "rejected", "dropped", "aborted", "retried", "elapsed", "done/s", "accepted/s"},
		right: []bool{false, true, true, true, true, true, true, true, true, true},
	}
	var notes []string
	for _, n := range names {
		o := sum.Ops[n]
		t.rows = append(t.rows, []string{n, num(o.Done()), num(o.Accepted), num(o.RejectedTotal()), num(o.DroppedTotal()),
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
	return section{title: "Outcomes", tables: []table{t}, notes: notes}
}

func kv(m map[string]int64) string {
	var parts []string
	for _, k := range results.SortedKeys(m) {
		parts = append(parts, fmt.Sprintf("%s: %d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}

func latencies(sum *results.Summary, names []string, st *results.Start) section {
	t := table{
		head:  []string{"latency", "count", "mean", "p50", "p90", "p99", "p99.9", "max"},
		right: []bool{false, true, true, true, true, true, true, true},
	}
	for _, n := range names {
		t.rows = append(t.rows, latRow(n, sum.Ops[n].Latency.Stats()))
	}
	var notes []string
	if sum.SendLag != nil && sum.SendLag.Count() > 0 {
		t.rows = append(t.rows, latRow("send lag", sum.SendLag.Stats()))
		notes = append(notes, "Send lag is how far behind its schedule each push was sent.")
	}
	if st != nil && st.Mode == "fleet" {
		notes = append(notes, "Open loop: push latency counts from the intended send time, so a slow server or emulator shows in it (no coordinated omission); it includes retry waits. A push that had to register first counts from the registration's end.")
	} else {
		notes = append(notes, "Closed loop: latency counts from each operation's start and includes retry waits; a worker waits for its answer before the next send, so server stalls delay sends instead of showing as latency (coordinated omission): use fleet mode for latency.")
	}
	notes = append(notes, "Latency of accepted and rejected operations (dropped ones have none), HdrHistogram, 3 significant digits.")
	return section{title: "Latency", tables: []table{t}, notes: notes}
}

func latRow(name string, s results.LatStats) []string {
	return []string{name, num(s.Count), render.Duration(s.Mean), render.Duration(s.P50), render.Duration(s.P90), render.Duration(s.P99), render.Duration(s.P999), render.Duration(s.Max)}
}

// perSecond describes the spread of per-second push rates.
func perSecond(m *results.Merged) (section, bool) {
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
		return section{}, false
	}
	sort.Float64s(rates)
	sort.Slice(p99s, func(i, j int) bool { return p99s[i] < p99s[j] })
	t := table{head: []string{"per second", "min", "median", "max"}, right: []bool{false, true, true, true}}
	t.rows = append(t.rows, []string{"pushes done/s", render.Rate(rates[0]), render.Rate(rates[len(rates)/2]), render.Rate(rates[len(rates)-1])})
	if len(p99s) > 0 {
		t.rows = append(t.rows, []string{"push p99", render.Duration(p99s[0]), render.Duration(p99s[len(p99s)/2]), render.Duration(p99s[len(p99s)-1])})
	}
	return section{title: "Per second", tables: []table{t}, notes: []string{fmt.Sprintf("Over %d whole seconds with pushes.", len(rates))}}, true
}

func ramp(m *results.Merged) section {
	t := table{
		head:  []string{"step", "workers", "done/s", "accepted/s", "p50", "p99", "max", "dropped", "retried", "5xx", "breaks"},
		right: []bool{true, true, true, true, true, true, true, true, true, true, false},
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
		t.rows = append(t.rows, []string{strconv.Itoa(st.Index + 1), strconv.Itoa(st.Concurrency), render.Rate(st.Rate(results.OpPush)), render.Rate(acc),
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
	return section{title: "Ramp", tables: []table{t}, notes: notes}
}

// downloads is the emulated firmware downloads of a rollout.
func downloads(sum *results.Summary) section {
	dl := sum.Downloads
	t := table{head: []string{"firmware downloads", "count"}, right: []bool{false, true}}
	t.rows = [][]string{
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
	return section{title: "Firmware downloads", tables: []table{t}, notes: notes}
}

func conns(sum *results.Summary) section {
	c := sum.Conns
	t := table{head: []string{"connections", "count"}, right: []bool{false, true}}
	t.rows = [][]string{
		{"requests sent", num(c.Requests)}, {"on a reused connection", num(c.ReusedConns)},
		{"connections opened", num(c.Dials)}, {"connect errors", num(c.DialErrors)},
		{"TLS full handshakes", num(c.TLSFull)}, {"TLS resumed handshakes", num(c.TLSResumed)},
		{"TLS handshake errors", num(c.TLSErrors)}, {"most open at once", num(c.MaxOpen)},
	}
	return section{title: "Connections", tables: []table{t}}
}

func resources(sum *results.Summary, st *results.Start) section {
	r := sum.Resources
	t := table{head: []string{"emulator resources", "value"}, right: []bool{false, true}}
	t.rows = [][]string{
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
	return section{title: "Emulator", tables: []table{t}, notes: notes}
}

func coresText(r results.Resources, st *results.Start) string {
	if st == nil || st.GOMAXPROCS == 0 || r.Cores == st.GOMAXPROCS {
		return strconv.Itoa(r.Cores)
	}
	return fmt.Sprintf("%d (GOMAXPROCS %d per process)", r.Cores, st.GOMAXPROCS)
}

func shards(m *results.Merged) section {
	t := table{
		head:  []string{"shard", "pushes accepted", "push errors", "push/s", "push p99", "CPU avg", "RSS max", "warnings"},
		right: []bool{false, true, true, true, true, true, true, true},
	}
	for _, s := range m.Shards {
		p := s.Op(results.OpPush)
		t.rows = append(t.rows, []string{s.Shard, num(p.Accepted), num(p.Errors()), render.Rate(p.Rate()), render.Duration(p.Latency.Quantile(0.99)),
			fmt.Sprintf("%.2f", s.Resources.CPUAvg), render.BinaryBytes(s.Resources.RSSMax), strconv.Itoa(len(s.Warnings))})
	}
	return section{title: "Shards", tables: []table{t}, notes: []string{"Totals above add the shards' counters and merge their histograms exactly."}}
}

// --- formatting ---

func num(n int64) string { return strconv.FormatInt(n, 10) }

// --- text and Markdown ---

func renderText(w io.Writer, d *doc) error {
	var b strings.Builder
	b.WriteString(d.title + "\n" + strings.Repeat("=", len(d.title)) + "\n\n")
	width := 0
	for _, kv := range d.meta {
		width = max(width, len(kv[0])+1)
	}
	for _, kv := range d.meta {
		fmt.Fprintf(&b, "%-*s  %s\n", width, kv[0]+":", kv[1])
	}
	if len(d.warnings) > 0 {
		b.WriteString("\n")
		for _, w := range d.warnings {
			b.WriteString("!!! WARNING: " + w + "\n")
		}
	}
	for _, s := range d.sections {
		b.WriteString("\n" + s.title + "\n" + strings.Repeat("-", len([]rune(s.title))) + "\n")
		for _, t := range s.tables {
			textTable(&b, t)
		}
		for _, n := range s.notes {
			b.WriteString(wrap(n, 100) + "\n")
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func textTable(b *strings.Builder, t table) {
	widths := make([]int, len(t.head))
	for i, h := range t.head {
		widths[i] = len([]rune(h))
	}
	for _, r := range t.rows {
		for i, c := range r {
			widths[i] = max(widths[i], len([]rune(c)))
		}
	}
	line := func(cells []string) {
		var parts []string
		for i, c := range cells {
			pad := strings.Repeat(" ", widths[i]-len([]rune(c)))
			if t.right[i] {
				parts = append(parts, pad+c)
			} else {
				parts = append(parts, c+pad)
			}
		}
		b.WriteString(strings.TrimRight(strings.Join(parts, "  "), " ") + "\n")
	}
	line(t.head)
	var rule []string
	for _, w := range widths {
		rule = append(rule, strings.Repeat("-", w))
	}
	b.WriteString(strings.Join(rule, "  ") + "\n")
	for _, r := range t.rows {
		line(r)
	}
}

func wrap(s string, width int) string {
	var out, line []string
	n := 0
	for _, word := range strings.Fields(s) {
		if n > 0 && n+1+len([]rune(word)) > width {
			out = append(out, strings.Join(line, " "))
			line, n = nil, 0
		}
		if n > 0 {
			n++
		}
		line = append(line, word)
		n += len([]rune(word))
	}
	if len(line) > 0 {
		out = append(out, strings.Join(line, " "))
	}
	return strings.Join(out, "\n")
}

func renderMarkdown(w io.Writer, d *doc) error {
	blocks := []string{"# " + d.title}
	var meta []string
	for _, kv := range d.meta {
		meta = append(meta, fmt.Sprintf("- **%s:** %s", kv[0], mdEscape(kv[1])))
	}
	blocks = append(blocks, strings.Join(meta, "\n"))
	for _, w := range d.warnings {
		blocks = append(blocks, "> **WARNING:** "+mdEscape(w))
	}
	for _, s := range d.sections {
		blocks = append(blocks, "## "+s.title)
		for _, t := range s.tables {
			var b strings.Builder
			b.WriteString("| " + strings.Join(mdCells(t.head), " | ") + " |\n|")
			for i := range t.head {
				if t.right[i] {
					b.WriteString("---:|")
				} else {
					b.WriteString("---|")
				}
			}
			for _, r := range t.rows {
				b.WriteString("\n| " + strings.Join(mdCells(r), " | ") + " |")
			}
			blocks = append(blocks, b.String())
		}
		for _, n := range s.notes {
			blocks = append(blocks, mdEscape(n))
		}
	}
	_, err := io.WriteString(w, strings.Join(blocks, "\n\n")+"\n")
	return err
}

func mdCells(cells []string) []string {
	out := make([]string, len(cells))
	for i, c := range cells {
		out[i] = mdEscape(c)
	}
	return out
}

var mdReplacer = strings.NewReplacer("|", `\|`, "*", `\*`, "_", `\_`, "<", "&lt;", ">", "&gt;")

func mdEscape(s string) string { return mdReplacer.Replace(s) }
