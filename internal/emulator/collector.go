package emulator

import (
	"fmt"
	"runtime"
	"time"

	hdr "github.com/HdrHistogram/hdrhistogram-go"

	"github.com/drover/drover/internal/emulator/results"
)

// collector turns the counters into one interval record per wall-clock
// second, drives ramp steps, samples the emulator's own resources and
// raises the warnings that say the emulator itself limits the run.
type collector struct {
	e        *engine
	mon      *monitor
	ops      []collectedOp
	lastTick time.Time
	cpuStart time.Duration
	cores    float64

	cpuMax                     float64
	rssMax                     int64
	busySum, busyN             float64
	hotSecs, hogSecs, fullSecs int
	lastP                      Progress
}

type collectedOp struct {
	name string
	st   *opStats
	prev results.Counts
	iv   *hdr.Histogram // reused every interval
	tot  *hdr.Histogram
}

func newCollector(e *engine) *collector {
	c := &collector{e: e, mon: newMonitor(), lastTick: e.start}
	c.cpuStart = processCPU()
	c.cores = float64(min(runtime.GOMAXPROCS(0), runtime.NumCPU()))
	for _, o := range []struct {
		name string
		st   *opStats
	}{{results.OpPush, e.push}, {results.OpRegister, e.reg}, {results.OpConnect, e.conn}, {results.OpCommand, e.cmd}} {
		if o.st == nil {
			continue
		}
		c.ops = append(c.ops, collectedOp{name: o.name, st: o.st, iv: results.NewHistogram(), tot: results.NewHistogram()})
	}
	return c
}

func (c *collector) loop(stop <-chan struct{}) {
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		now := time.Now()
		t.Reset(now.Truncate(time.Second).Add(time.Second).Sub(now))
		select {
		case <-t.C:
			c.tick(time.Now(), false)
		case <-stop:
			c.tick(time.Now(), true)
			return
		}
	}
}

func (c *collector) tick(now time.Time, final bool) {
	e := c.e
	iv := &results.Interval{
		Type: results.TypeInterval, RunID: e.cfg.RunID, Shard: e.cfg.Shard.String(),
		TS: c.lastTick.Unix(), Dur: now.Sub(c.lastTick).Seconds(), Ops: map[string]*results.Op{},
		Concurrency: int(e.concurrency.Load()), Inflight: int(e.inflight.Load()),
	}
	c.lastTick = now
	var pushOp *results.Op
	p := Progress{Elapsed: now.Sub(e.start), Remaining: -1, Phase: e.phase.Load().(string), Final: final}
	if e.dl != nil { // read with now: a rate from them is not skewed by this tick's work
		p.DownloadBytes, p.DownloadActive = e.dl.bytes.Load(), e.dl.active.Load()
	}
	for i := range c.ops {
		o := &c.ops[i]
		cur := o.st.counts()
		d := diff(cur, o.prev)
		o.prev = cur
		o.iv.Reset()
		o.st.lat.drainInto(o.iv)
		o.tot.Merge(o.iv)
		if active(d) || o.iv.TotalCount() > 0 {
			op := &results.Op{Counts: d, Latency: &results.Hist{H: o.iv}}
			iv.Ops[o.name] = op
			if o.name == results.OpPush {
				pushOp = op
			}
		}
		rate := 0.0
		if iv.Dur > 0 {
			rate = float64(d.Done()) / iv.Dur
		}
		if o.name == results.OpPush {
			p.Push, p.PushRate = cur, rate
			if pushOp != nil {
				p.PushP99 = pushOp.Latency.Quantile(0.99)
			}
		} else {
			p.Reg, p.RegRate = cur, rate
		}
	}
	s := c.mon.sample()
	iv.CPU, iv.RSS = s.cpu, s.rss
	iv.MachineBusy = max(s.machineBusy, 0)
	c.cpuMax = max(c.cpuMax, s.cpu)
	c.rssMax = max(c.rssMax, s.rss)
	if s.machineBusy >= 0 {
		c.busySum += s.machineBusy
		c.busyN++
	}
	if err := e.w.Write(iv); err != nil {
		e.warnOnce("write", "writing results failed: "+err.Error())
	}
	if r := e.ramp.Load(); r != nil {
		if st := r.onInterval(iv.Ops[results.OpPush], now); st != nil {
			if err := e.w.Write(st); err != nil {
				e.warnOnce("write", "writing results failed: "+err.Error())
			}
		}
	}
	c.checkBottleneck(s, iv.Dur)

	p.Inflight, p.Concurrency, p.CPU, p.RSS = iv.Inflight, iv.Concurrency, s.cpu, s.rss
	switch {
	case final:
		p.Remaining = 0
	case e.cfg.Mode == ModeFleet && !e.end.IsZero():
		p.Remaining = max(e.end.Sub(now), 0)
	case p.Phase == "register":
		p.Remaining = eta(p.Reg.Done()+p.Reg.Aborted, e.regTarget.Load(), p.RegRate)
	case e.cfg.Mode == ModeBenchmark && p.Phase == "push":
		p.Remaining = eta(p.Push.Done()+p.Push.Unregistered, e.pushTarget.Load(), p.PushRate)
	}
	c.lastP = p
	if e.cfg.Progress != nil {
		e.cfg.Progress(p)
	}
}

