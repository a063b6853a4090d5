package emulator

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/drover/drover/internal/emulator/results"
)

// Procs is how RunProcs starts its children.
type Procs struct {
	N       int      // child processes; each runs cfg.Shard.Sub(i, N)
	Command []string // program and arguments of a child, before its --shard
	Env     []string // the children's environment
	Sink    io.Writer
	Stderr  func(line string) // each line a child writes to stderr, prefixed with its shard
}

// RunProcs splits cfg's shard over child processes (each one a drover
// emulate with the same fleet), copies their result streams to p.Sink and
// merges them. cfg must be validated; cfg.Progress sees the children's sum.
func RunProcs(ctx context.Context, cfg Config, p Procs) (*results.Merged, error) {
	stderr := p.Stderr
	if stderr == nil {
		stderr = func(string) {}
	}
	var (
		mu   sync.Mutex
		cmds []*exec.Cmd
	)
	return RunShards(ctx, cfg, Shards{
		N:    p.N,
		Sink: p.Sink,
		Start: func(_ int, sh Shard) (io.ReadCloser, error) {
			cmd := exec.Command(p.Command[0], append(slices.Clone(p.Command[1:]), "--shard="+sh.String())...)
			cmd.Env = p.Env
			cmd.Stderr = &prefixWriter{out: stderr, prefix: "[shard " + sh.String() + "] "}
			stdout, err := cmd.StdoutPipe()
			if err != nil {
				return nil, err
			}
			if err := cmd.Start(); err != nil {
				return nil, err
			}
			mu.Lock()
			cmds = append(cmds, cmd)
			mu.Unlock()
			return &procStream{ReadCloser: stdout, cmd: cmd}, nil
		},
		Stop: func() {
			mu.Lock()
			defer mu.Unlock()
			for _, c := range cmds {
				c.Process.Signal(syscall.SIGINT)
			}
		},
		Abort: func() {
			mu.Lock()
			defer mu.Unlock()
			for _, c := range cmds {
				c.Process.Kill()
			}
		},
	})
}

// procStream is a child's stdout; Close waits for the child.
type procStream struct {
	io.ReadCloser
	cmd *exec.Cmd
}

func (p *procStream) Close() error { return p.cmd.Wait() }

// Shards is where RunShards runs the shards of a fleet: child processes
// (RunProcs) or load machines (internal/perf's workers).
type Shards struct {
	N int // shards; the i-th (1-based) runs cfg.Shard.Sub(i, N)
	// Start starts the i-th shard and returns its result stream (JSON
	// lines). The stream ends when the shard has ended; Close then
	// returns the shard's own failure (nil: none).
	Start func(i int, sh Shard) (io.ReadCloser, error)
	// Stop asks every started shard to end early and write its summary
	// (ctx ended); nil: none.
	Stop func()
	// Abort ends every started shard at once (a shard failed to start);
	// nil: none.
	Abort func()
	Sink  io.Writer // every record of every shard, as read (nil: none)
}

// RunShards runs cfg's shard split over s.N shards started by s.Start,
// copies their result streams to s.Sink and merges them exactly. cfg
// must be validated; cfg.Progress sees the shards' sum once a second.
func RunShards(ctx context.Context, cfg Config, s Shards) (*results.Merged, error) {
	procs, sink := s.N, s.Sink
	if sink == nil {
		sink = io.Discard
	}
	if cfg.Progress == nil {
		cfg.Progress = func(Progress) {}
	}
	var (
		outMu  sync.Mutex
		stream results.Stream
		agg    = newAggregator(procs)
		wg     sync.WaitGroup
		errs   = make([]error, procs)
	)
	start := time.Now()
	for i := 1; i <= procs; i++ {
		sh := cfg.Shard.Sub(i, procs)
		out, err := s.Start(i, sh)
		if err != nil {
			if s.Abort != nil {
				s.Abort()
			}
			wg.Wait()
			return nil, fmt.Errorf("starting shard %s: %w", sh, err)
		}
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			sc := bufio.NewScanner(out)
			sc.Buffer(make([]byte, 1<<20), 64<<20)
			for sc.Scan() {
				line := make([]byte, len(sc.Bytes()), len(sc.Bytes())+1)
				copy(line, sc.Bytes())
				outMu.Lock()
				if _, err := sink.Write(append(line, '\n')); err != nil && errs[i-1] == nil {
					errs[i-1] = err
				}
				if err := stream.Read(bytes.NewReader(line)); err != nil && errs[i-1] == nil {
					errs[i-1] = fmt.Errorf("shard %s wrote a bad record: %w", sh, err)
				}
				outMu.Unlock()
				agg.add(i-1, line)
			}
			if err := sc.Err(); err != nil && errs[i-1] == nil {
				errs[i-1] = fmt.Errorf("shard %s: %w", sh, err)
			}
			if err := out.Close(); err != nil && errs[i-1] == nil {
				errs[i-1] = fmt.Errorf("shard %s: %w", sh, err)
			}
		}(i)
	}
	if s.Stop != nil {
		stopSig := context.AfterFunc(ctx, s.Stop)
		defer stopSig()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
loop:
	for {
		select {
		case <-done:
			break loop
		case <-tick.C:
			cfg.Progress(agg.progress(cfg, start, false))
		}
	}
	cfg.Progress(agg.progress(cfg, start, true))
	err := errors.Join(errs...)
	if ctx.Err() != nil && err == nil {
		err = ctx.Err()
	}
	outMu.Lock()
	defer outMu.Unlock()
	m, merr := stream.Merge()
	if merr != nil {
		return nil, errors.Join(err, merr)
	}
	if len(m.Missing) > 0 {
		err = errors.Join(err, fmt.Errorf("shards %v ended without a summary", m.Missing))
	}
	return m, err
}

