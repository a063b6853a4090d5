package perf

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCompareSeedVersions(t *testing.T) {
	// 0.6.0 C1: RSS 49 MiB, 15 KiB/device (15 MiB over 1024 devices is
	// 15 KiB), 142 pushes/s; 0.7.0: 57 MiB, 20 KiB/device, 143 pushes/s.
	prev, cur := seedStab(), seedStab()
	prev.Parts[0].Before.RSSMiB, prev.Parts[0].After.RSSMiB = 34, 49
	prev.Preset.Devices = 1024
	cur.Parts[0].Before.RSSMiB, cur.Parts[0].After.RSSMiB = 37, 57
	cur.Preset.Devices = 1024
	pb, cb := seedBench(), seedBench()
	pb.Parts = pb.Parts[:1]
	cb.Parts = cb.Parts[:1]
	pb.Parts[0].Push.ElapsedSec = 12000 / 142.0
	cb.Parts[0].Push.ElapsedSec = 12000 / 143.0
	var out bytes.Buffer
	if err := Compare(&out, "0.6.0", []*Result{prev, pb}, "0.7.0", []*Result{cur, cb}); err != nil {
		t.Fatal(err)
	}
	s := out.String()
	for _, want := range []string{"49.0", "57.0", "116", "15.00", "20.00", "133", "142.00", "143.00", "101",
		"RSS: acceptable; KiB per device: regression; pushes/s: success"} {
		if !strings.Contains(s, want) {
			t.Errorf("comparison lacks %q:\n%s", want, s)
		}
	}
}

func TestLoadResultsDirectory(t *testing.T) {
	dir := t.TempDir()
	if _, err := WriteReports(seedStab(), dir); err != nil {
		t.Fatal(err)
	}
	if _, err := WriteReports(seedBench(), dir); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "other.json"), []byte(`{"something":"else"}`), 0o644)
	rs, err := LoadResults(dir)
	if err != nil || len(rs) != 2 {
		t.Fatalf("%d results, %v", len(rs), err)
	}
	// The file round trip keeps every figure.
	if markdownOf(rs[0]) != markdownOf(seedBench()) || markdownOf(rs[1]) != markdownOf(seedStab()) {
		t.Error("a saved result renders differently")
	}
	if _, err := LoadResults(t.TempDir()); err == nil {
		t.Error("an empty directory: want an error")
	}
}

func TestSize(t *testing.T) {
	rs := []*Result{seedStab(), seedBench()}
	// 125.53 pushes/s lowest SSL → 100.42 safe; 10,000 devices at 200 s need 50/s.
	s, err := Size(rs, 10000, 200, true)
	if err != nil {
		t.Fatal(err)
	}
	near(t, "need", s.NeedReqPerSec, 50, 1e-9)
	near(t, "safe capacity", s.SafeCapacity, 100.424, 1e-9)
	near(t, "cpu headroom", s.CPUHeadroom, 100.424/50, 1e-9)
	// Memory: 44 MiB + 13.312 KiB × 10,000 = 174 MiB; 296 MiB were available.
	near(t, "projected", s.ProjectedMiB, 44+13.312*10000/1024, 1e-9)
	if !s.ThroughputOK || !s.MemoryOK || !s.Carries {
		t.Errorf("10,000 devices should fit: %+v", s)
	}
	// 40,000 devices at 100 s: 400 pushes/s and 520 MiB do not fit.
	s, err = Size(rs, 40000, 100, true)
	if err != nil {
		t.Fatal(err)
	}
	if s.Carries || s.ThroughputOK || s.MemoryOK {
		t.Errorf("40,000 devices at 100 s should not fit: %+v", s)
	}
	var out bytes.Buffer
	s.Write(&out)
	for _, want := range []string{"does NOT carry", "lengthen the push interval to at least 399 s", "add memory"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("sizing lacks %q:\n%s", want, out.String())
		}
	}
	if _, err := Size([]*Result{seedStab()}, 10, 200, true); err == nil {
		t.Error("no benchmark: want an error")
	}
}

func TestSummaryIndex(t *testing.T) {
	var out bytes.Buffer
	if err := Summary(&out, []*Result{seedBench(), seedStab()}); err != nil {
		t.Fatal(err)
	}
	s := out.String()
	for _, want := range []string{"| Stab-2-2 | PASSED | 1,000 devices, RSS 44.0 → 57.0 MiB", "RAM utilisation 48.05 %", "| Bench-6-SSL | PASSED |",
		"1: 125.53", "safe max 20,085 devices at 200 s", "[Stab-2-2.md](Stab-2-2.md)", "  drover perf run Bench-6-SSL\n"} {
		if !strings.Contains(s, want) {
			t.Errorf("summary lacks %q:\n%s", want, s)
		}
	}
	if strings.Index(s, "Stab-2-2 |") > strings.Index(s, "Bench-6-SSL |") {
		t.Error("not in matrix order")
	}
}
