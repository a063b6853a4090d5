package perf

import (
	"fmt"
	"io"
	"math"
	"strings"

	"github.com/drover/drover/internal/render"
)

// Sizing is whether a machine carries a fleet, from measured results.
type Sizing struct {
	Devices  int
	Interval float64 // s

	NeedReqPerSec float64
	// Throughput: the lowest benchmark throughput of the chosen TLS kind,
	// and 80 % of it as the safe capacity (the 0.8.0 rule).
	Measured     float64
	SafeCapacity float64
	ThroughputOK bool
	CPUHeadroom  float64 // safe capacity / need
	ThroughputOf string
	NoSSLRate    float64 // lowest noSSL throughput, for the advice

	// Memory: server RSS projected from the stability results.
	BaseRSSMiB     float64 // RSS before the test
	KiBPerDevice   float64
	ProjectedMiB   float64
	AvailableMiB   float64 // of the machine the results were measured on, before the test
	RAMMiB         float64
	MemoryOK       bool
	MemoryHeadroom float64 // available / projected growth
	MemoryOf       string

	Carries bool
	Advice  []string
	Caveats []string
}

// Size computes whether the fleet fits, from the results' measurements.
func Size(rs []*Result, devices int, interval float64, ssl bool) (Sizing, error) {
	s := Sizing{Devices: devices, Interval: interval}
	if devices <= 0 || interval <= 0 {
		return s, fmt.Errorf("want devices > 0 and interval > 0")
	}
	s.NeedReqPerSec = float64(devices) / interval
	lowest, lowestNo := math.Inf(1), math.Inf(1)
	var stab *Result
	hosts := map[string]bool{}
	for _, r := range rs {
		hosts[r.Env.Host+" / "+r.Env.CPUModel] = true
		c := Compute(r)
		switch r.Preset.Kind {
		case benchmark:
			if c.Lowest <= 0 {
				continue
			}
			if r.Preset.SSL == ssl && c.Lowest < lowest {
				lowest, s.ThroughputOf = c.Lowest, r.Title()
			}
			if !r.Preset.SSL && c.Lowest < lowestNo {
				lowestNo = c.Lowest
			}
		case stability:
			if c.Verdict == passed && (stab == nil || r.Preset.Devices > stab.Preset.Devices) {
				stab = r
			}
		}
	}
	if math.IsInf(lowest, 1) {
		kind := "noSSL"
		if ssl {
			kind = "SSL"
		}
		return s, fmt.Errorf("no %s benchmark among the results: run e.g. `drover perf run Bench-6-%s` first", kind, kind)
	}
	if !math.IsInf(lowestNo, 1) {
		s.NoSSLRate = lowestNo
	}
	s.Measured = lowest
	s.SafeCapacity = lowest * rule080.Pct / 100
	s.CPUHeadroom = s.SafeCapacity / s.NeedReqPerSec
	s.ThroughputOK = s.CPUHeadroom >= 1
	if stab != nil && len(stab.Parts) > 0 {
		c := Compute(stab)
		part := stab.Parts[0]
		s.MemoryOf = stab.Title()
		s.BaseRSSMiB, s.KiBPerDevice = c.RSSBefore, c.KiBPerDevice
		s.ProjectedMiB = s.BaseRSSMiB + s.KiBPerDevice*float64(devices)/1024
		s.RAMMiB = stab.Env.ram()
		s.AvailableMiB = part.Before.AvailMiB
		if part.Before.Machine && s.AvailableMiB > 0 {
			growth := s.ProjectedMiB - s.BaseRSSMiB
			s.MemoryHeadroom = math.Inf(1)
			if growth > 0 {
				s.MemoryHeadroom = s.AvailableMiB / growth
			}
			// Keep a fifth of the memory free, as the 80 % rule keeps throughput.
			s.MemoryOK = growth <= 0.8*s.AvailableMiB
		} else {
			s.Caveats = append(s.Caveats, "the stability result has no OS memory figures (a remote server): memory is not judged")
			s.MemoryOK = true
		}
	} else {
		s.Caveats = append(s.Caveats, "no passed stability test among the results: memory is not judged (run e.g. `drover perf run Stab-2-2`)")
		s.MemoryOK = true
	}
	if len(hosts) > 1 {
		s.Caveats = append(s.Caveats, "the results come from more than one machine")
	}
	s.Carries = s.ThroughputOK && s.MemoryOK
	if !s.ThroughputOK {
		s.Advice = append(s.Advice,
			fmt.Sprintf("lengthen the push interval to at least %.0f s, or", math.Ceil(float64(devices)/s.SafeCapacity)),
			fmt.Sprintf("keep at most %s devices at %g s on this machine, or", gi(int(s.SafeCapacity*interval)), interval),
			fmt.Sprintf("give the server about %s× the CPU (more or faster cores)", render.Fixed(1/s.CPUHeadroom, 2)))
		if ssl && s.NoSSLRate > lowest {
			s.Advice = append(s.Advice, fmt.Sprintf("or terminate TLS in front of Drover: without TLS this machine measured %s pushes/s", render.Fixed(s.NoSSLRate, 2)))
		}
	}
	if !s.MemoryOK {
		need := (s.ProjectedMiB - s.BaseRSSMiB) / 0.8
		s.Advice = append(s.Advice, fmt.Sprintf("add memory: the fleet needs about %s MiB available for the server's growth, %s MiB were", render.Fixed(need, 0), render.Fixed(s.AvailableMiB, 0)))
	}
	return s, nil
}

// Write prints the sizing.
func (s Sizing) Write(w io.Writer) {
	fmt.Fprintf(w, "Fleet: %s devices pushing every %g s = %s pushes/s needed.\n\n", gi(s.Devices), s.Interval, render.Fixed(s.NeedReqPerSec, 2))
	fmt.Fprintf(w, "Throughput: lowest measured %s pushes/s (%s); safe capacity 80 %% = %s pushes/s → headroom %s× — %s\n",
		render.Fixed(s.Measured, 2), s.ThroughputOf, render.Fixed(s.SafeCapacity, 2), render.Fixed(s.CPUHeadroom, 2), okText(s.ThroughputOK))
	if s.MemoryOf != "" {
		h := "∞"
		if !math.IsInf(s.MemoryHeadroom, 1) {
			h = render.Fixed(s.MemoryHeadroom, 2) + "×"
		}
		fmt.Fprintf(w, "Memory: server RSS %s MiB + %s KiB/device (%s) → %s MiB projected; %s MiB were available beside the server → headroom %s — %s\n",
			render.Fixed(s.BaseRSSMiB, 1), render.Fixed(s.KiBPerDevice, 2), s.MemoryOf, render.Fixed(s.ProjectedMiB, 0), render.Fixed(s.AvailableMiB, 0), h, okText(s.MemoryOK))
	}
	verdict := "this machine carries the fleet"
	if !s.Carries {
		verdict = "this machine does NOT carry the fleet"
	}
	fmt.Fprintf(w, "\nVerdict: %s.\n", verdict)
	if len(s.Advice) > 0 {
		fmt.Fprintf(w, "To change:\n  - %s\n", strings.Join(s.Advice, "\n  - "))
	}
	for _, c := range s.Caveats {
		fmt.Fprintf(w, "Note: %s.\n", c)
	}
}

func okText(ok bool) string {
	if ok {
		return "enough"
	}
	return "NOT enough"
}
