// Package perf is `drover perf`: the Stability, Benchmark and Peak tests of
// the seed reports (docs/perf.md), run against a server the suite starts or
// one given by URL, with the seed reports' formulas, verdicts and protocols.
package perf

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"time"

	"github.com/drover/drover/internal/emulator"
)

// kind is a test type.
type kind string

// Test types.
const (
	stability kind = "stability"
	benchmark kind = "benchmark"
	peak      kind = "peak"
	// fleet is the fleet test: the fleet registers (not measured),
	// then every device pushes once per loop time, plain HTTP, a new
	// connection per push, with pass/fail criteria of its own (FleetChecks).
	fleet kind = "fleet"
	// overload is the overload test: the fleet registers, the test measures
	// the server's capacity (closed loop), then offers OverloadFactor × it
	// open loop and checks that the accepted throughput holds.
	overload kind = "overload"
	// rollout is the rollout test: the fleet registers (not measured) and pushes
	// open loop while a firmware rollout to every device runs (rollout.go).
	rollout kind = "rollout"
)

// overloadFactor is the load an overload test offers, in capacities.
const overloadFactor = 1.5

// peakMode says what a Peak test storms the server with.
type peakMode string

// Peak modes (the seed reports' R, D and F).
const (
	peakRegister peakMode = "R" // every device registers at once
	peakData     peakMode = "D" // registered devices push as fast as the threads allow
	peakFull     peakMode = "F" // register, push, receive and acknowledge configuration
)

// Preset is one test of the seed matrix.
type Preset struct {
	Name     string        `json:"name"`
	Kind     kind          `json:"kind"`
	SSL      bool          `json:"ssl"`
	Devices  int           `json:"devices"`
	Threads  int           `json:"threads"`            // emulator threads
	Handlers []int         `json:"handlers,omitempty"` // server handler threads, one run each (Benchmark)
	Loops    int           `json:"loops,omitempty"`    // Benchmark: immediate loops
	Duration time.Duration `json:"duration,omitempty"` // Stability, Peak
	LoopTime int           `json:"loop_time_s"`        // device push interval in seconds
	Mode     peakMode      `json:"peak_mode,omitempty"`
	Rollout  *rolloutSpec  `json:"rollout,omitempty"`
	Repeats  int           `json:"repeats,omitempty"` // Registrar: runs of each cell
	// Conn is how the emulated devices connect ("": --conn, by default a
	// new connection per request).
	Conn emulator.ConnMode `json:"conn,omitempty"`
	// MaxCPUPerPushUS, when set, is a fleet test's further criterion: the
	// server's CPU time per accepted push after the first loop, µs.
	MaxCPUPerPushUS float64 `json:"max_cpu_per_push_us,omitempty"`
	Note            string  `json:"note,omitempty"`
}

// Minutes is the duration in minutes (0 for Benchmark).
func (p Preset) Minutes() float64 { return p.Duration.Minutes() }

// LoopTime of the 0.8.0 matrix, seconds.
const defaultLoopTime = 200

// peakDevices is the Peak tests' fleet.
const peakDevices = 61440

