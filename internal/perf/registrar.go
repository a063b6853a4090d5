package perf

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/drover/drover/internal/emulator"
	"github.com/drover/drover/internal/render"
	"github.com/drover/drover/internal/render/doc"
)

// registrar is the seed's registrar tables: registrations
// per second by persistence mode × server handler threads × machine-ID
// kind, each cell repeated on a fresh server, with the spread of the runs.
const registrar kind = "registrar"

// RegistrarPreset is the registrar test's name.
const RegistrarPreset = "Registrar-1M"

// The registrar test's matrix besides the handler threads (Preset.Handlers).
var (
	registrarPersistence = []string{"memory", "write-through", "write-back"}
	registrarIDs         = []string{emulator.MachineIDsSequential, emulator.MachineIDsRandom}
)

// registrarDefaults are the preset's repeats and handler threads: 1 and 2,
// the Benchmark presets' list (1, 2, 4, 8) capped at the reference
// machine's 2 cores (--handlers 1,2,4,8 gives the seed's process counts).
const registrarRepeats = 2

func registrarPresetDef() Preset {
	return Preset{Name: RegistrarPreset, Kind: registrar, Devices: 1_000_000, Threads: 8, Handlers: []int{1, 2},
		Repeats: registrarRepeats, LoopTime: defaultLoopTime,
		Note: "the registrar tables: registrations/s by persistence mode × handler threads × machine IDs (sequential, random), each cell on a fresh server, repeated"}
}

// runRegistrar runs every cell of the registrar matrix Repeats times: one
// fresh server per run (runPart), the devices registering closed loop on
// kept-alive connections. Repetition k runs every cell before k+1 starts,
// so that a slow spell of the machine spreads over the cells.
func runRegistrar(ctx context.Context, r *Result, p Preset, handlers []int, modes []string, o Options) error {
	if o.URL != "" {
		return fmt.Errorf("%s starts a server per persistence mode: drop --url", p.Name)
	}
	o.Conn = emulator.ConnKeepAlive
	r.Setup.Conn = string(o.Conn)
	r.Setup.Persistence = strings.Join(modes, ", ") + " (a fresh server per run)"
	r.Setup.Backend = backendName(o.DB, "write-through") + " (write-through and write-back)"
	for rep := 1; rep <= max(p.Repeats, 1); rep++ {
		for _, mode := range modes {
			for _, h := range handlers {
				for _, ids := range registrarIDs {
					o.Persistence, o.machineIDs = mode, ids
					part, err := runPart(ctx, r, p, h, o)
					part.Persistence, part.MachineIDs, part.Repeat = mode, ids, rep
					r.Parts = append(r.Parts, part)
					if err != nil {
						return err
					}
					if ctx.Err() != nil {
						return ctx.Err()
					}
				}
			}
		}
	}
	return nil
}

// registrarModesOf is the persistence modes a registrar test runs: every
// mode, or those of --persistence (comma-separated, in the test's order).
// Other tests take one mode.
func registrarModesOf(p Preset, persistence string) ([]string, error) {
	if p.Kind != registrar {
		if strings.Contains(persistence, ",") {
			return nil, fmt.Errorf("--persistence %q: %s runs one persistence mode", persistence, p.Name)
		}
		return nil, nil
	}
	if persistence == "" {
		return registrarPersistence, nil
	}
	want := map[string]bool{}
	for _, m := range strings.Split(persistence, ",") {
		m = strings.TrimSpace(m)
		if !slices.Contains(registrarPersistence, m) {
			return nil, fmt.Errorf("--persistence %q: %q is not one of %s", persistence, m, strings.Join(registrarPersistence, ", "))
		}
		want[m] = true
	}
	var modes []string
	for _, m := range registrarPersistence {
		if want[m] {
			modes = append(modes, m)
		}
	}
	return modes, nil
}

// registrarCell is one cell of the registrar table: its runs' rates and
// their spread, and the server's CPU per registration.
type registrarCell struct {
	Persistence string
	Handlers    int
	MachineIDs  string
	Rates       []float64 // accepted registrations / elapsed, one per run, in run order
	Median      float64
	Min, Max    float64
	SpreadPct   float64 // (max − min) / median
	CPUUs       float64 // server CPU seconds between the part's snapshots / accepted registrations, µs
	Accepted    int64   // over the runs
	Errors      int64   // rejected, dropped or retried, over the runs
	EmuCPU      float64 // emulator cores busy, mean of the runs
}

