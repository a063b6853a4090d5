package perf

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"
)

func TestRegistrarCells(t *testing.T) {
	part := func(mode string, h int, ids string, rep int, accepted int64, secs, cpu float64) resultPart {
		return resultPart{Persistence: mode, HandlerThreads: h, MachineIDs: ids, Repeat: rep,
			Register: opFigures{Accepted: accepted, ElapsedSec: secs}, Before: snapshot{CPUSecs: 10}, After: snapshot{CPUSecs: 10 + cpu}}
	}
	p, ok := Lookup(RegistrarPreset)
	if !ok || p.Kind != registrar || p.Devices != 1_000_000 || p.Repeats != 2 {
		t.Fatalf("preset %+v", p)
	}
	r := &Result{Preset: p, Thresholds: defaultThresholds(), Parts: []resultPart{
		part("memory", 1, "sequential", 1, 1000, 1, 0.5),
		part("memory", 1, "random", 1, 1000, 2, 0.5),
		part("memory", 1, "sequential", 2, 1000, 1.25, 0.5),
		part("memory", 1, "random", 2, 1000, 2, 0.7),
	}}
	c := Compute(r)
	if len(c.Cells) != 2 {
		t.Fatalf("cells %+v", c.Cells)
	}
	seq, rnd := c.Cells[0], c.Cells[1]
	if seq.MachineIDs != "sequential" || len(seq.Rates) != 2 || seq.Rates[0] != 1000 || seq.Rates[1] != 800 ||
		seq.Median != 900 || seq.Min != 800 || seq.Max != 1000 || math.Abs(seq.SpreadPct-200.0/9) > 1e-9 || math.Abs(seq.CPUUs-500) > 1e-6 {
		t.Errorf("sequential cell %+v", seq)
	}
	if rnd.Median != 500 || rnd.SpreadPct != 0 || math.Abs(rnd.CPUUs-600) > 1e-6 || rnd.Accepted != 2000 {
		t.Errorf("random cell %+v", rnd)
	}
	if c.Verdict != passed || c.Accepted != 4000 {
		t.Errorf("verdict %s %v, accepted %d", c.Verdict, c.Reasons, c.Accepted)
	}
	var sum strings.Builder
	r.Command = "drover perf run Registrar-1M"
	if err := Summary(&sum, []*Result{r}); err != nil || !strings.Contains(sum.String(), "memory/1/sequential: 900 (spread 22.2 %)") {
		t.Errorf("summary %v:\n%s", err, sum.String())
	}
	if _, _, err := (override{Repeats: 3}).Apply(presets()[0]); err == nil {
		t.Error("--repeats accepted for a preset that is not a registrar test")
	}
}

// TestE2ERegistrar runs the registrar matrix at a tiny scale: every
// persistence mode × handler threads × machine-ID kind once, each on a
// fresh server.
func TestE2ERegistrar(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts servers")
	}
	p, _ := Lookup(RegistrarPreset)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// 2,000 registrations: without rate limits 200 took ~10 ms, less than
	// one tick of the server's CPU clock, and CPU per registration read 0.
	o := testOptions(t, override{Devices: 2000, Repeats: 1, Threads: 4})
	o.Persistence = "" // every mode
	r, err := Run(ctx, p, o)
	if err != nil {
		t.Fatal(err)
	}
	c := Compute(r)
	if c.Verdict != passed {
		t.Errorf("verdict %s: %v", c.Verdict, c.Reasons)
	}
	want := len(registrarPersistence) * len(p.Handlers) * len(registrarIDs)
	if len(r.Parts) != want || len(c.Cells) != want {
		t.Fatalf("%d parts, %d cells; want %d", len(r.Parts), len(c.Cells), want)
	}
	md := markdownOf(r)
	for _, cell := range c.Cells {
		if len(cell.Rates) != 1 || cell.Rates[0] <= 0 || cell.Median <= 0 || cell.Accepted != 2000 || cell.Errors != 0 || cell.CPUUs <= 0 {
			t.Errorf("cell %+v", cell)
		}
		row := "| " + cell.Persistence + " | " + handlersText(r, cell.Handlers) + " | " + cell.MachineIDs + " | "
		if !strings.Contains(md, row) {
			t.Errorf("the protocol has no row %q", row)
		}
	}
	for _, part := range r.Parts {
		if part.Push.Performed() != 0 || part.Err != "" || !part.LogReviewed {
			t.Errorf("%s: push %+v, error %q", registrarPartName(part), part.Push, part.Err)
		}
	}
	if r.Setup.Conn != "keepalive" || r.Setup.TLS {
		t.Errorf("setup %+v", r.Setup)
	}
	dir := t.TempDir()
	if _, err := WriteReports(r, dir); err != nil {
		t.Fatal(err)
	}
	back, err := LoadResult(dir + "/" + r.FileBase() + ".json")
	if err != nil || markdownOf(back) != md || !strings.Contains(htmlProtocol(back), "Registrar") {
		t.Errorf("round trip: %v", err)
	}
}

// --persistence picks the registrar test's modes (in the test's order);
// other tests take exactly one.
func TestRegistrarModes(t *testing.T) {
	reg, _ := Lookup(RegistrarPreset)
	bench, _ := Lookup("Bench-6-SSL")
	for _, c := range []struct {
		p           Preset
		persistence string
		want        string // modes joined by ",", or "error"
	}{
		{reg, "", "memory,write-through,write-back"},
		{reg, "write-back, memory", "memory,write-back"},
		{reg, "write-through", "write-through"},
		{reg, "memory,bogus", "error"},
		{reg, "ignored", "error"},
		{bench, "memory", ""},
		{bench, "", ""},
		{bench, "memory,write-back", "error"},
	} {
		modes, err := registrarModesOf(c.p, c.persistence)
		got := strings.Join(modes, ",")
		if err != nil {
			got = "error"
		}
		if got != c.want {
			t.Errorf("%s --persistence %q: %q (%v), want %q", c.p.Name, c.persistence, got, err, c.want)
		}
	}
}
