// Package results defines the emulator's result stream: JSON lines with a
// start record, one interval record per second, optional ramp step records
// and a final summary per shard. Streams of several shards (processes or
// machines) merge exactly: counters add up and latency histograms merge.
package results

import (
	"bufio"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"sort"
	"strconv"
	"time"

	hdr "github.com/HdrHistogram/hdrhistogram-go"
)

// Histogram geometry shared by every recorder, so that all merge exactly:
// microseconds from 1 µs to 1 h, 3 significant digits.
const (
	HistLowest  = 1
	HistHighest = int64(time.Hour / time.Microsecond)
	HistSigFigs = 3
)

// NewHistogram returns an empty latency histogram in microseconds.
func NewHistogram() *hdr.Histogram { return hdr.New(HistLowest, HistHighest, HistSigFigs) }

// Hist is a latency histogram (µs) that travels as base64 of HdrHistogram's
// compressed V2 encoding, readable by other HdrHistogram implementations.
// A decoded histogram takes ~190 KB, so a Hist read from a stream keeps
// only its encoding and decodes on use.
type Hist struct {
	H   *hdr.Histogram
	raw []byte // encoding, when H is not decoded yet
}

// NewHist returns an empty Hist.
func NewHist() *Hist { return &Hist{H: NewHistogram()} }

// MarshalJSON encodes the histogram.
func (h *Hist) MarshalJSON() ([]byte, error) {
	if h == nil || (h.H == nil && h.raw == nil) {
		return []byte("null"), nil
	}
	b := h.raw
	if h.H != nil {
		var err error
		if b, err = h.H.Encode(hdr.V2CompressedEncodingCookieBase); err != nil {
			return nil, err
		}
	}
	return json.Marshal(base64.StdEncoding.EncodeToString(b))
}

// UnmarshalJSON checks and keeps the encoding.
func (h *Hist) UnmarshalJSON(b []byte) error {
	h.H, h.raw = nil, nil
	if string(b) == "null" {
		return nil
	}
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	raw, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return fmt.Errorf("histogram: %w", err)
	}
	if _, err := decodeHist(raw); err != nil {
		return err
	}
	h.raw = raw
	return nil
}

func decodeHist(raw []byte) (*hdr.Histogram, error) {
	d, err := hdr.Decode(raw)
	if err != nil {
		return nil, fmt.Errorf("histogram: %w", err)
	}
	if d.LowestTrackableValue() == HistLowest && d.HighestTrackableValue() == HistHighest && d.SignificantFigures() == HistSigFigs {
		return d, nil
	}
	// Re-home into the shared geometry so that merges never drop values.
	h := NewHistogram()
	if dropped := h.Merge(d); dropped != 0 {
		return nil, fmt.Errorf("histogram: %d values outside 1 µs..1 h", dropped)
	}
	return h, nil
}

// hist returns the decoded histogram (nil when empty).
func (h *Hist) hist() *hdr.Histogram {
	if h == nil {
		return nil
	}
	if h.H == nil && h.raw != nil {
		d, err := decodeHist(h.raw)
		if err != nil { // checked when read; cannot happen
			panic(err)
		}
		h.H, h.raw = d, nil
	}
	return h.H
}

// Merge adds o into h. A still encoded o is decoded without keeping the
// result in o.
func (h *Hist) Merge(o *Hist) {
	if o == nil || (o.H == nil && o.raw == nil) {
		return
	}
	if h.hist() == nil {
		if o.H != nil {
			h.H = o.H.Clone()
		} else if d, err := decodeHist(o.raw); err == nil {
			h.H = d
		}
		return
	}
	oh := o.H
	if oh == nil {
		var err error
		if oh, err = decodeHist(o.raw); err != nil {
			return // checked when read
		}
	}
	h.H.Merge(oh)
}

// Count returns the number of recorded values.
func (h *Hist) Count() int64 {
	if hh := h.hist(); hh != nil {
		return hh.TotalCount()
	}
	return 0
}

