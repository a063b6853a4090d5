package perf

import (
	"bytes"
	"encoding/json"
	"sync"
	"time"

	"github.com/drover/drover/internal/emulator/results"
)

// maxBuckets bounds a chart's points: when a run outlasts them, adjacent
// buckets merge and the bucket width doubles.
const maxBuckets = 1200

// seriesSink reads the emulator's result stream (JSON lines) and keeps its
// per-second interval records as time buckets with merged histograms.
type seriesSink struct {
	mu      sync.Mutex
	start   int64 // unix second of the part's start
	width   int64 // seconds per bucket
	buf     []byte
	buckets []*bucket
	pos     map[string]float64 // by shard: where its next record starts, seconds since start
	// scheduled is when the last shard's emulator started its clock,
	// seconds since start: a fleet's schedule begins there, not at start.
	scheduled float64
}

type bucket struct {
	dur       map[string]float64 // seconds covered, by shard
	push, reg results.Op
}

func newSeriesSink(start time.Time, width time.Duration) *seriesSink {
	return &seriesSink{start: start.Unix(), width: max(1, int64(width/time.Second)), pos: map[string]float64{}}
}

func (s *seriesSink) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.buf = append(s.buf, p...)
	for {
		i := bytes.IndexByte(s.buf, '\n')
		if i < 0 {
			break
		}
		s.record(s.buf[:i])
		s.buf = s.buf[i+1:]
	}
	return len(p), nil
}

func (s *seriesSink) record(line []byte) {
	if bytes.Contains(line, []byte(`"type":"start"`)) {
		var st results.Start
		if json.Unmarshal(line, &st) == nil && !st.Started.IsZero() {
			off := float64(st.Started.UnixNano()-s.start*int64(time.Second)) / float64(time.Second)
			s.scheduled = max(s.scheduled, off)
		}
		return
	}
	if !bytes.Contains(line, []byte(`"type":"interval"`)) {
		return
	}
	var iv results.Interval
	if json.Unmarshal(line, &iv) != nil {
		return
	}
	// A record goes to the bucket of its middle: records follow each other
	// (each covers the time since the previous one), so a tick that came
	// late does not put two records in one bucket and none in the next, as
	// placing them by their whole second would.
	// Shards (load machines) each send their own records, side by side.
	pos, ok := s.pos[iv.Shard]
	if !ok {
		pos = float64(iv.TS - s.start)
	}
	mid := pos + iv.Dur/2
	s.pos[iv.Shard] = pos + iv.Dur
	idx := max(int64(mid), 0) / s.width
	for idx >= maxBuckets {
		s.halve()
		idx = max(int64(mid), 0) / s.width
	}
	for int64(len(s.buckets)) <= idx {
		s.buckets = append(s.buckets, &bucket{})
	}
	b := s.buckets[idx]
	if b.dur == nil {
		b.dur = map[string]float64{}
	}
	b.dur[iv.Shard] += iv.Dur
	b.push.Merge(iv.Ops[results.OpPush])
	b.reg.Merge(iv.Ops[results.OpRegister])
}

// halve merges adjacent buckets.
func (s *seriesSink) halve() {
	var out []*bucket
	for i := 0; i < len(s.buckets); i += 2 {
		b := s.buckets[i]
		if i+1 < len(s.buckets) {
			o := s.buckets[i+1]
			for k, v := range o.dur {
				if b.dur == nil {
					b.dur = map[string]float64{}
				}
				b.dur[k] += v
			}
			b.push.Merge(&o.push)
			b.reg.Merge(&o.reg)
		}
		out = append(out, b)
	}
	s.buckets = out
	s.width *= 2
}

// scheduleStart is when the emulators' schedule began, in seconds from the
// series' start (0 before any start record).
func (s *seriesSink) scheduleStart() float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.scheduled
}

func (s *seriesSink) points() []point {
	s.mu.Lock()
	defer s.mu.Unlock()
	var pts []point
	for i, b := range s.buckets {
		var d float64 // the shards ran side by side: the longest one's time
		for _, v := range b.dur {
			d = max(d, v)
		}
		if d <= 0 {
			d = float64(s.width)
		}
		pt := point{T: float64(int64(i) * s.width), Dur: d}
		pt.Done = float64(b.push.Done()) / d
		pt.Accepted = float64(b.push.Accepted) / d
		pt.Errors = float64(b.push.Errors()+b.push.Retried+b.reg.Errors()+b.reg.Retried) / d
		pt.Regs = float64(b.reg.Accepted) / d
		if h := b.push.Latency; h.Count() > 0 {
			pt.P50, pt.P90, pt.P99 = ms(h.Quantile(.5)), ms(h.Quantile(.9)), ms(h.Quantile(.99))
		} else if h := b.reg.Latency; h.Count() > 0 {
			pt.P50, pt.P90, pt.P99 = ms(h.Quantile(.5)), ms(h.Quantile(.9)), ms(h.Quantile(.99))
		}
		pts = append(pts, pt)
	}
	return pts
}
