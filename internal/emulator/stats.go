package emulator

import (
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	hdr "github.com/HdrHistogram/hdrhistogram-go"

	"github.com/drover/drover/internal/emulator/results"
)

var dropNames = []string{DropTimeout, DropRefused, DropReset, DropEOF, DropNoPort, DropFDLimit, DropTLS, DropProtocol, DropCancelled, DropOther}

func dropIndex(name string) int {
	for i, n := range dropNames {
		if n == name {
			return i
		}
	}
	return len(dropNames) - 1
}

// opStats counts outcomes of one kind of operation with atomics, and
// records latencies in a sharded histogram.
type opStats struct {
	accepted, aborted, retried, rereg, newReg, late, skipped, resent, configs, unregistered atomic.Int64

	status     [600]atomic.Int64
	dropped    [10]atomic.Int64
	retryAfter [maxRetryAfterSecs + 3]atomic.Int64 // by seconds; then 120+, none
	first      atomic.Int64                        // unix ns of the first attempt
	last       atomic.Int64                        // unix ns of the last outcome
	lat        *recorder

	nodeMu sync.Mutex
	byNode map[string]*int64 // accepted, by the answer's X-Drover-Node
}

func newOpStats() *opStats { return &opStats{lat: newRecorder()} }

func (s *opStats) begin(now int64) {
	if s.first.Load() == 0 {
		s.first.CompareAndSwap(0, now)
	}
}

func (s *opStats) end(now int64) {
	for {
		l := s.last.Load()
		if now <= l || s.last.CompareAndSwap(l, now) {
			return
		}
	}
}

func (s *opStats) reject(status int) {
	if status < 0 || status >= len(s.status) {
		status = 0
	}
	s.status[status].Add(1)
}

func (s *opStats) drop(reason string) { s.dropped[dropIndex(reason)].Add(1) }

// maxRetryAfterSecs is the largest Retry-After counted by its own value.
const maxRetryAfterSecs = 119

// sawRetryAfter counts a 503 or 429 answer's Retry-After (negative: none).
func (s *opStats) sawRetryAfter(d time.Duration) {
	i := len(s.retryAfter) - 1
	if d >= 0 {
		i = min(int(d/time.Second), maxRetryAfterSecs+1)
	}
	s.retryAfter[i].Add(1)
}

// accept counts an accepted operation answered by node ("" when the
// answer named none).
func (s *opStats) accept(node []byte) {
	s.accepted.Add(1)
	if len(node) == 0 {
		return
	}
	s.nodeMu.Lock()
	if n, ok := s.byNode[string(node)]; ok {
		*n++
	} else {
		if s.byNode == nil {
			s.byNode = map[string]*int64{}
		}
		one := int64(1)
		s.byNode[string(node)] = &one
	}
	s.nodeMu.Unlock()
}

// counts returns the cumulative counts.
func (s *opStats) counts() results.Counts {
	c := results.Counts{
		Accepted: s.accepted.Load(), Aborted: s.aborted.Load(), Retried: s.retried.Load(),
		Reregistered: s.rereg.Load(), New: s.newReg.Load(), Late: s.late.Load(), Skipped: s.skipped.Load(),
		Resent: s.resent.Load(), ConfigsSeen: s.configs.Load(), Unregistered: s.unregistered.Load(),
	}
	for i := range s.status {
		if n := s.status[i].Load(); n != 0 {
			if c.Rejected == nil {
				c.Rejected = map[string]int64{}
			}
			c.Rejected[strconv.Itoa(i)] = n
		}
	}
	for i := range s.dropped {
		if n := s.dropped[i].Load(); n != 0 {
			if c.Dropped == nil {
				c.Dropped = map[string]int64{}
			}
			c.Dropped[dropNames[i]] = n
		}
	}
	for i := range s.retryAfter {
		if n := s.retryAfter[i].Load(); n != 0 {
			if c.RetryAfter == nil {
				c.RetryAfter = map[string]int64{}
			}
			key := strconv.Itoa(i)
			switch i {
			case maxRetryAfterSecs + 1:
				key = strconv.Itoa(i) + "+"
			case len(s.retryAfter) - 1:
				key = "none"
			}
			c.RetryAfter[key] = n
		}
	}
	s.nodeMu.Lock()
	for node, n := range s.byNode {
		if c.AcceptedByNode == nil {
			c.AcceptedByNode = make(map[string]int64, len(s.byNode))
		}
		c.AcceptedByNode[node] = *n
	}
	s.nodeMu.Unlock()
	return c
}

// diff returns cur − prev.
func diff(cur, prev results.Counts) results.Counts {
	d := results.Counts{
		Accepted: cur.Accepted - prev.Accepted, Aborted: cur.Aborted - prev.Aborted, Retried: cur.Retried - prev.Retried,
		Reregistered: cur.Reregistered - prev.Reregistered, New: cur.New - prev.New, Late: cur.Late - prev.Late,
		Skipped: cur.Skipped - prev.Skipped, Resent: cur.Resent - prev.Resent, ConfigsSeen: cur.ConfigsSeen - prev.ConfigsSeen,
		Unregistered: cur.Unregistered - prev.Unregistered,
	}
	d.Rejected = diffMap(cur.Rejected, prev.Rejected)
	d.Dropped = diffMap(cur.Dropped, prev.Dropped)
	d.AcceptedByNode = diffMap(cur.AcceptedByNode, prev.AcceptedByNode)
	return d
}

func diffMap(cur, prev map[string]int64) map[string]int64 {
	var out map[string]int64
	for k, v := range cur {
		if n := v - prev[k]; n != 0 {
			if out == nil {
				out = map[string]int64{}
			}
			out[k] = n
		}
	}
	return out
}

func active(c results.Counts) bool {
	return c.Done() != 0 || c.Retried != 0 || c.Late != 0 || c.Skipped != 0 || c.Unregistered != 0 || c.Reregistered != 0
}

// recorder is a latency histogram split into locked shards so that
// concurrent goroutines rarely wait for each other.
type recorder struct {
	shards []recShard
	mask   int
}

type recShard struct {
	mu sync.Mutex
	h  *hdr.Histogram
	_  [48]byte // keep shards on separate cache lines
}

func newRecorder() *recorder {
	n := 1
	for n < 2*runtime.GOMAXPROCS(0) {
		n <<= 1
	}
	r := &recorder{shards: make([]recShard, n), mask: n - 1}
	for i := range r.shards {
		r.shards[i].h = results.NewHistogram()
	}
	return r
}

func (r *recorder) record(hint int, d time.Duration) {
	us := int64(d / time.Microsecond)
	us = min(max(us, results.HistLowest), results.HistHighest)
	s := &r.shards[hint&r.mask]
	s.mu.Lock()
	s.h.RecordValue(us)
	s.mu.Unlock()
}

// drainInto moves everything recorded so far into dst.
func (r *recorder) drainInto(dst *hdr.Histogram) {
	for i := range r.shards {
		s := &r.shards[i]
		s.mu.Lock()
		if s.h.TotalCount() > 0 {
			dst.Merge(s.h)
			s.h.Reset()
		}
		s.mu.Unlock()
	}
}