// Quantile returns the value at q (0..1) as a duration; 0 when empty.
func (h *Hist) Quantile(q float64) time.Duration {
	if h.Count() == 0 {
		return 0
	}
	if q >= 1 {
		return time.Duration(h.H.Max()) * time.Microsecond
	}
	return time.Duration(h.H.ValueAtQuantile(q*100)) * time.Microsecond
}

// Max returns the largest recorded value (to histogram precision).
func (h *Hist) Max() time.Duration { return h.Quantile(1) }

// Mean returns the mean recorded value.
func (h *Hist) Mean() time.Duration {
	if h.Count() == 0 {
		return 0
	}
	return time.Duration(h.H.Mean() * float64(time.Microsecond))
}

// LatStats are the usual latency figures of a histogram.
type LatStats struct {
	Count                          int64
	Mean, P50, P90, P99, P999, Max time.Duration
}

// Stats computes LatStats.
func (h *Hist) Stats() LatStats {
	if h.Count() == 0 {
		return LatStats{}
	}
	return LatStats{Count: h.Count(), Mean: h.Mean(), P50: h.Quantile(0.5), P90: h.Quantile(0.9),
		P99: h.Quantile(0.99), P999: h.Quantile(0.999), Max: h.Max()}
}

// Distribution returns (quantile, latency) points for a percentile plot:
// quantiles 0, 0.5, 0.75, 0.875, … up to 1 − 1/10⁶ or the histogram's count,
// then 1 (the maximum).
func (h *Hist) Distribution() [][2]float64 {
	n := h.Count()
	if n == 0 {
		return nil
	}
	var pts [][2]float64
	for i := 0; i <= 40; i++ {
		q := 1 - math.Pow(0.5, float64(i)/2)
		if i > 0 && (1-q)*float64(n) < 1 {
			break
		}
		pts = append(pts, [2]float64{q, float64(h.Quantile(q)) / float64(time.Millisecond)})
	}
	return append(pts, [2]float64{1, float64(h.Max()) / float64(time.Millisecond)})
}

// Counts are the outcomes of one kind of operation (push or register).
// Every operation ends in exactly one of Accepted, Rejected (by HTTP status),
// Dropped (by reason: no HTTP answer) or Aborted (cut off by the end of the
// run while waiting to retry). Retried, Reregistered, Late and Resent
// count events along the way; Skipped and Unregistered count pushes that
// were never sent.
type Counts struct {
	Accepted     int64            `json:"accepted"`
	Rejected     map[string]int64 `json:"rejected,omitempty"` // by status code
	Dropped      map[string]int64 `json:"dropped,omitempty"`  // by reason
	Aborted      int64            `json:"aborted,omitempty"`
	Retried      int64            `json:"retried,omitempty"`      // attempts repeated after 503/429
	Reregistered int64            `json:"reregistered,omitempty"` // pushes answered 401 whose device registered again
	New          int64            `json:"new,omitempty"`          // registrations the server called new
	Late         int64            `json:"late,omitempty"`         // sends that started later than intended
	Skipped      int64            `json:"skipped,omitempty"`      // fleet pushes not sent: device still busy a whole interval later
	Resent       int64            `json:"resent,omitempty"`       // requests sent again after a kept-alive connection turned out closed
	ConfigsSeen  int64            `json:"configs,omitempty"`      // answers that carried a new configuration
	Unregistered int64            `json:"unregistered,omitempty"` // pushes not sent: the device could not register
	// AcceptedByNode splits Accepted by the X-Drover-Node header of the
	// answer (servers started with --node-name; docs/cluster.md).
	AcceptedByNode map[string]int64 `json:"accepted_by_node,omitempty"`
	// RetryAfter counts the 503 and 429 answers by their Retry-After in
	// seconds ("120+" and above, "none" without one): how the server
	// spreads its clients' returns.
	RetryAfter map[string]int64 `json:"retry_after,omitempty"`
}

