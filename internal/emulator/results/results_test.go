package results

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

func TestHistJSONRoundTripAndExactMerge(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	all := NewHist()
	var parts []*Hist
	for range 3 {
		h := NewHist()
		for range 5000 {
			v := int64(r.ExpFloat64()*2000) + 1
			h.H.RecordValue(v)
			all.H.RecordValue(v)
		}
		b, err := json.Marshal(h)
		if err != nil {
			t.Fatal(err)
		}
		var back, check Hist
		if err := json.Unmarshal(b, &back); err != nil {
			t.Fatal(err)
		}
		json.Unmarshal(b, &check)
		if check.Count() != 5000 {
			t.Fatalf("decoded count %d", check.Count())
		}
		parts = append(parts, &back)
	}
	merged := &Hist{}
	for _, p := range parts {
		merged.Merge(p)
	}
	if !merged.H.Equals(all.H) {
		t.Fatalf("merged histogram differs from the histogram of all values: p99 %v vs %v", merged.Quantile(0.99), all.Quantile(0.99))
	}
	for _, p := range parts {
		if p.H != nil {
			t.Fatal("merging decoded the source histogram and kept it")
		}
	}
	if got, want := merged.Stats(), all.Stats(); got != want {
		t.Fatalf("stats %+v, want %+v", got, want)
	}
}

func TestHistRejectsGarbage(t *testing.T) {
	var h Hist
	if err := json.Unmarshal([]byte(`"AAAA"`), &h); err == nil {
		t.Fatal("garbage histogram accepted")
	}
	if err := json.Unmarshal([]byte(`null`), &h); err != nil || h.Count() != 0 {
		t.Fatalf("null: %v, count %d", err, h.Count())
	}
}

func TestQuantilesAndDistribution(t *testing.T) {
	h := NewHist()
	for i := int64(1); i <= 1000; i++ {
		h.H.RecordValue(i * 1000) // 1..1000 ms
	}
	if p := h.Quantile(0.5); p < 499*time.Millisecond || p > 501*time.Millisecond {
		t.Fatalf("p50 %v", p)
	}
	if m := h.Max(); m < 999*time.Millisecond || m > 1001*time.Millisecond {
		t.Fatalf("max %v", m)
	}
	d := h.Distribution()
	if d[0][0] != 0 || d[len(d)-1][0] != 1 {
		t.Fatalf("distribution ends: %v", d)
	}
	for i := 1; i < len(d); i++ {
		if d[i][0] <= d[i-1][0] || d[i][1] < d[i-1][1] {
			t.Fatalf("distribution not increasing at %d: %v", i, d)
		}
	}
}

func TestCounts(t *testing.T) {
	a := Counts{Accepted: 5, Rejected: map[string]int64{"503": 2, "400": 1}, Dropped: map[string]int64{"timeout": 1}, Aborted: 1, Retried: 3}
	b := Counts{Accepted: 1, Rejected: map[string]int64{"503": 1}, Unregistered: 2}
	a.Add(b)
	if a.Accepted != 6 || a.Rejected["503"] != 3 || a.RejectedTotal() != 4 || a.DroppedTotal() != 1 || a.Unregistered != 2 {
		t.Fatalf("%+v", a)
	}
	if a.Done() != 6+4+1+1 || a.Errors() != 6 || a.Rejected5xx() != 3 {
		t.Fatalf("done %d errors %d 5xx %d", a.Done(), a.Errors(), a.Rejected5xx())
	}
}

// stream builds a shard's records with latencies lat (ms), one per push.
func stream(t *testing.T, run, shard string, start time.Time, lats []int64) []byte {
	t.Helper()
	var buf bytes.Buffer
	w := NewWriter(&buf)
	w.Write(&Start{Type: TypeStart, RunID: run, Shard: shard, Started: start, Mode: "benchmark", Devices: 10, Seed: "s"})
	total := &OpSummary{Op: Op{Latency: NewHist()}, First: start, Last: start.Add(2 * time.Second)}
	for sec := range 2 {
		op := &Op{Latency: NewHist()}
		for i, l := range lats {
			if i%2 == sec {
				op.Latency.H.RecordValue(l * 1000)
				op.Accepted++
			}
		}
		total.Merge(op)
		w.Write(&Interval{Type: TypeInterval, RunID: run, Shard: shard, TS: start.Unix() + int64(sec), Dur: 1, Ops: map[string]*Op{OpPush: op}, CPU: 0.5, RSS: 1 << 20})
	}
	w.Write(&Step{Type: TypeStep, RunID: run, Shard: shard, Index: 0, Concurrency: 4, Start: start, End: start.Add(time.Second),
		Ops: map[string]*Op{OpPush: {Counts: Counts{Accepted: 3}}}})
	w.Write(&Step{Type: TypeStep, RunID: run, Shard: shard, Index: 1, Concurrency: 8, Start: start.Add(time.Second), End: start.Add(2 * time.Second),
		Ops: map[string]*Op{OpPush: {Counts: Counts{Accepted: 3, Retried: 1}}}, Broke: true})
	w.Write(&Summary{Type: TypeSummary, RunID: run, Shard: shard, Started: start, Ended: start.Add(2 * time.Second),
		Ops: map[string]*OpSummary{OpPush: total}, Resources: Resources{CPUSeconds: 1, CPUAvg: 0.5, RSSMax: 1 << 20, Cores: 2},
		Conns: Conns{Dials: 4, Requests: int64(len(lats)), MaxOpen: 4}})
	return buf.Bytes()
}

