package report

import (
	"bytes"
	"flag"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/internal/emulator/results"

	"github.com/drover/drover/internal/render"
)

var update = flag.Bool("update", false, "rewrite testdata fixtures and golden files")

// fixtures builds deterministic result streams: a fleet run split over two
// shards, and a ramp.
func fixtures() map[string][]byte {
	out := map[string][]byte{}
	start := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	var fleet bytes.Buffer
	for k := 1; k <= 2; k++ {
		r := rand.New(rand.NewPCG(uint64(k), 7))
		w := results.NewWriter(&fleet)
		shard := []string{"", "1/2", "2/2"}[k]
		w.Write(&results.Start{Type: results.TypeStart, RunID: "fixture-fleet", Shard: shard, Version: "v0.0.0-test", Started: start,
			Mode: "fleet", Target: "https://127.0.0.1:8443", Conn: "new", Devices: 2000, ShardDevices: 1000, Seed: "drover",
			Interval: 200, Duration: 30, MaxInflight: 10000, Template: "default", Host: "loadgen-" + shard[:1], GOMAXPROCS: 2, CPUs: 2})
		push := &results.OpSummary{Op: results.Op{Latency: results.NewHist()}, First: start, Last: start.Add(30 * time.Second)}
		reg := &results.OpSummary{Op: results.Op{Latency: results.NewHist()}, First: start, Last: start.Add(29 * time.Second)}
		lag := results.NewHist()
		for sec := range 30 {
			p := &results.Op{Latency: results.NewHist()}
			g := &results.Op{Latency: results.NewHist()}
			n := 5 + r.IntN(3)
			for range n {
				v := int64(2000 + r.ExpFloat64()*3000)
				if sec == 17 {
					v *= 40 // a stall
				}
				p.Latency.H.RecordValue(v)
				lag.H.RecordValue(int64(200 + r.IntN(800)))
			}
			p.Accepted = int64(n)
			if sec == 17 {
				p.Accepted--
				p.Rejected = map[string]int64{"503": 1}
				p.Retried = 2
				p.Late = 3
			}
			if sec == 21 && k == 2 {
				p.Dropped = map[string]int64{"timeout": 1}
				p.Accepted--
			}
			g.Latency.H.RecordValue(int64(4000 + r.IntN(2000)))
			g.Accepted, g.New = 1, 1
			push.Merge(p)
			reg.Merge(g)
			w.Write(&results.Interval{Type: results.TypeInterval, RunID: "fixture-fleet", Shard: shard, TS: start.Unix() + int64(sec), Dur: 1,
				Ops: map[string]*results.Op{results.OpPush: p, results.OpRegister: g}, Inflight: 1 + sec%3, CPU: 0.05 + float64(sec%5)/100,
				RSS: int64(30+sec) << 20, MachineBusy: 0.4})
		}
		var warnings []string
		if k == 2 {
			warnings = []string{"EMULATOR IS THE BOTTLENECK: a test warning with <html> & \"quotes\""}
		}
		w.Write(&results.Summary{Type: results.TypeSummary, RunID: "fixture-fleet", Shard: shard, Started: start, Ended: start.Add(30 * time.Second),
			Ops: map[string]*results.OpSummary{results.OpPush: push, results.OpRegister: reg}, SendLag: lag,
			Conns:     results.Conns{Dials: push.Done() + reg.Done(), TLSFull: push.Done() + reg.Done(), Requests: push.Done() + reg.Done(), MaxOpen: 4},
			Resources: results.Resources{CPUSeconds: 2.5, CPUAvg: 0.08, CPUMax: 0.2, RSSMax: 60 << 20, Cores: 2, MachineBusy: 0.4},
			Warnings:  warnings})
	}
	out["fleet-2-shards"] = fleet.Bytes()

	var ramp bytes.Buffer
	w := results.NewWriter(&ramp)
	w.Write(&results.Start{Type: results.TypeStart, RunID: "fixture-ramp", Shard: "1/1", Version: "v0.0.0-test", Started: start,
		Mode: "ramp", Target: "http://127.0.0.1:8080", Conn: "keepalive", Devices: 5000, ShardDevices: 5000, Seed: "drover",
		Workers: 64, Template: "default", Host: "loadgen", GOMAXPROCS: 2, CPUs: 2})
	total := &results.OpSummary{Op: results.Op{Latency: results.NewHist()}, First: start}
	r := rand.New(rand.NewPCG(3, 3))
	var steps []*results.Step
	for i, c := range []int{8, 16, 32, 64} {
		op := &results.Op{Latency: results.NewHist()}
		n := []int{4000, 7000, 9000, 8800}[i]
		for range n {
			op.Latency.H.RecordValue(int64(float64(c) * (500 + r.ExpFloat64()*300)))
		}
		op.Accepted = int64(n)
		if c == 64 {
			op.Retried, op.Rejected = 40, map[string]int64{"503": 12}
			op.Accepted -= 12
		}
		s0 := start.Add(time.Duration(i) * 10 * time.Second)
		st := &results.Step{Type: results.TypeStep, RunID: "fixture-ramp", Shard: "1/1", Index: i, Concurrency: c, Start: s0, End: s0.Add(10 * time.Second),
			Ops: map[string]*results.Op{results.OpPush: op}, Broke: c == 64}
		steps = append(steps, st)
		for sec := range 10 {
			part := &results.Op{Counts: results.Counts{Accepted: op.Accepted / 10}, Latency: op.Latency}
			w.Write(&results.Interval{Type: results.TypeInterval, RunID: "fixture-ramp", Shard: "1/1", TS: s0.Unix() + int64(sec), Dur: 1,
				Ops: map[string]*results.Op{results.OpPush: part}, Concurrency: c, Inflight: c, CPU: 0.9, RSS: 40 << 20, MachineBusy: 1})
		}
		w.Write(st)
		total.Merge(op)
		total.Last = st.End
	}
	w.Write(&results.Summary{Type: results.TypeSummary, RunID: "fixture-ramp", Shard: "1/1", Started: start, Ended: start.Add(40 * time.Second),
		Ops: map[string]*results.OpSummary{results.OpPush: total}, Conns: results.Conns{Dials: 64, Requests: total.Done(), ReusedConns: total.Done() - 64, MaxOpen: 64},
		Resources: results.Resources{CPUSeconds: 36, CPUAvg: 0.9, CPUMax: 1.1, RSSMax: 40 << 20, Cores: 2, MachineBusy: 1},
		Ramp:      results.RampOutcome(steps, nil)})
	out["ramp"] = ramp.Bytes()
	return out
}