// RejectedTotal sums Rejected.
func (c *Counts) RejectedTotal() int64 { return sum(c.Rejected) }

// DroppedTotal sums Dropped.
func (c *Counts) DroppedTotal() int64 { return sum(c.Dropped) }

// Done is the number of finished operations (every final outcome).
func (c *Counts) Done() int64 {
	return c.Accepted + c.RejectedTotal() + c.DroppedTotal() + c.Aborted
}

// Errors is every finished operation that was not accepted.
func (c *Counts) Errors() int64 { return c.Done() - c.Accepted }

// Rejected5xx counts rejections with a 5xx status.
func (c *Counts) Rejected5xx() int64 {
	var n int64
	for k, v := range c.Rejected {
		if len(k) == 3 && k[0] == '5' {
			n += v
		}
	}
	return n
}

func sum(m map[string]int64) int64 {
	var n int64
	for _, v := range m {
		n += v
	}
	return n
}

// Add adds o to c.
func (c *Counts) Add(o Counts) {
	c.Accepted += o.Accepted
	c.Aborted += o.Aborted
	c.Retried += o.Retried
	c.Reregistered += o.Reregistered
	c.New += o.New
	c.Late += o.Late
	c.Skipped += o.Skipped
	c.Resent += o.Resent
	c.ConfigsSeen += o.ConfigsSeen
	c.Unregistered += o.Unregistered
	c.Rejected = addMap(c.Rejected, o.Rejected)
	c.Dropped = addMap(c.Dropped, o.Dropped)
	c.AcceptedByNode = addMap(c.AcceptedByNode, o.AcceptedByNode)
	c.RetryAfter = addMap(c.RetryAfter, o.RetryAfter)
}

func addMap(a, b map[string]int64) map[string]int64 {
	if len(b) == 0 {
		return a
	}
	if a == nil {
		a = make(map[string]int64, len(b))
	}
	for k, v := range b {
		a[k] += v
	}
	return a
}

// Op is the result of one kind of operation over an interval, a step or a run.
type Op struct {
	Counts
	Latency *Hist     `json:"latency,omitempty"`
	Stats   *LatStats `json:"-"` // set instead of Latency in Merged.Intervals
}

// Merge adds o to op.
func (op *Op) Merge(o *Op) {
	if o == nil {
		return
	}
	op.Counts.Add(o.Counts)
	if o.Latency != nil {
		if op.Latency == nil {
			op.Latency = NewHist()
		}
		op.Latency.Merge(o.Latency)
	}
}

// Operation names.
const (
	OpPush     = "push"
	OpRegister = "register"
	OpConnect  = "connect" // connect mode: a persistent connection's handshake
	OpCommand  = "command" // connect mode: command sent until the device is told
)

// Record types.
const (
	TypeStart    = "start"
	TypeInterval = "interval"
	TypeStep     = "step"
	TypeSummary  = "summary"
)

// Start describes a run (one shard); it is the first record of a stream.
type Start struct {
	Type         string    `json:"type"`
	RunID        string    `json:"run_id"`
	Shard        string    `json:"shard"` // "k/n", 1-based
	Version      string    `json:"version,omitempty"`
	Started      time.Time `json:"started"`
	Mode         string    `json:"mode"`
	Target       string    `json:"target"`
	Conn         string    `json:"conn"`
	Devices      int       `json:"devices"`       // whole fleet
	ShardDevices int       `json:"shard_devices"` // this shard's
	Seed         string    `json:"seed"`
	Interval     float64   `json:"interval_s,omitempty"`
	Duration     float64   `json:"duration_s,omitempty"`
	Workers      int       `json:"workers,omitempty"`
	Loops        int       `json:"loops,omitempty"`
	MaxInflight  int       `json:"max_inflight,omitempty"`
	Template     string    `json:"template"`
	SourceAddrs  []string  `json:"source_addrs,omitempty"`
	Host         string    `json:"host,omitempty"`
	GOMAXPROCS   int       `json:"gomaxprocs,omitempty"`
	CPUs         int       `json:"cpus,omitempty"`
}

