package perf

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/internal/emulator"
)

func TestPresetsAreTheMatrix(t *testing.T) {
	ps := presets()
	if len(ps) != 7+8+9+5 {
		t.Fatalf("%d presets, want 29", len(ps))
	}
	want := map[string]struct {
		devices, threads int
		minutes          float64
		ssl              bool
	}{
		"Stab-2-2": {1000, 2, 120, true}, "Stab-4-2": {3000, 4, 120, true}, "Stab-8-2": {10000, 8, 120, true},
		"Stab-16-2": {30000, 16, 120, true}, "Stab-4-48": {3000, 4, 2880, true}, "Stab-8-48-top": {40000, 8, 2880, true},
		"Stab-4-672":  {3000, 4, 40320, true},
		"Bench-6-SSL": {1200, 6, 0, true}, "Bench-6-noSSL": {1200, 6, 0, false}, "Bench-12-SSL": {2400, 12, 0, true},
		"Bench-12-noSSL": {2400, 12, 0, false}, "Bench-24-SSL": {4800, 24, 0, true}, "Bench-24-noSSL": {4800, 24, 0, false},
		"Bench-48-SSL": {9600, 48, 0, true}, "Bench-48-noSSL": {9600, 48, 0, false},
		FleetPreset:     {1_000_000, 15000, 10, false}, // the fleet test
		fleetTLSPreset:  {500_000, 15000, 10, true},    // the fleet test over TLS
		"Overload-1.5x": {100_000, 64, 1, false},       // the overload test
		"Rollout-10k":   {10_000, 2000, 45, true},      // the rollout test
		RegistrarPreset: {1_000_000, 8, 0, false},      // the registrar tables
	}
	for _, m := range []string{"R", "D", "F"} {
		for _, n := range []string{"64", "256", "1024"} {
			th := map[string]int{"64": 64, "256": 256, "1024": 1024}[n]
			want["Peak"+m+"-"+n+"-max"] = struct {
				devices, threads int
				minutes          float64
				ssl              bool
			}{61440, th, 10, false}
		}
	}
	for _, p := range ps {
		w, ok := want[p.Name]
		if !ok {
			t.Errorf("unexpected preset %s", p.Name)
			continue
		}
		loop := 200
		if p.Kind == rollout {
			loop = 30
			if s := p.Rollout; s == nil || s.ArtifactMiB != 16 || s.MaxDownloads != 1000 || strings.Join(s.Waves, ",") != "1%,10%,100%" {
				t.Errorf("%s: rollout %+v", p.Name, s)
			}
		}
		if p.Devices != w.devices || p.Threads != w.threads || p.Minutes() != w.minutes || p.SSL != w.ssl || p.LoopTime != loop {
			t.Errorf("%s = %+v, want %+v", p.Name, p, w)
		}
		if p.Kind == benchmark && (p.Loops != 10 || joinInts(p.Handlers) != "1,2,4,8") {
			t.Errorf("%s: loops %d handlers %v", p.Name, p.Loops, p.Handlers)
		}
		delete(want, p.Name)
	}
	if len(want) > 0 {
		t.Errorf("missing presets %v", want)
	}
	// Over TLS each push is a new connection resuming the device's own
	// session, judged also by the server's CPU per push.
	if p, ok := Lookup(fleetTLSPreset); !ok || p.Kind != fleet || p.Conn != emulator.ConnResume || p.MaxCPUPerPushUS != 150 {
		t.Errorf("%s: %+v", fleetTLSPreset, p)
	}
	for _, p := range ps {
		if p.Name != fleetTLSPreset && (p.Conn != "" || p.MaxCPUPerPushUS != 0) {
			t.Errorf("%s: conn %q, CPU per push limit %g", p.Name, p.Conn, p.MaxCPUPerPushUS)
		}
	}
	if p, ok := Lookup("peakf-256-MAX"); !ok || p.Mode != peakFull {
		t.Errorf("lookup: %+v %v", p, ok)
	}
}

func TestOverride(t *testing.T) {
	stab, _ := Lookup("Stab-2-2")
	p, ch, err := override{Scale: 0.1}.Apply(stab)
	if err != nil || p.Devices != 100 || p.Duration != 12*time.Minute || !strings.Contains(ch, "100 devices instead of 1000") || !strings.Contains(ch, "12 min instead of 2 h") {
		t.Errorf("scale: %+v %q %v", p, ch, err)
	}
	if _, ch, _ := (override{Scale: 1}).Apply(stab); ch != "" {
		t.Errorf("scale 1 changed %q", ch)
	}
	p, ch, err = override{Devices: 50, Duration: 20 * time.Second, LoopTime: 5}.Apply(stab)
	if err != nil || p.Devices != 50 || p.Duration != 20*time.Second || p.LoopTime != 5 || !strings.Contains(ch, "loop time 5 s instead of 200 s") {
		t.Errorf("overrides: %+v %q %v", p, ch, err)
	}
	r := &Result{Preset: p, Changes: ch}
	if !strings.Contains(r.Title(), "scaled down") || r.FileBase() != "Stab-2-2-scaled" {
		t.Errorf("title %q base %q", r.Title(), r.FileBase())
	}
	// A fleet test scales its devices only: the same load per device.
	fleet, _ := Lookup(FleetPreset)
	if p, _, err := (override{Scale: 0.2}).Apply(fleet); err != nil || p.Devices != 200_000 || p.Duration != 10*time.Minute || p.LoopTime != 200 {
		t.Errorf("fleet scale: %+v %v", p, err)
	}
	bench, _ := Lookup("Bench-6-SSL")
	if _, _, err := (override{Duration: time.Minute}).Apply(bench); err == nil {
		t.Error("a benchmark has no duration: want an error")
	}
	if _, _, err := (override{Scale: 2}).Apply(bench); err == nil {
		t.Error("scale 2: want an error")
	}
	p, _, _ = override{Handlers: []int{1, 2}}.Apply(bench)
	if joinInts(p.Handlers) != "1,2" || joinInts(bench.Handlers) != "1,2,4,8" {
		t.Errorf("handlers %v, preset %v", p.Handlers, bench.Handlers)
	}
}

// --handlers with several counts is for Benchmark tests only; elsewhere it
// is refused rather than ignored.
func TestHandlersOnOneServerTest(t *testing.T) {
	for _, p := range presets() {
		if p.Kind == benchmark {
			continue
		}
		o := Options{ServerCmd: []string{"false"}}
		o.Override.Handlers = []int{1, 2}
		if _, err := Run(context.Background(), p, o); err == nil || !strings.Contains(err.Error(), "one thread count") {
			t.Fatalf("%s with --handlers 1,2: %v", p.Name, err)
		}
		return
	}
}
