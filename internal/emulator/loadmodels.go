package emulator

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/drover/drover/internal/emulator/results"
)

// The load models: fleet (open loop), benchmark and ramp (closed loop).

// registerPhase registers every device without a token, with workers
// concurrent registrations (a registration storm).
func (e *engine) registerPhase(ctx context.Context, workers int) {
	var todo []*device
	for _, d := range e.devs {
		if d.token == "" {
			todo = append(todo, d)
		}
	}
	if len(todo) == 0 {
		return
	}
	e.phase.Store("register")
	e.regTarget.Store(int64(len(todo)))
	workers = max(min(workers, len(todo)), 1)
	e.concurrency.Store(int64(workers))
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := e.getScratch()
			defer e.putScratch(s)
			for i := w; i < len(todo) && !ended(ctx); i += workers {
				e.registerDevice(ctx, todo[i], s)
			}
		}()
	}
	wg.Wait()
	e.concurrency.Store(0)
}

func (e *engine) runBenchmark(ctx context.Context) error {
	e.registerPhase(ctx, e.cfg.Workers)
	if e.cfg.Loops == 0 || ctx.Err() != nil {
		return ctx.Err()
	}
	e.phase.Store("push")
	workers := max(min(e.cfg.Workers, len(e.devs)), 1)
	e.pushTarget.Store(int64(len(e.devs) * e.cfg.Loops))
	e.concurrency.Store(int64(workers))
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := e.getScratch()
			defer e.putScratch(s)
			for range e.cfg.Loops {
				for i := w; i < len(e.devs); i += workers {
					if ended(ctx) {
						return
					}
					e.pushDevice(ctx, e.devs[i], s, time.Now(), false)
				}
			}
		}()
	}
	wg.Wait()
	e.concurrency.Store(0)
	return ctx.Err()
}

// scheduled is a device and its offset within the push interval.
type scheduled struct {
	phase time.Duration
	d     *device
}

// fleetSchedule is the devices in the order of their phases (ties in
// device order): each phase computed once, sorted without touching the
// devices.
func (e *engine) fleetSchedule() []scheduled {
	s := make([]scheduled, len(e.devs))
	for i, d := range e.devs {
		s[i] = scheduled{e.id.phase(d.idx, e.cfg.Interval), d}
	}
	slices.SortStableFunc(s, func(a, b scheduled) int { return cmp.Compare(a.phase, b.phase) })
	return s
}

func (e *engine) runFleet(ctx context.Context) error {
	e.phase.Store("push")
	start := e.start // e.schedule was built before it (run)
	// Pushes run on a pool of workers that grows to the largest number in
	// flight (at most MaxInflight): a goroutine per push would cost a new
	// stack, and its growth, every time.
	jobs := make(chan fleetJob)
	var wg sync.WaitGroup
	workers := 0
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	limited := false
dispatch:
	for round := 0; ; round++ {
		base := start.Add(time.Duration(round) * e.cfg.Interval)
		if !base.Before(e.end) {
			break
		}
		for _, sd := range e.schedule {
			d, due := sd.d, base.Add(sd.phase)
			if !due.Before(e.end) {
				break dispatch
			}
			if wait := time.Until(due); wait > 0 {
				timer.Reset(wait)
				select {
				case <-timer.C:
				case <-ctx.Done():
					break dispatch
				}
			}
			if ctx.Err() != nil {
				break dispatch
			}
			for {
				if d.state.CompareAndSwap(0, 1) {
					job := fleetJob{d, due}
					select {
					case jobs <- job: // an idle worker took it
					default:
						if workers < e.cfg.MaxInflight {
							workers++
							wg.Add(1)
							go e.fleetWorker(ctx, job, jobs, &wg)
							break
						}
						if !limited {
							limited = true
							e.warnOnce("inflight", fmt.Sprintf("%d operations in flight (--max-inflight): sends are delayed; the server answers too slowly for this fleet or the limit is too low", e.cfg.MaxInflight))
						}
						select {
						case jobs <- job:
						case <-ctx.Done():
							d.state.Store(0)
							break dispatch
						}
					}
					break
				}
				if d.state.Load() == 2 {
					e.push.skipped.Add(1)
					break
				}
				d.pendingDue.Store(due.UnixNano())
				if d.state.CompareAndSwap(1, 2) {
					break
				}
			}
		}
	}
	close(jobs)
	wg.Wait()
	return ctx.Err()
}