// Interval is one second (or less, at the edges) of a shard's run.
type Interval struct {
	Type        string         `json:"type"`
	RunID       string         `json:"run_id,omitempty"`
	Shard       string         `json:"shard,omitempty"`
	TS          int64          `json:"ts"`  // unix second the interval belongs to
	Dur         float64        `json:"dur"` // seconds covered (≤ 1)
	Ops         map[string]*Op `json:"ops"`
	Concurrency int            `json:"concurrency,omitempty"` // closed-loop workers running
	Inflight    int            `json:"inflight,omitempty"`    // operations in flight at the end
	CPU         float64        `json:"cpu"`                   // emulator CPU, cores busy
	RSS         int64          `json:"rss"`                   // emulator resident memory, bytes
	MachineBusy float64        `json:"machine_busy"`          // whole machine, 0..1
}

// Step is one concurrency step of a ramp.
type Step struct {
	Type        string         `json:"type"`
	RunID       string         `json:"run_id,omitempty"`
	Shard       string         `json:"shard,omitempty"`
	Index       int            `json:"index"`
	Concurrency int            `json:"concurrency"`
	Start       time.Time      `json:"start"`
	End         time.Time      `json:"end"`
	Ops         map[string]*Op `json:"ops"`
	Broke       bool           `json:"broke"` // drops, retries or 5xx appeared
}

// Rate is the completed operations of op per second over the step.
func (s *Step) Rate(op string) float64 {
	o := s.Ops[op]
	d := s.End.Sub(s.Start).Seconds()
	if o == nil || d <= 0 {
		return 0
	}
	return float64(o.Done()) / d
}

// OpSummary is the whole-run result of one kind of operation.
type OpSummary struct {
	Op
	First time.Time `json:"first"` // first attempt began
	Last  time.Time `json:"last"`  // last outcome
}

// Elapsed is the time from the first attempt to the last outcome.
func (o *OpSummary) Elapsed() time.Duration {
	if o.First.IsZero() || o.Last.Before(o.First) {
		return 0
	}
	return o.Last.Sub(o.First)
}

// Rate is finished operations per second over Elapsed.
func (o *OpSummary) Rate() float64 {
	e := o.Elapsed().Seconds()
	if e <= 0 {
		return 0
	}
	return float64(o.Done()) / e
}

// AcceptedRate is accepted operations per second over Elapsed.
func (o *OpSummary) AcceptedRate() float64 {
	e := o.Elapsed().Seconds()
	if e <= 0 {
		return 0
	}
	return float64(o.Accepted) / e
}

// Conns counts connections and TLS handshakes.
type Conns struct {
	Dials      int64 `json:"dials"`
	DialErrors int64 `json:"dial_errors,omitempty"`
	TLSFull    int64 `json:"tls_full,omitempty"`
	TLSResumed int64 `json:"tls_resumed,omitempty"`
	// TLSResumeFailed counts full handshakes where the device offered its
	// session: the server refused it (a restart, another node's ticket keys).
	TLSResumeFailed int64 `json:"tls_resume_failed,omitempty"`
	TLSErrors       int64 `json:"tls_errors,omitempty"`
	Requests        int64 `json:"requests"`
	MaxOpen         int64 `json:"max_open"`
	ReusedConns     int64 `json:"reused,omitempty"` // requests on a kept-alive connection
}

// Add adds o to c (MaxOpen adds too: shards run side by side).
func (c *Conns) Add(o Conns) {
	c.Dials += o.Dials
	c.DialErrors += o.DialErrors
	c.TLSFull += o.TLSFull
	c.TLSResumed += o.TLSResumed
	c.TLSResumeFailed += o.TLSResumeFailed
	c.TLSErrors += o.TLSErrors
	c.Requests += o.Requests
	c.MaxOpen += o.MaxOpen
	c.ReusedConns += o.ReusedConns
}