// aggregator sums the children's interval records for live progress.
type aggregator struct {
	mu       sync.Mutex
	push     results.Counts
	reg      results.Counts
	last     []results.Interval
	p99      []time.Duration // each shard's last second's push p99
	prevDone int64
	prevReg  int64
	prevT    time.Time
}

func newAggregator(n int) *aggregator {
	return &aggregator{last: make([]results.Interval, n), p99: make([]time.Duration, n)}
}

func (a *aggregator) add(child int, line []byte) {
	var iv results.Interval
	if json.Unmarshal(line, &iv) != nil || iv.Type != results.TypeInterval {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if op := iv.Ops[results.OpPush]; op != nil {
		a.push.Add(op.Counts)
		if op.Latency.Count() > 0 {
			a.p99[child] = op.Latency.Quantile(0.99)
		}
	}
	if op := iv.Ops[results.OpRegister]; op != nil {
		a.reg.Add(op.Counts)
	}
	iv.Ops = nil
	a.last[child] = iv
}

func (a *aggregator) progress(cfg Config, start time.Time, final bool) Progress {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := time.Now()
	p := Progress{Phase: "push", Elapsed: now.Sub(start), Remaining: -1, Push: a.push, Reg: a.reg, Final: final}
	p.Push.Rejected, p.Reg.Rejected = clone(a.push.Rejected), clone(a.reg.Rejected)
	p.Push.Dropped, p.Reg.Dropped = clone(a.push.Dropped), clone(a.reg.Dropped)
	if dt := now.Sub(a.prevT).Seconds(); !a.prevT.IsZero() && dt > 0 {
		p.PushRate = float64(a.push.Done()-a.prevDone) / dt
		p.RegRate = float64(a.reg.Done()-a.prevReg) / dt
	}
	a.prevT, a.prevDone, a.prevReg = now, a.push.Done(), a.reg.Done()
	if p.PushRate == 0 && p.RegRate > 0 {
		p.Phase = "register"
	}
	for i, iv := range a.last {
		p.PushP99 = max(p.PushP99, a.p99[i]) // the slowest shard's
		p.Inflight += iv.Inflight
		p.Concurrency += iv.Concurrency
		p.CPU += iv.CPU
		p.RSS += iv.RSS
	}
	if cfg.Mode == ModeFleet {
		p.Remaining = max(cfg.Duration-p.Elapsed, 0)
	}
	if final {
		p.Phase, p.Remaining = "done", 0
	}
	return p
}

func clone(m map[string]int64) map[string]int64 {
	if m == nil {
		return nil
	}
	out := make(map[string]int64, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// prefixWriter passes each whole line written to it, prefixed, to out.
type prefixWriter struct {
	mu     sync.Mutex
	out    func(string)
	prefix string
	buf    []byte
}

func (p *prefixWriter) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.buf = append(p.buf, b...)
	for {
		i := bytes.IndexByte(p.buf, '\n')
		if i < 0 {
			break
		}
		p.out(p.prefix + string(p.buf[:i]))
		p.buf = p.buf[i+1:]
	}
	return len(b), nil
}