// fleetJob is one scheduled push.
type fleetJob struct {
	d   *device
	due time.Time
}

// fleetWorker runs job, then every job it takes until jobs closes.
func (e *engine) fleetWorker(ctx context.Context, job fleetJob, jobs <-chan fleetJob, wg *sync.WaitGroup) {
	defer wg.Done()
	s := e.getScratch()
	defer e.putScratch(s)
	for {
		e.fleetDevice(ctx, job.d, job.due, s)
		var ok bool
		if job, ok = <-jobs; !ok {
			return
		}
	}
}

func (e *engine) fleetDevice(ctx context.Context, d *device, due time.Time, s *scratch) {
	for {
		e.pushDevice(ctx, d, s, due, true)
		if d.state.CompareAndSwap(1, 0) {
			return
		}
		// A due time passed while this push was busy: push again now,
		// measured from that due time.
		due = time.Unix(0, d.pendingDue.Load())
		d.state.Store(1)
		if ctx.Err() != nil {
			d.state.Store(0)
			return
		}
	}
}

// rampState is driven by the collector once per interval.
type rampState struct {
	e         *engine
	pool      chan *device
	ctx       context.Context
	wg        sync.WaitGroup
	mu        sync.Mutex
	workers   int
	step      int
	conc      int
	stepStart time.Time
	op        *results.Op
	steps     []*results.Step
	outcome   results.Ramp
	done      chan struct{}
	finished  bool
}

func (e *engine) runRamp(ctx context.Context) error {
	e.registerPhase(ctx, e.cfg.Workers)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	e.phase.Store("push")
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	r := &rampState{e: e, pool: make(chan *device, len(e.devs)), ctx: rctx, done: make(chan struct{}), op: &results.Op{}}
	for _, d := range e.devs {
		r.pool <- d
	}
	r.mu.Lock()
	r.stepStart = time.Now()
	r.conc = e.cfg.RampStart
	r.grow(r.conc)
	e.ramp.Store(r)
	r.mu.Unlock()
	select {
	case <-r.done:
	case <-ctx.Done():
	}
	cancel()
	r.wg.Wait()
	e.concurrency.Store(0)
	r.mu.Lock()
	if !r.finished {
		r.finished = true
		if r.outcome.Reason == "" {
			r.outcome.Reason = "stopped before a breaking point was found"
		}
	}
	r.mu.Unlock()
	return ctx.Err()
}

// grow starts workers up to n; called with r.mu held.
func (r *rampState) grow(n int) {
	for r.workers < n {
		r.workers++
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			s := r.e.getScratch()
			defer r.e.putScratch(s)
			for !ended(r.ctx) {
				var d *device
				select {
				case d = <-r.pool:
				case <-r.ctx.Done():
					return
				}
				r.e.pushDevice(r.ctx, d, s, time.Now(), false)
				r.pool <- d
			}
		}()
	}
	r.e.concurrency.Store(int64(r.workers))
}

// onInterval adds an interval's pushes to the current step and closes the
// step when its time is up.
func (r *rampState) onInterval(op *results.Op, now time.Time) *results.Step {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.finished {
		return nil
	}
	r.op.Merge(op)
	if now.Sub(r.stepStart) < r.e.cfg.RampStepDuration-50*time.Millisecond {
		return nil
	}
	st := &results.Step{
		Type: results.TypeStep, RunID: r.e.cfg.RunID, Shard: r.e.cfg.Shard.String(), Index: r.step,
		Concurrency: r.conc, Start: r.stepStart.UTC(), End: now.UTC(), Ops: map[string]*results.Op{results.OpPush: r.op},
	}
	st.Broke = results.StepBroke(st.Ops)
	r.steps = append(r.steps, st)
	r.outcome = *results.RampOutcome(r.steps, nil)
	switch {
	case st.Broke:
		r.finish("")
	case r.conc >= r.e.cfg.RampMax:
		r.finish(fmt.Sprintf("no breaking point up to %d workers (--ramp-max)", r.e.cfg.RampMax))
	default:
		r.step++
		r.conc = min(max(int(math.Ceil(float64(r.conc)*r.e.cfg.RampFactor)), r.conc+1), r.e.cfg.RampMax)
		r.grow(r.conc)
		r.stepStart = now
		r.op = &results.Op{}
	}
	return st
}

func (r *rampState) finish(reason string) {
	r.finished = true
	if reason != "" {
		r.outcome.Reason = reason
	}
	close(r.done)
}