func TestMergeShards(t *testing.T) {
	start := time.Unix(1700000000, 0).UTC()
	var s Stream
	if err := s.Read(bytes.NewReader(stream(t, "r", "1/2", start, []int64{1, 2, 3, 4}))); err != nil {
		t.Fatal(err)
	}
	if err := s.Read(bytes.NewReader(stream(t, "r", "2/2", start.Add(500*time.Millisecond), []int64{10, 20, 30}))); err != nil {
		t.Fatal(err)
	}
	m, err := s.Merge()
	if err != nil {
		t.Fatal(err)
	}
	push := m.Summary.Op(OpPush)
	if push.Accepted != 7 || push.Latency.Count() != 7 {
		t.Fatalf("accepted %d, latencies %d", push.Accepted, push.Latency.Count())
	}
	if push.Latency.Max() < 30*time.Millisecond || push.Latency.Max() > 31*time.Millisecond {
		t.Fatalf("max %v", push.Latency.Max())
	}
	if !push.First.Equal(start) || !push.Last.Equal(start.Add(2500*time.Millisecond)) {
		t.Fatalf("first %v last %v", push.First, push.Last)
	}
	if len(m.Intervals) != 2 { // intervals align on wall-clock seconds
		t.Fatalf("%d intervals", len(m.Intervals))
	}
	var acc int64
	for _, iv := range m.Intervals {
		op := iv.Ops[OpPush]
		acc += op.Accepted
		if op.Latency != nil || op.Stats == nil || op.Stats.Count != op.Accepted {
			t.Fatalf("interval %d: latency kept or stats wrong: %+v", iv.TS, op.Stats)
		}
	}
	if acc != 7 {
		t.Fatalf("intervals add up to %d", acc)
	}
	if m.Summary.Conns.Dials != 8 || m.Summary.Resources.CPUSeconds != 2 || m.Summary.Resources.RSSMax != 2<<20 {
		t.Fatalf("conns %+v resources %+v", m.Summary.Conns, m.Summary.Resources)
	}
	if len(m.Steps) != 2 || m.Steps[0].Concurrency != 8 || !m.Steps[1].Broke {
		t.Fatalf("steps %+v", m.Steps)
	}
	if r := m.Summary.Ramp; r == nil || r.BreakingConcurrency != 16 || r.BestConcurrency != 8 {
		t.Fatalf("ramp %+v", m.Summary.Ramp)
	}
	if len(m.Shards) != 2 || m.Shards[0].Shard != "1/2" || len(m.Missing) != 0 {
		t.Fatalf("shards %d missing %v", len(m.Shards), m.Missing)
	}
}

func TestMergeRefusesMixedOrDuplicateShards(t *testing.T) {
	start := time.Unix(1700000000, 0)
	var s Stream
	s.Read(bytes.NewReader(stream(t, "r", "1/2", start, []int64{1})))
	s.Read(bytes.NewReader(stream(t, "r", "1/2", start, []int64{1})))
	if _, err := s.Merge(); err == nil || !strings.Contains(err.Error(), "twice") {
		t.Fatalf("duplicate shard: %v", err)
	}
	var s2 Stream
	s2.Read(bytes.NewReader(stream(t, "a", "1/2", start, []int64{1})))
	s2.Read(bytes.NewReader(stream(t, "b", "1/2", start, []int64{1})))
	if _, err := s2.Merge(); err == nil || !strings.Contains(err.Error(), "counted twice") {
		t.Fatalf("same shard of two runs: %v", err)
	}
}

func TestMissingSummary(t *testing.T) {
	start := time.Unix(1700000000, 0)
	b := stream(t, "r", "1/1", start, []int64{1})
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	var s Stream
	if err := s.Read(strings.NewReader(strings.Join(lines[:len(lines)-1], "\n"))); err != nil {
		t.Fatal(err)
	}
	m, err := s.Merge()
	if err != nil {
		t.Fatal(err)
	}
	if m.Summary != nil || len(m.Missing) != 1 {
		t.Fatalf("summary %v missing %v", m.Summary, m.Missing)
	}
}

func TestReadErrors(t *testing.T) {
	var s Stream
	if err := s.Read(strings.NewReader(`{"type":"start"}` + "\n" + `{"type":"bogus"}`)); err == nil || !strings.Contains(err.Error(), "line 2") {
		t.Fatalf("unknown type: %v", err)
	}
	if err := s.Read(strings.NewReader("not json")); err == nil {
		t.Fatal("not json accepted")
	}
	if _, err := (&Stream{}).Merge(); err == nil {
		t.Fatal("empty stream merged")
	}
}
