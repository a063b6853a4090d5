package perf

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/drover/drover/internal/emulator/results"
	"github.com/drover/drover/internal/render"
	"github.com/drover/drover/internal/render/doc"
)

// RampRun is an emulator ramp (`drover emulate --mode ramp`): closed loop
// with rising workers until requests are dropped. perf summary shows where
// its drops began beside the Peak tests'.
type RampRun struct {
	File, Host, Version, Target string
	Steps                       []rampStep
	Outcome                     results.Ramp
}

type rampStep struct {
	Workers int
	Rate    float64 // accepted pushes per second
	Broke   bool
}

// LoadRamps reads the ramp runs among emulator result streams (*.jsonl
// files, or those in directories); other streams are skipped.
func LoadRamps(paths ...string) ([]RampRun, error) {
	var files []string
	for _, p := range paths {
		st, err := os.Stat(p)
		if err != nil {
			return nil, err
		}
		if st.IsDir() {
			fs, _ := filepath.Glob(filepath.Join(p, "*.jsonl"))
			sort.Strings(fs)
			files = append(files, fs...)
		} else if strings.HasSuffix(p, ".jsonl") {
			files = append(files, p)
		}
	}
	var out []RampRun
	for _, f := range files {
		fh, err := os.Open(f)
		if err != nil {
			return nil, err
		}
		var s results.Stream
		err = s.Read(fh)
		fh.Close()
		if err != nil {
			continue // not an emulator stream
		}
		m, err := s.Merge()
		if err != nil || len(m.Starts) == 0 || m.Starts[0].Mode != "ramp" || m.Summary == nil || m.Summary.Ramp == nil {
			continue
		}
		st := m.Starts[0]
		r := RampRun{File: f, Host: st.Host, Version: st.Version, Target: st.Target, Outcome: *m.Summary.Ramp}
		for _, step := range m.Steps {
			r.Steps = append(r.Steps, rampStep{Workers: step.Concurrency, Rate: step.Rate(results.OpPush), Broke: step.Broke})
		}
		out = append(out, r)
	}
	return out, nil
}

// rampSection lists where each ramp's drops began.
func rampSection(b *strings.Builder, ramps []RampRun) {
	if len(ramps) == 0 {
		return
	}
	b.WriteString("\n## Ramp: where drops begin\n\nEmulator ramps (`drover emulate --mode ramp`): closed loop, the workers rising step by step until requests are dropped, resent or answered 5xx; each step's accepted pushes per second.\n\n")
	b.WriteString("| run | load host | version | target | workers: accepted/s | drops begin |\n|---|---|---|---|---|---|\n")
	for _, r := range ramps {
		var cells []string
		lastClean := 0
		for _, s := range r.Steps {
			mark := ""
			if s.Broke {
				mark = " (drops)"
			} else if r.Outcome.BreakingConcurrency == 0 || s.Workers < r.Outcome.BreakingConcurrency {
				lastClean = s.Workers
			}
			cells = append(cells, fmt.Sprintf("%d: %s/s%s", s.Workers, render.Fixed(s.Rate, 0), mark))
		}
		begins := "no drops up to the last step"
		if bc := r.Outcome.BreakingConcurrency; bc > 0 {
			begins = fmt.Sprintf("at %d workers", bc)
			if lastClean > 0 {
				begins = fmt.Sprintf("between %d and %d workers", lastClean, bc)
			}
		}
		if r.Outcome.BestConcurrency > 0 {
			begins += fmt.Sprintf("; best clean step %d workers at %s/s", r.Outcome.BestConcurrency, render.Fixed(r.Outcome.BestRate, 0))
		}
		fmt.Fprintf(b, "| %s | %s | %s | %s | %s | %s |\n", doc.Cell(filepath.Base(r.File)), doc.Cell(r.Host), doc.Cell(r.Version), doc.Cell(r.Target), doc.Cell(strings.Join(cells, "; ")), doc.Cell(begins))
	}
}
