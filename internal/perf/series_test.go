package perf

import (
	"bytes"
	"testing"
	"time"

	"github.com/drover/drover/internal/emulator/results"
)

func TestSeriesSinkBucketsAndHalves(t *testing.T) {
	start := time.Unix(1_000_000, 0)
	var stream bytes.Buffer
	w := results.NewWriter(&stream)
	w.Write(&results.Start{Type: results.TypeStart, RunID: "r", Shard: "1/1"})
	for s := 0; s < 10; s++ {
		h := results.NewHist()
		h.H.RecordValue(int64(1000 * (s + 1))) // (s+1) ms
		w.Write(&results.Interval{Type: results.TypeInterval, TS: start.Unix() + int64(s), Dur: 1, Ops: map[string]*results.Op{
			results.OpPush: {Counts: results.Counts{Accepted: 10, Dropped: map[string]int64{"timeout": int64(s % 2)}}, Latency: h},
		}})
	}
	sink := newSeriesSink(start, 2*time.Second)
	b := stream.Bytes()
	for i := 0; i < len(b); i += 97 { // odd chunks
		sink.Write(b[i:min(i+97, len(b))])
	}
	pts := sink.points()
	if len(pts) != 5 {
		t.Fatalf("%d points, want 5 of 2 s", len(pts))
	}
	p := pts[1] // seconds 2 and 3
	if p.T != 2 || p.Accepted != 10 || p.Done != 10.5 || p.Errors != 0.5 || p.P99 < 3.9 || p.P99 > 4.1 {
		t.Errorf("point %+v", p)
	}
	// Beyond maxBuckets the width doubles.
	sink.halve()
	if pts := sink.points(); len(pts) != 3 || pts[1].T != 4 || pts[0].Accepted != 10 {
		t.Errorf("halved %+v", pts)
	}
}

// A late tick (a record of 1.6 s, then one of 0.4 s) leaves no bucket
// empty: records go to the bucket of their middle.
func TestSeriesSinkLateTick(t *testing.T) {
	start := time.Unix(2_000_000, 0)
	var stream bytes.Buffer
	w := results.NewWriter(&stream)
	durs := []float64{1, 1, 1.6, 0.4, 1, 1}
	ts := start.Unix()
	pos := 0.0
	for _, d := range durs {
		w.Write(&results.Interval{Type: results.TypeInterval, TS: ts, Dur: d, Ops: map[string]*results.Op{
			results.OpPush: {Counts: results.Counts{Accepted: int64(d * 10)}}}})
		pos += d
		ts = start.Unix() + int64(pos) // the second the next tick fell in
	}
	sink := newSeriesSink(start, time.Second)
	sink.Write(stream.Bytes())
	for i, p := range sink.points() {
		if p.Accepted < 9.9 || p.Accepted > 10.1 {
			t.Errorf("bucket %d: %+v", i, p)
		}
	}
}

// The emulator builds its devices before its clock starts (3.6 s here): the
// buckets before that are empty and are not part of the schedule, whose
// seconds the fleet test's lowest-second criterion judges.
func TestSeriesScheduleStart(t *testing.T) {
	start := time.Unix(3_000_000, 0)
	var stream bytes.Buffer
	w := results.NewWriter(&stream)
	w.Write(&results.Start{Type: results.TypeStart, RunID: "r", Shard: "1/1", Started: start.Add(3600 * time.Millisecond)})
	w.Write(&results.Interval{Type: results.TypeInterval, TS: start.Unix() + 3, Dur: 0.4, Ops: map[string]*results.Op{
		results.OpPush: {Counts: results.Counts{Accepted: 40}}}})
	for s := 4; s < 14; s++ {
		w.Write(&results.Interval{Type: results.TypeInterval, TS: start.Unix() + int64(s), Dur: 1, Ops: map[string]*results.Op{
			results.OpPush: {Counts: results.Counts{Accepted: 100}}}})
	}
	sink := newSeriesSink(start, time.Second)
	sink.Write(stream.Bytes())
	if got := sink.scheduleStart(); got < 3.59 || got > 3.61 {
		t.Fatalf("schedule start %v, want 3.6", got)
	}
	pts := sink.points()
	rates := completeSeconds(pts, sink.scheduleStart(), 8)
	if len(rates) != 7 {
		t.Fatalf("%d complete seconds %v, want 7 (seconds 4 to 10)", len(rates), rates)
	}
	for _, r := range rates {
		if r != 100 {
			t.Errorf("rates %v: a second before or after the schedule counted", rates)
			break
		}
	}
	// Counted from the series' start, the empty seconds before the clock
	// would count as seconds with nothing accepted.
	if old := completeSeconds(pts, 0, 8); len(old) == 0 || old[0] != 0 {
		t.Errorf("from the series' start: %v", old)
	}
}