// presets returns the seed matrix (0.8.0 names), as
// /work/shared/docs/perf-methodology.md lists it.
func presets() []Preset {
	var ps []Preset
	stab := func(name string, devices, threads int, minutes int, note string) {
		ps = append(ps, Preset{Name: name, Kind: stability, SSL: true, Devices: devices, Threads: threads,
			Duration: time.Duration(minutes) * time.Minute, LoopTime: defaultLoopTime, Note: note})
	}
	stab("Stab-2-2", 1000, 2, 120, "")
	stab("Stab-4-2", 3000, 4, 120, "")
	stab("Stab-8-2", 10000, 8, 120, "")
	stab("Stab-16-2", 30000, 16, 120, "")
	stab("Stab-4-48", 3000, 4, 2880, "")
	stab("Stab-8-48-top", 40000, 8, 2880, "the 40,000-device target")
	stab("Stab-4-672", 3000, 4, 40320, "four weeks")
	for _, b := range []struct{ threads, devices int }{{6, 1200}, {12, 2400}, {24, 4800}, {48, 9600}} {
		for _, ssl := range []bool{true, false} {
			suffix := "noSSL"
			if ssl {
				suffix = "SSL"
			}
			ps = append(ps, Preset{Name: fmt.Sprintf("Bench-%d-%s", b.threads, suffix), Kind: benchmark, SSL: ssl,
				Devices: b.devices, Threads: b.threads, Handlers: []int{1, 2, 4, 8}, Loops: 10, LoopTime: defaultLoopTime})
		}
	}
	for _, m := range []struct {
		mode peakMode
		note string
	}{{peakRegister, "registration storm"}, {peakData, "data-push storm"}, {peakFull, "full cycle with configuration sync"}} {
		for _, t := range []int{64, 256, 1024} {
			ps = append(ps, Preset{Name: fmt.Sprintf("Peak%s-%d-max", m.mode, t), Kind: peak, Devices: peakDevices, Threads: t,
				Duration: 10 * time.Minute, LoopTime: defaultLoopTime, Mode: m.mode, Note: m.note})
		}
	}
	ps = append(ps, Preset{Name: FleetPreset, Kind: fleet, Devices: 1_000_000, Threads: 15000, Duration: 10 * time.Minute,
		LoopTime: defaultLoopTime, Note: "the fleet test: 1,000,000 devices every 200 s, plain HTTP, a new connection per push"})
	// Over the server's own TLS, as agents without a terminator connect:
	// each device's first push is a full handshake, every later one
	// resumes the session the server gave that device.
	ps = append(ps, Preset{Name: fleetTLSPreset, Kind: fleet, SSL: true, Devices: 500_000, Threads: 15000, Duration: 10 * time.Minute,
		LoopTime: defaultLoopTime, Conn: emulator.ConnResume, MaxCPUPerPushUS: fleetTLSMaxCPUPerPushUS,
		Note: "the fleet test over TLS: 500,000 devices every 200 s, a new TLS connection per push resuming the device's own session, as the agent keeps it"})
	// 100,000 devices: at a capacity of a few thousand pushes/s, each
	// device's interval stays far above the latency under overload, so
	// that devices still busy do not thin out the offered load.
	ps = append(ps, Preset{Name: "Overload-1.5x", Kind: overload, Devices: 100_000, Threads: 64, Duration: time.Minute,
		LoopTime: defaultLoopTime, // the server's push interval; the test's own follows from the capacity
		Note:     "the overload test: capacity (closed loop, 64 workers, 20 s), then 1.5 × capacity offered open loop; plain HTTP, a new connection per push"})
	// 10,000 devices pushing every 30 s take a 16 MiB artifact in waves of
	// 1 %, 10 %, 100 %, at most 1,000 at once, each over a 512 KiB/s link
	// that drops 5 % of the attempts; the duration is a time limit.
	ps = append(ps, Preset{Name: "Rollout-10k", Kind: rollout, SSL: true, Devices: 10_000, Threads: 2000, Duration: 45 * time.Minute,
		LoopTime: 30, Rollout: &rolloutSpec{ArtifactMiB: 16, Waves: []string{"1%", "10%", "100%"}, MaxDownloads: 1000, LinkBps: 512 << 10, FailRate: 0.05},
		Note: "the rollout test: a 16 MiB firmware to every device in three waves, at most 1,000 downloads at once, 512 KiB/s per device, 5 % of download attempts cut and resumed"})
	ps = append(ps, registrarPresetDef())
	return ps
}

// FleetPreset is the name of the fleet test (`drover perf fleet`).
const FleetPreset = "Fleet-1M"

// fleetTLSPreset is the fleet test over the server's own TLS (`drover perf run Fleet-TLS-500k`).
const fleetTLSPreset = "Fleet-TLS-500k"

// Lookup finds a preset by name, case-insensitively.
func Lookup(name string) (Preset, bool) {
	for _, p := range presets() {
		if strings.EqualFold(p.Name, name) {
			return p, true
		}
	}
	return Preset{}, false
}

// override changes a preset for a quick look; zero fields keep the preset's.
type override struct {
	Scale    float64       // multiplies devices and duration (0 < scale ≤ 1); a fleet test's devices only
	Devices  int           // replaces devices (after scale)
	Duration time.Duration // replaces duration (after scale)
	LoopTime int           // replaces loop time, seconds
	Handlers []int         // replaces server handler threads
	Threads  int           // replaces emulator threads
	Repeats  int           // replaces a registrar test's runs per cell
}