func TestGolden(t *testing.T) {
	if *update {
		for name, b := range fixtures() {
			if err := os.WriteFile(filepath.Join("testdata", name+".jsonl"), b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, name := range []string{"fleet-2-shards", "ramp"} {
		f, err := os.Open(filepath.Join("testdata", name+".jsonl"))
		if err != nil {
			t.Fatal(err)
		}
		var st results.Stream
		err = st.Read(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		m, err := st.Merge()
		if err != nil {
			t.Fatal(err)
		}
		for ext, render := range map[string]func(*bytes.Buffer, *results.Merged) error{
			"txt":  func(b *bytes.Buffer, m *results.Merged) error { return Text(b, m) },
			"md":   func(b *bytes.Buffer, m *results.Merged) error { return Markdown(b, m) },
			"html": func(b *bytes.Buffer, m *results.Merged) error { return HTML(b, m) },
		} {
			var got bytes.Buffer
			if err := render(&got, m); err != nil {
				t.Fatalf("%s.%s: %v", name, ext, err)
			}
			golden := filepath.Join("testdata", name+"."+ext)
			if *update {
				os.WriteFile(golden, got.Bytes(), 0o644)
				continue
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run go test -update)", err)
			}
			if !bytes.Equal(got.Bytes(), want) {
				t.Errorf("%s differs from the golden file (go test ./internal/report -update, then review the diff)\n%s", golden, firstDiff(got.String(), string(want)))
			}
		}
	}
}

func firstDiff(a, b string) string {
	al, bl := strings.Split(a, "\n"), strings.Split(b, "\n")
	for i := 0; i < len(al) && i < len(bl); i++ {
		if al[i] != bl[i] {
			return "line " + itoa(i+1) + ":\n got: " + clip(al[i]) + "\nwant: " + clip(bl[i])
		}
	}
	return "lengths differ"
}

func itoa(i int) string { return render.Rate(float64(i)) }

func clip(s string) string {
	if len(s) > 200 {
		return s[:200] + "…"
	}
	return s
}

// The fixture's figures must show up in the reports: totals of both shards,
// the stall, the warning (escaped in HTML), the ramp's breaking point.
func TestReportContent(t *testing.T) {
	fx := fixtures()
	read := func(name string) *results.Merged {
		var st results.Stream
		if err := st.Read(bytes.NewReader(fx[name])); err != nil {
			t.Fatal(err)
		}
		m, err := st.Merge()
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	m := read("fleet-2-shards")
	push := m.Summary.Op(results.OpPush)
	var txt, html bytes.Buffer
	Text(&txt, m)
	HTML(&html, m)
	if !regexp.MustCompile(`(?m)^push +` + render.Rate(float64(push.Done())) + ` +` + render.Rate(float64(push.Accepted)) + ` `).MatchString(txt.String()) {
		t.Errorf("text lacks the push totals %d/%d:\n%s", push.Done(), push.Accepted, txt.String())
	}
	for _, want := range []string{"503: 2", "timeout: 1", "!!! WARNING: shard 2/2: EMULATOR IS THE BOTTLENECK", "send lag", "2: 1/2, 2/2", "loadgen-1 ×1, loadgen-2 ×1"} {
		if !strings.Contains(txt.String(), want) {
			t.Errorf("text lacks %q", want)
		}
	}
	h := html.String()
	if strings.Contains(h, "<html> &") || !strings.Contains(h, "&lt;html&gt; &amp;") {
		t.Error("warning not escaped in HTML")
	}
	if strings.Contains(h, "http://") && strings.Count(h, "http://www.w3.org/2000/svg") != strings.Count(h, "http://") {
		t.Error("HTML refers to something outside the page")
	}
	if n := strings.Count(h, "<svg"); n != 5 {
		t.Errorf("%d plots, want 5", n)
	}
	if strings.Contains(h, "<script") {
		t.Error("the HTML report needs no script")
	}
	var md bytes.Buffer
	Markdown(&md, read("ramp"))
	if !strings.Contains(md.String(), "Breaking point: 64 workers") || !strings.Contains(md.String(), "Best step without drops, retries or 5xx: 32 workers") {
		t.Errorf("ramp outcome missing:\n%s", md.String())
	}
}

func TestFormatting(t *testing.T) {
	for d, want := range map[time.Duration]string{0: "0", 1500 * time.Nanosecond: "1.50µs", 12345 * time.Microsecond: "12.3ms",
		2 * time.Second: "2.00s", 125 * time.Second: "2m05s", 3*time.Hour + 4*time.Minute: "3h04m"} {
		if got := render.Duration(d); got != want {
			t.Errorf("render.Duration(%v) = %q, want %q", d, got, want)
		}
	}
	if render.Rate(1234.5) != "1235" || render.Rate(12.34) != "12.3" || render.Rate(1.234) != "1.23" || render.BinaryBytes(3<<20) != "3.0 MiB" {
		t.Error(render.Rate(1234.5), render.Rate(12.34), render.Rate(1.234), render.BinaryBytes(3<<20))
	}
}