// Resources are the emulator's own costs.
type Resources struct {
	CPUSeconds  float64 `json:"cpu_seconds"`
	CPUAvg      float64 `json:"cpu_avg"` // cores busy on average
	CPUMax      float64 `json:"cpu_max"` // busiest second
	RSSMax      int64   `json:"rss_max"` // bytes
	Cores       int     `json:"cores"`   // GOMAXPROCS
	MachineBusy float64 `json:"machine_busy"`
}

// Ramp is the outcome of a ramp.
type Ramp struct {
	BreakingConcurrency int     `json:"breaking_concurrency,omitempty"` // 0: none found
	BestConcurrency     int     `json:"best_concurrency,omitempty"`
	BestRate            float64 `json:"best_rate,omitempty"` // accepted pushes/s of the best clean step
	Reason              string  `json:"reason,omitempty"`
}

// Summary closes a shard's stream.
type Summary struct {
	Type      string                `json:"type"`
	RunID     string                `json:"run_id"`
	Shard     string                `json:"shard"`
	Started   time.Time             `json:"started"`
	Ended     time.Time             `json:"ended"`
	Ops       map[string]*OpSummary `json:"ops"`
	SendLag   *Hist                 `json:"send_lag,omitempty"` // fleet: actual − intended send time
	Conns     Conns                 `json:"conns"`
	Resources Resources             `json:"resources"`
	Ramp      *Ramp                 `json:"ramp,omitempty"`
	Downloads *Downloads            `json:"downloads,omitempty"` // firmware rollouts (fleet mode)
	Warnings  []string              `json:"warnings,omitempty"`
	Err       string                `json:"error,omitempty"`
}

// Downloads counts the emulated firmware downloads of a run.
type Downloads struct {
	Started     int64 `json:"started"`     // offers acted on
	Completed   int64 `json:"completed"`   // files complete
	Interrupted int64 `json:"interrupted"` // attempts cut on purpose (the failure rate)
	Resumed     int64 `json:"resumed"`     // attempts after the first (Range)
	Failed      int64 `json:"failed"`      // reported failed
	Installed   int64 `json:"installed"`   // rebooted into the new firmware
	Bytes       int64 `json:"bytes"`       // received
	MaxActive   int64 `json:"max_active"`  // downloads at once, at most (merged shards: the sum of theirs)
	Time        *Hist `json:"time"`        // offer to complete file
}

// Add adds o's counts to d.
func (d *Downloads) Add(o *Downloads) {
	d.Started += o.Started
	d.Completed += o.Completed
	d.Interrupted += o.Interrupted
	d.Resumed += o.Resumed
	d.Failed += o.Failed
	d.Installed += o.Installed
	d.Bytes += o.Bytes
	d.MaxActive += o.MaxActive
	if o.Time != nil {
		if d.Time == nil {
			d.Time = NewHist()
		}
		d.Time.Merge(o.Time)
	}
}

// Op returns the summary of op, never nil.
func (s *Summary) Op(op string) *OpSummary {
	if o := s.Ops[op]; o != nil {
		return o
	}
	return &OpSummary{}
}

// Writer writes records as JSON lines.
type Writer struct {
	w   *bufio.Writer
	err error
	// Keep, when set, receives every record written, as values.
	Keep *Stream
}

// NewWriter returns a Writer on w.
func NewWriter(w io.Writer) *Writer { return &Writer{w: bufio.NewWriterSize(w, 64<<10)} }

// Write writes one record and flushes it.
func (w *Writer) Write(rec any) error {
	if w.err != nil {
		return w.err
	}
	b, err := json.Marshal(rec)
	if err != nil {
		w.err = err
		return err
	}
	b = append(b, '\n')
	if _, err := w.w.Write(b); err != nil {
		w.err = err
		return err
	}
	if w.Keep != nil {
		w.Keep.Add(rec)
	}
	w.err = w.w.Flush()
	return w.err
}