// computeRegistrar groups a registrar test's parts into its cells, in the
// matrix's order.
func computeRegistrar(r *Result, c *Calc) {
	var cpuSecs []float64
	for _, part := range r.Parts {
		i := slices.IndexFunc(c.Cells, func(x registrarCell) bool {
			return x.Persistence == part.Persistence && x.Handlers == part.HandlerThreads && x.MachineIDs == part.MachineIDs
		})
		if i < 0 {
			c.Cells = append(c.Cells, registrarCell{Persistence: part.Persistence, Handlers: part.HandlerThreads, MachineIDs: part.MachineIDs})
			cpuSecs = append(cpuSecs, 0)
			i = len(c.Cells) - 1
		}
		cell := &c.Cells[i]
		op := part.Register
		cell.Rates = append(cell.Rates, pushesPerSec(op.Accepted, op.ElapsedSec))
		cell.Accepted += op.Accepted
		cell.Errors += op.ErrOrRetried()
		cell.EmuCPU += part.Emulator.CPUAvg
		cpuSecs[i] += max(0, part.After.CPUSecs-part.Before.CPUSecs)
	}
	for i := range c.Cells {
		cell := &c.Cells[i]
		sorted := slices.Sorted(slices.Values(cell.Rates))
		cell.Median, cell.Min, cell.Max = median(sorted), sorted[0], sorted[len(sorted)-1]
		cell.SpreadPct = safeDiv(cell.Max-cell.Min, cell.Median) * 100
		cell.CPUUs = safeDiv(cpuSecs[i], float64(cell.Accepted)) * 1e6
		cell.EmuCPU /= float64(len(cell.Rates))
	}
}

// registrarSections is the registrar test's protocol: the seed's table,
// then each run.
func registrarSections(d *doc.Doc, r *Result, c *Calc) {
	d.Heading("Registrar")
	t := doc.NewTable("persistence", "handler threads", "machine IDs", "registrations / s, each run", "median", "min – max (spread)", "server CPU / registration (µs)", "errors")
	for _, cell := range c.Cells {
		runs := make([]string, len(cell.Rates))
		for i, v := range cell.Rates {
			runs[i] = render.Fixed(v, 0)
		}
		t.Row(cell.Persistence, handlersText(r, cell.Handlers), cell.MachineIDs, strings.Join(runs, " / "), render.Fixed(cell.Median, 0),
			render.Fixed(cell.Min, 0)+" – "+render.Fixed(cell.Max, 0)+" ("+render.Fixed(cell.SpreadPct, 1)+" %)", render.Fixed(cell.CPUUs, 1), group(cell.Errors))
	}
	d.Table(t)

	d.Heading("Resources")
	t = doc.NewTable("run", "elapsed time / s", "accepted registrations", "registrations / s", "p50 / p99 latency (ms)", "server RSS after (MiB)", "emulator CPU (cores)")
	for _, part := range r.Parts {
		op := part.Register
		t.Row(partName(r, part), render.Fixed(op.ElapsedSec, 2), group(op.Accepted), render.Fixed(pushesPerSec(op.Accepted, op.ElapsedSec), 0),
			render.Fixed(op.LatencyMs.P50, 1)+" / "+render.Fixed(op.LatencyMs.P99, 1), render.Fixed(part.After.RSSMiB, 1), render.Fixed(part.Emulator.CPUAvg, 2))
	}
	d.Table(t)
	opBreakdown(d, r)
}

// registrarPartName names one run of a registrar test.
func registrarPartName(part resultPart) string {
	return fmt.Sprintf("%s, %d handler thread(s), %s IDs, run %d", part.Persistence, part.HandlerThreads, part.MachineIDs, part.Repeat)
}

func registrarNotes(r *Result) []string {
	p := r.Preset
	return []string{
		fmt.Sprintf("Each run starts a fresh server (`--persistence MODE --threads N`, an empty database) and registers %s devices closed loop: %d workers on kept-alive connections, plain HTTP, each registering its next device as soon as the last is answered. Registrations/s = accepted registrations / elapsed (first request to last answer). The run order is every cell once, then again, %d time(s).", gi(p.Devices), p.Threads, max(p.Repeats, 1)),
		"Machine IDs: sequential = a per-run prefix of 8 hex digits and the device index zero-padded to 24 digits (they sort in registration order); random = 32 hex digits hashed from the seed and the index (`drover emulate --machine-ids`). Both are 32 characters, as the seed's constant-length user names.",
		"Spread = (max − min) / median of the cell's runs. Server CPU / registration = the server's CPU time between the snapshots before and after the run (a 2 s settle before it included) / accepted registrations.",
		"--conn does not apply: the test runs on kept-alive connections; --persistence (comma-separated) picks the persistence modes, by default all three.",
	}
}

// registrarFigure is the registrar test's line in the perf summary.
func registrarFigure(c *Calc) string {
	var cells []string
	for _, cell := range c.Cells {
		cells = append(cells, fmt.Sprintf("%s/%d/%s: %s (spread %s %%)", cell.Persistence, cell.Handlers, cell.MachineIDs, render.Fixed(cell.Median, 0), render.Fixed(cell.SpreadPct, 1)))
	}
	return "median registrations/s by persistence/handler threads/machine IDs — " + strings.Join(cells, ", ")
}