// Apply returns p changed by o, and a description of the changes ("" when
// p is unchanged).
func (o override) Apply(p Preset) (Preset, string, error) {
	orig := p
	var notes []string
	if o.Scale < 0 || o.Scale > 1 {
		return p, "", fmt.Errorf("scale %g: want 0 < scale ≤ 1", o.Scale)
	}
	if o.Scale > 0 && o.Scale < 1 {
		p.Devices = max(1, int(math.Ceil(float64(p.Devices)*o.Scale)))
		// A fleet test keeps its duration and per-device interval: the
		// scaled fleet offers the same load per device, scale × the pushes/s.
		if p.Duration > 0 && p.Kind != fleet && p.Kind != overload && p.Kind != rollout {
			p.Duration = max(time.Second, time.Duration(float64(p.Duration)*o.Scale).Round(time.Second))
		}
		notes = append(notes, fmt.Sprintf("scale %g", o.Scale))
	}
	if o.Devices < 0 || o.Duration < 0 || o.LoopTime < 0 || o.Threads < 0 || o.Repeats < 0 {
		return p, "", fmt.Errorf("overrides must be positive")
	}
	if o.Devices > 0 {
		p.Devices = o.Devices
	}
	if o.Duration > 0 {
		if p.Kind == benchmark {
			return p, "", fmt.Errorf("%s: a benchmark runs %d loops, it has no duration", p.Name, p.Loops)
		}
		p.Duration = o.Duration
	}
	if o.LoopTime > 0 {
		p.LoopTime = o.LoopTime
	}
	if o.Threads > 0 {
		p.Threads = o.Threads
	}
	if o.Repeats > 0 {
		if p.Kind != registrar {
			return p, "", fmt.Errorf("%s: only a registrar test repeats its runs", p.Name)
		}
		p.Repeats = o.Repeats
	}
	if len(o.Handlers) > 0 {
		for _, h := range o.Handlers {
			if h < 1 {
				return p, "", fmt.Errorf("handler threads must be positive")
			}
		}
		p.Handlers = append([]int(nil), o.Handlers...)
	}
	if p.Devices != orig.Devices {
		notes = append(notes, fmt.Sprintf("%d devices instead of %d", p.Devices, orig.Devices))
	}
	if p.Duration != orig.Duration {
		notes = append(notes, fmt.Sprintf("%s instead of %s", fmtDuration(p.Duration), fmtDuration(orig.Duration)))
	}
	if p.LoopTime != orig.LoopTime {
		notes = append(notes, fmt.Sprintf("loop time %d s instead of %d s", p.LoopTime, orig.LoopTime))
	}
	if p.Threads != orig.Threads {
		notes = append(notes, fmt.Sprintf("%d emulator threads instead of %d", p.Threads, orig.Threads))
	}
	if p.Repeats != orig.Repeats {
		notes = append(notes, fmt.Sprintf("%d run(s) per cell instead of %d", p.Repeats, orig.Repeats))
	}
	if fmt.Sprint(p.Handlers) != fmt.Sprint(orig.Handlers) {
		notes = append(notes, fmt.Sprintf("handler threads %s instead of %s", joinInts(p.Handlers), joinInts(orig.Handlers)))
	}
	if len(notes) == 1 && strings.HasPrefix(notes[0], "scale") {
		notes = nil // scale 1 or a scale that changed nothing
	}
	return p, strings.Join(notes, ", "), nil
}

func joinInts(xs []int) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = fmt.Sprint(x)
	}
	return strings.Join(s, ",")
}

// fmtDuration prints whole hours, minutes or seconds as a person would.
func fmtDuration(d time.Duration) string {
	switch {
	case d == 0:
		return "—"
	case d%time.Hour == 0 && d >= 48*time.Hour && d%(24*time.Hour) == 0:
		return fmt.Sprintf("%d days", d/(24*time.Hour))
	case d%time.Hour == 0:
		return fmt.Sprintf("%d h", d/time.Hour)
	case d%time.Minute == 0:
		return fmt.Sprintf("%d min", d/time.Minute)
	default:
		return fmt.Sprintf("%d s", d/time.Second)
	}
}

// sortPresets orders presets as the matrix does.
func sortPresets(ps []Preset) {
	order := map[string]int{}
	for i, p := range presets() {
		order[p.Name] = i
	}
	sort.SliceStable(ps, func(i, j int) bool { return order[ps[i].Name] < order[ps[j].Name] })
}