// Add appends a record (*Start, *Interval, *Step or *Summary) to s; other
// values are ignored.
func (s *Stream) Add(rec any) {
	switch v := rec.(type) {
	case *Start:
		s.Starts = append(s.Starts, v)
	case *Interval:
		s.Intervals = append(s.Intervals, v)
	case *Step:
		s.Steps = append(s.Steps, v)
	case *Summary:
		s.Summaries = append(s.Summaries, v)
	}
}

// Stream is everything read from one or more result streams.
type Stream struct {
	Starts    []*Start
	Intervals []*Interval
	Steps     []*Step
	Summaries []*Summary
}

// Read reads a result stream and appends its records to s.
func (s *Stream) Read(r io.Reader) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	line := 0
	for sc.Scan() {
		line++
		b := sc.Bytes()
		if len(b) == 0 {
			continue
		}
		var head struct {
			Type string `json:"type"`
		}
		if err := json.Unmarshal(b, &head); err != nil {
			return fmt.Errorf("line %d: %w", line, err)
		}
		var err error
		switch head.Type {
		case TypeStart:
			v := new(Start)
			err = json.Unmarshal(b, v)
			s.Starts = append(s.Starts, v)
		case TypeInterval:
			v := new(Interval)
			err = json.Unmarshal(b, v)
			s.Intervals = append(s.Intervals, v)
		case TypeStep:
			v := new(Step)
			err = json.Unmarshal(b, v)
			s.Steps = append(s.Steps, v)
		case TypeSummary:
			v := new(Summary)
			err = json.Unmarshal(b, v)
			s.Summaries = append(s.Summaries, v)
		default:
			err = fmt.Errorf("unknown record type %q", head.Type)
		}
		if err != nil {
			return fmt.Errorf("line %d: %w", line, err)
		}
	}
	return sc.Err()
}

// Merged is a whole run: every shard's records combined.
type Merged struct {
	Starts    []*Start    // one per shard, ordered by shard
	Intervals []*Interval // one per second, shards summed
	Steps     []*Step     // one per ramp step, shards summed
	Summary   *Summary    // shards combined; nil if no shard finished
	Shards    []*Summary  // per shard, ordered by shard
	Missing   []string    // shards announced by a start record without summary
}

