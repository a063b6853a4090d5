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
