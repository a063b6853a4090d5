package perf

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// The seeds' benchmark table: C1 and C2 under 0.6.0 and 0.7.0, each row
// as % of the previous version in the same environment (seed 000: C1 49 →
// 57 MiB is 116 %, 142 → 143 pushes/s is 101 %).
func TestSummaryAcrossEnvironments(t *testing.T) {
	mk := func(version, label string, day int, rssBefore, rssAfter, pps float64) []*Result {
		s, b := seedStab(), seedBench()
		for _, r := range []*Result{s, b} {
			r.Env.DroverVersion, r.Env.Label = version, label
			r.Started = r.Started.AddDate(0, 0, day)
		}
		s.Preset.Devices = 1024
		s.Parts[0].Before.RSSMiB, s.Parts[0].After.RSSMiB = rssBefore, rssAfter
		b.Parts = b.Parts[:1]
		b.Parts[0].Push.ElapsedSec = 12000 / pps
		return []*Result{s, b}
	}
	var rs []*Result
	rs = append(rs, mk("0.7.0", "C1", 30, 37, 57, 143)...)
	rs = append(rs, mk("0.6.0", "C2", 0, 40, 54, 182)...)
	rs = append(rs, mk("0.6.0", "C1", 0, 34, 49, 142)...)
	rs = append(rs, mk("0.7.0", "C2", 30, 76, 95, 175)...)
	rs[4].Env.Cgroup = "cgroup v2 /drover-perf-1: 1 CPU, 512 MiB"
	var out bytes.Buffer
	if err := Summary(&out, rs); err != nil {
		t.Fatal(err)
	}
	s := out.String()
	for _, want := range []string{
		"| 0.6.0 | C1 | 49.0 | — | 15.00 | — | 142.00 | — |",
		"| 0.6.0 | C2 | 54.0 | — |",
		"| 0.7.0 | C1 | 57.0 | 116 | 20.00 | 133 | 143.00 | 101 |",
		"| 0.7.0 | C2 | 95.0 | 176 |",
		"| C1 | Intel Xeon E5 2.2GHz | 1 / 1 | 512 | cgroup v2 /drover-perf-1: 1 CPU, 512 MiB |",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("summary lacks %q:\n%s", want, s)
		}
	}
	if strings.Index(s, "| 0.6.0 | C2 |") > strings.Index(s, "| 0.7.0 | C1 |") {
		t.Error("versions not in the order they were measured")
	}
}

// Unlabelled results of one host name on two different machines (a VM
// rebuilt on another CPU) are two environments, each with its own hardware
// and benchmark row; on the same machine they stay one.
func TestSummarySameHostOtherHardware(t *testing.T) {
	old, newer, same := seedBench(), seedBench(), seedBench()
	for _, r := range []*Result{old, newer, same} {
		r.Env.Label, r.Env.Host, r.Env.Cores, r.Env.Threads, r.Env.RAMMiB = "", "vm", 2, 2, 24105
		r.Env.CPUModel = "AMD EPYC"
	}
	newer.Env.CPUModel, newer.Env.RAMMiB = "Intel Xeon", 24106
	newer.Started = newer.Started.Add(time.Hour)
	var out bytes.Buffer
	if err := Summary(&out, []*Result{old, newer}); err != nil {
		t.Fatal(err)
	}
	s := out.String()
	for _, want := range []string{
		"| vm [AMD EPYC, 2/2, 24 GiB] | AMD EPYC | 2 / 2 | 24,105 |",
		"| vm [Intel Xeon, 2/2, 24 GiB] | Intel Xeon | 2 / 2 | 24,106 |",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("summary lacks %q:\n%s", want, s)
		}
	}
	out.Reset()
	if err := Summary(&out, []*Result{old, same}); err != nil {
		t.Fatal(err)
	}
	if s := out.String(); !strings.Contains(s, "| vm | AMD EPYC | 2 / 2 |") || strings.Contains(s, "[AMD") {
		t.Errorf("one machine split in two:\n%s", s)
	}
}

// PeakD at 64, 256 and 1024 threads: drops begin between 256 and 1024.
func TestPeakBreakingPoint(t *testing.T) {
	mk := func(name string, dropped int64) *Result {
		r := seedPeakF()
		r.Preset, _ = Lookup(name)
		r.Command = "drover perf run " + name
		r.Started = r.Started.Add(time.Duration(r.Preset.Threads) * time.Minute)
		r.Parts[0].Push = opFigures{Accepted: 600000, ElapsedSec: 600}
		if dropped > 0 {
			r.Parts[0].Push.Dropped = map[string]int64{"timeout": dropped}
		}
		return r
	}
	rs := []*Result{mk("PeakD-1024-max", 500), mk("PeakD-64-max", 0), mk("PeakD-256-max", 0)}
	bps := breakingPoints(rs)
	if len(bps) != 1 || bps[0].BeginsAt != 1024 || bps[0].LastClean != 256 || bps[0].text() != "between 256 and 1024 threads" {
		t.Fatalf("%+v", bps)
	}
	var out bytes.Buffer
	if err := Summary(&out, rs); err != nil {
		t.Fatal(err)
	}
	if s := out.String(); !strings.Contains(s, "| PeakD | 64: 1,000/s (no drops); 256: 1,000/s (no drops); 1024: 1,000/s (drops, 0.083 % error-or-retried) | between 256 and 1024 threads |") {
		t.Errorf("peak summary:\n%s", s)
	}
	// Drops already at the lowest count; none at any count.
	d64, d256, d1024 := mk("PeakD-64-max", 0), mk("PeakD-256-max", 0), mk("PeakD-1024-max", 500)
	if bp := breakingPoints([]*Result{d1024})[0]; bp.text() != "at 1024 threads or fewer (drops at the lowest count measured)" {
		t.Errorf("%q", bp.text())
	}
	if bp := breakingPoints([]*Result{d256, d64})[0]; bp.text() != "no drops up to 256 threads" {
		t.Errorf("%q", bp.text())
	}
}

// An emulator ramp's stream: its steps and where drops began.
func TestSummaryRamp(t *testing.T) {
	ramps, err := LoadRamps("../report/testdata/ramp.jsonl", t.TempDir())
	if err != nil || len(ramps) != 1 {
		t.Fatalf("%d ramps, %v", len(ramps), err)
	}
	var out bytes.Buffer
	if err := Summary(&out, nil, ramps...); err != nil {
		t.Fatal(err)
	}
	s := out.String()
	if !strings.Contains(s, "| ramp.jsonl | loadgen | v0.0.0-test | http://127.0.0.1:8080 | 8: 400/s; 16: 700/s; 32: 900/s; 64: 880/s (drops) | between 32 and 64 workers; best clean step 32 workers at 900/s |") {
		t.Errorf("ramp summary:\n%s", s)
	}
	if strings.Contains(s, "## Environments") {
		t.Error("an environments table without perf results")
	}
}