// Merge combines the records of all shards of a run. Intervals of the same
// unix second add up; histograms merge exactly.
func (s *Stream) Merge() (*Merged, error) {
	if len(s.Starts) == 0 && len(s.Summaries) == 0 {
		return nil, errors.New("no emulator records found")
	}
	m := &Merged{}
	type key struct{ run, shard string }
	seen := map[key]bool{}
	for _, st := range s.Starts {
		k := key{st.RunID, st.Shard}
		if seen[k] {
			return nil, fmt.Errorf("shard %s of run %s appears twice", st.Shard, st.RunID)
		}
		seen[k] = true
		m.Starts = append(m.Starts, st)
	}
	sortByShard(m.Starts, func(x *Start) string { return x.Shard })
	if err := checkShards(m.Starts); err != nil {
		return nil, err
	}

	// Intervals merge one second at a time, and keep only their latency
	// figures: a decoded histogram is large and a run has many seconds.
	ivs := slices.Clone(s.Intervals)
	sort.SliceStable(ivs, func(i, j int) bool { return ivs[i].TS < ivs[j].TS })
	for i := 0; i < len(ivs); {
		j := i
		dst := &Interval{Type: TypeInterval, TS: ivs[i].TS, Ops: map[string]*Op{}}
		for ; j < len(ivs) && ivs[j].TS == dst.TS; j++ {
			iv := ivs[j]
			dst.Dur = max(dst.Dur, iv.Dur)
			for name, op := range iv.Ops {
				if dst.Ops[name] == nil {
					dst.Ops[name] = &Op{}
				}
				dst.Ops[name].Merge(op)
			}
			dst.Concurrency += iv.Concurrency
			dst.Inflight += iv.Inflight
			dst.CPU += iv.CPU
			dst.RSS += iv.RSS
			dst.MachineBusy = max(dst.MachineBusy, iv.MachineBusy)
		}
		for _, op := range dst.Ops {
			st := op.Latency.Stats()
			op.Stats, op.Latency = &st, nil
		}
		m.Intervals = append(m.Intervals, dst)
		i = j
	}

	byIdx := map[int]*Step{}
	for _, st := range s.Steps {
		dst := byIdx[st.Index]
		if dst == nil {
			dst = &Step{Type: TypeStep, Index: st.Index, Start: st.Start, End: st.End, Ops: map[string]*Op{}}
			byIdx[st.Index] = dst
		}
		if st.Start.Before(dst.Start) {
			dst.Start = st.Start
		}
		if st.End.After(dst.End) {
			dst.End = st.End
		}
		dst.Concurrency += st.Concurrency
		dst.Broke = dst.Broke || st.Broke
		for name, op := range st.Ops {
			if dst.Ops[name] == nil {
				dst.Ops[name] = &Op{}
			}
			dst.Ops[name].Merge(op)
		}
	}
	for _, i := range slices.Sorted(maps.Keys(byIdx)) {
		m.Steps = append(m.Steps, byIdx[i])
	}

	m.Shards = append(m.Shards, s.Summaries...)
	sortByShard(m.Shards, func(x *Summary) string { return x.Shard })
	have := map[key]bool{}
	for _, sm := range m.Shards {
		have[key{sm.RunID, sm.Shard}] = true
	}
	for _, st := range m.Starts {
		if !have[key{st.RunID, st.Shard}] {
			m.Missing = append(m.Missing, st.Shard)
		}
	}
	if len(m.Shards) > 0 {
		m.Summary = MergeSummaries(m.Shards)
		if len(m.Steps) > 0 && len(m.Shards) > 1 {
			m.Summary.Ramp = RampOutcome(m.Steps, m.Summary.Ramp)
		}
	}
	return m, nil
}

// checkShards refuses mixing runs with different fleet definitions.
func checkShards(starts []*Start) error {
	if len(starts) < 2 {
		return nil
	}
	a := starts[0]
	for _, b := range starts[1:] {
		if a.Devices != b.Devices || a.Seed != b.Seed || a.Mode != b.Mode {
			return fmt.Errorf("shards %s and %s are not of the same fleet (devices %d/%d, seed %q/%q, mode %s/%s)",
				a.Shard, b.Shard, a.Devices, b.Devices, a.Seed, b.Seed, a.Mode, b.Mode)
		}
		if a.Shard == b.Shard {
			return fmt.Errorf("shard %s appears in two runs (%s, %s): they would be counted twice", a.Shard, a.RunID, b.RunID)
		}
	}
	return nil
}

func sortByShard[T any](xs []T, shard func(T) string) {
	sort.SliceStable(xs, func(i, j int) bool {
		ki, ni := ParseShardKey(shard(xs[i]))
		kj, nj := ParseShardKey(shard(xs[j]))
		if ni != nj {
			return ni < nj
		}
		return ki < kj
	})
}

// ParseShardKey parses "k/n" leniently for sorting (0, 0 on error).
func ParseShardKey(s string) (k, n int) {
	for i := 0; i < len(s); i++ {
		if s[i] == '/' {
			k, _ = strconv.Atoi(s[:i])
			n, _ = strconv.Atoi(s[i+1:])
			return k, n
		}
	}
	return 0, 0
}