func eta(done, total int64, rate float64) time.Duration {
	if rate <= 0 || total <= done {
		return -1
	}
	return time.Duration(float64(total-done) / rate * float64(time.Second))
}

// checkBottleneck warns, once, when for 5 seconds in a row the emulator
// used nearly all the cores it may use, or the machine was saturated and
// the emulator held a large share of it.
func (c *collector) checkBottleneck(s sample, dur float64) {
	if dur < 0.5 || c.e.phase.Load().(string) == "done" {
		return
	}
	if s.cpu >= 0.9*c.cores {
		c.hotSecs++
	} else {
		c.hotSecs = 0
	}
	machineCores := float64(runtime.NumCPU())
	if s.machineBusy >= 0.95 && s.cpu >= 0.4*machineCores {
		c.hogSecs++
	} else {
		c.hogSecs = 0
	}
	if s.machineBusy >= 0.95 && s.cpu < 0.4*machineCores {
		c.fullSecs++
	} else {
		c.fullSecs = 0
	}
	if c.hotSecs == 5 {
		c.e.warnOnce("cpu", fmt.Sprintf("EMULATOR IS THE BOTTLENECK: it used %.1f of its %.0f cores for 5 s; the rates measure the emulator, not the server (split it with --procs or run it on another machine)", s.cpu, c.cores))
	}
	if c.fullSecs == 10 {
		c.e.warnOnce("busy", fmt.Sprintf("the machine's CPUs were %.0f%% busy for 10 s (the emulator used %.1f of %.0f cores): the server shares the rest with any other process; make sure no other load cut its share", s.machineBusy*100, s.cpu, machineCores))
	}
	if c.hogSecs == 5 {
		c.e.warnOnce("machine", fmt.Sprintf("the machine's CPUs were %.0f%% busy and the emulator used %.1f of %.0f cores for 5 s: the server competes with the emulator for CPU, so the server's rates here are below what it does on a machine of its own", s.machineBusy*100, s.cpu, machineCores))
	}
}

func (c *collector) summary() *results.Summary {
	e := c.e
	end := c.lastTick
	sum := &results.Summary{
		Type: results.TypeSummary, RunID: e.cfg.RunID, Shard: e.cfg.Shard.String(),
		Started: e.start.UTC(), Ended: end.UTC(), Ops: map[string]*results.OpSummary{}, Conns: e.tr.stats(),
	}
	for i := range c.ops {
		o := &c.ops[i]
		cnt := o.st.counts()
		if !active(cnt) && o.tot.TotalCount() == 0 {
			continue
		}
		os := &results.OpSummary{Op: results.Op{Counts: cnt, Latency: &results.Hist{H: o.tot}}}
		if f := o.st.first.Load(); f != 0 {
			os.First = time.Unix(0, f).UTC()
		}
		if l := o.st.last.Load(); l != 0 {
			os.Last = time.Unix(0, l).UTC()
		}
		sum.Ops[o.name] = os
	}
	if e.lag != nil {
		h := results.NewHist()
		e.lag.drainInto(h.H)
		sum.SendLag = h
	}
	wall := end.Sub(e.start).Seconds()
	cpu := (processCPU() - c.cpuStart).Seconds()
	sum.Resources = results.Resources{CPUSeconds: cpu, CPUMax: c.cpuMax, RSSMax: c.rssMax, Cores: int(c.cores)}
	sum.Downloads = e.dl.summary()
	if wall > 0 {
		sum.Resources.CPUAvg = cpu / wall
	}
	if c.busyN > 0 {
		sum.Resources.MachineBusy = c.busySum / c.busyN
	}
	if r := e.ramp.Load(); r != nil {
		r.mu.Lock()
		out := r.outcome
		r.mu.Unlock()
		sum.Ramp = &out
	}

	push := sum.Op(results.OpPush)
	if e.cfg.Mode == ModeFleet && push.Done() > 0 && push.Late*100 > push.Done() {
		why := "the emulator could not keep its schedule (see send lag)"
		if e.hasWarned("inflight") {
			why = "operations in flight reached --max-inflight: the server answered too slowly"
		}
		e.warnOnce("late", fmt.Sprintf("%.1f%% of pushes were sent more than %v late: %s", float64(push.Late)*100/float64(push.Done()), e.cfg.LateAfter, why))
	}
	if push.Skipped > 0 {
		e.warnOnce("skipped", fmt.Sprintf("%d pushes were skipped: their device was still busy with a push due a whole interval earlier", push.Skipped))
	}
	if wall >= 5 && sum.Resources.CPUAvg >= 0.85*c.cores {
		e.warnOnce("cpu", fmt.Sprintf("EMULATOR IS THE BOTTLENECK: it used %.1f of its %.0f cores on average; the rates measure the emulator, not the server", sum.Resources.CPUAvg, c.cores))
	}
	if push.Done() > 0 && push.Accepted == 0 {
		e.warnOnce("none", "no push was accepted")
	}
	e.warnMu.Lock()
	sum.Warnings = append([]string(nil), e.warnings...)
	e.warnMu.Unlock()
	return sum
}