// MergeSummaries combines the summaries of shards that ran side by side.
func MergeSummaries(ss []*Summary) *Summary {
	out := &Summary{Type: TypeSummary, Ops: map[string]*OpSummary{}}
	var cpuAvg float64
	for i, s := range ss {
		if i == 0 {
			out.RunID, out.Started, out.Ended = s.RunID, s.Started, s.Ended
		}
		if s.RunID != out.RunID {
			out.RunID = "merged"
		}
		if s.Started.Before(out.Started) {
			out.Started = s.Started
		}
		if s.Ended.After(out.Ended) {
			out.Ended = s.Ended
		}
		for name, o := range s.Ops {
			dst := out.Ops[name]
			if dst == nil {
				dst = &OpSummary{First: o.First, Last: o.Last}
				out.Ops[name] = dst
			}
			dst.Op.Merge(&o.Op)
			if !o.First.IsZero() && (dst.First.IsZero() || o.First.Before(dst.First)) {
				dst.First = o.First
			}
			if o.Last.After(dst.Last) {
				dst.Last = o.Last
			}
		}
		if s.SendLag != nil {
			if out.SendLag == nil {
				out.SendLag = NewHist()
			}
			out.SendLag.Merge(s.SendLag)
		}
		out.Conns.Add(s.Conns)
		r := s.Resources
		out.Resources.CPUSeconds += r.CPUSeconds
		cpuAvg += r.CPUAvg
		out.Resources.CPUMax += r.CPUMax
		out.Resources.RSSMax += r.RSSMax
		out.Resources.Cores += r.Cores
		out.Resources.MachineBusy = max(out.Resources.MachineBusy, r.MachineBusy)
		if s.Downloads != nil {
			if out.Downloads == nil {
				out.Downloads = &Downloads{}
			}
			out.Downloads.Add(s.Downloads)
		}
		if s.Ramp != nil && out.Ramp == nil {
			r := *s.Ramp
			out.Ramp = &r
		}
		prefix := ""
		if len(ss) > 1 {
			prefix = "shard " + s.Shard + ": "
		}
		for _, w := range s.Warnings {
			out.Warnings = append(out.Warnings, prefix+w)
		}
		if s.Err != "" {
			if out.Err != "" {
				out.Err += "; "
			}
			out.Err += prefix + s.Err
		}
	}
	out.Resources.CPUAvg = cpuAvg
	out.Shard = strconv.Itoa(len(ss)) + " shard"
	if len(ss) == 1 {
		out.Shard = ss[0].Shard
	} else {
		out.Shard += "s"
	}
	return out
}

// StepBroke tells whether a step shows the overload signs a ramp looks for:
// dropped or aborted operations, retries, or 5xx answers.
func StepBroke(ops map[string]*Op) bool {
	for _, o := range ops {
		if o.DroppedTotal() > 0 || o.Retried > 0 || o.Rejected5xx() > 0 || o.Aborted > 0 {
			return true
		}
	}
	return false
}

// RampOutcome finds the breaking point in (merged) steps.
func RampOutcome(steps []*Step, prev *Ramp) *Ramp {
	r := &Ramp{}
	if prev != nil {
		r.Reason = prev.Reason
	}
	for _, st := range steps {
		if StepBroke(st.Ops) {
			r.BreakingConcurrency = st.Concurrency
			r.Reason = describeBreak(st.Ops)
			break
		}
		if rate := acceptedRate(st); rate >= r.BestRate {
			r.BestRate, r.BestConcurrency = rate, st.Concurrency
		}
	}
	return r
}

func acceptedRate(st *Step) float64 {
	d := st.End.Sub(st.Start).Seconds()
	o := st.Ops[OpPush]
	if o == nil || d <= 0 {
		return 0
	}
	return float64(o.Accepted) / d
}

func describeBreak(ops map[string]*Op) string {
	var c Counts
	for _, o := range ops {
		c.Add(o.Counts)
	}
	return fmt.Sprintf("%d dropped, %d aborted, %d retried, %d answered 5xx", c.DroppedTotal(), c.Aborted, c.Retried, c.Rejected5xx())
}

// SortedKeys returns a map's keys in order.
func SortedKeys[V any](m map[string]V) []string { return slices.Sorted(maps.Keys(m)) }
