package perf

import (
	"fmt"
	"io"
	"strings"

	"github.com/drover/drover/internal/render"
	"github.com/drover/drover/internal/render/doc"
)

// Summary writes a Markdown index of results: one row per test with its
// verdict, headline figures and protocol files, then the commands that
// produced them; ramps add where their drops began.
func Summary(w io.Writer, rs []*Result, ramps ...RampRun) error {
	sortResults(rs)
	var b strings.Builder
	b.WriteString("| test | verdict | figures | protocol |\n|---|---|---|---|\n")
	var cmds []string
	tests := map[string][]string{}
	for _, r := range rs {
		c := Compute(r)
		var fig string
		switch r.Preset.Kind {
		case stability:
			fig = fmt.Sprintf("%s devices, RSS %s → %s MiB (%s KiB/device), RAM utilisation %s %%, rough %s req/s, push errors %s %%",
				gi(r.Preset.Devices), render.Fixed(c.RSSBefore, 1), render.Fixed(c.RSSAfter, 1), render.Fixed(c.KiBPerDevice, 2), render.Fixed(c.RAMUtilPct, 2), render.Fixed(c.RoughReqPerSec, 2), render.Fixed(c.PushErrPct, 3))
		case fleet:
			fig = fmt.Sprintf("%s devices every %d s: p99 %s ms from the intended send time, median %s accepted/s (lowest %s), RSS %s bytes/device",
				gi(r.Preset.Devices), r.Preset.LoopTime, render.Fixed(c.P99Ms, 1), render.Fixed(c.MedianPerSec, 0), render.Fixed(c.MinPerSec, 0), render.Fixed(c.BytesPerDev, 0))
		case overload:
			if len(r.Parts) > 0 && r.Parts[0].Capacity != nil {
				capa := r.Parts[0].Capacity
				fig = fmt.Sprintf("capacity %s pushes/s, offered %s/s: accepted %s/s (median second), %s × capacity", render.Fixed(capa.PerSec, 0), render.Fixed(capa.Offered, 0), render.Fixed(c.MedianPerSec, 0), render.Fixed(safeDiv(c.MedianPerSec, capa.PerSec), 2))
			}
		case benchmark:
			var rates []string
			for _, row := range c.Rows {
				rates = append(rates, fmt.Sprintf("%s: %s", handlersText(r, row.Handlers), render.Fixed(row.PushesPerSec, 2)))
			}
			fig = "pushes/s by handler threads — " + strings.Join(rates, ", ")
			if c.Safe080 > 0 {
				fig += fmt.Sprintf("; safe max %s devices at %d s", gi(c.Safe080), r.Preset.LoopTime)
			}
		case registrar:
			fig = registrarFigure(&c)
		case peak:
			unit := "pushes/s"
			if r.Preset.Mode == peakRegister {
				unit = "registrations/s"
			}
			for _, row := range c.Rows {
				fig = fmt.Sprintf("%s %s at %d threads, error-or-retried %s %%", render.Fixed(row.PushesPerSec, 2), unit, r.Preset.Threads, render.Fixed(row.ErrPct, 3))
			}
		}
		base := r.FileBase()
		fmt.Fprintf(&b, "| %s | %s | %s | [%s.md](%s.md), [%s.html](%s.html) |\n",
			doc.Cell(r.Title()), c.Verdict, doc.Cell(fig), base, base, base, base)
		if tests[r.Command] == nil {
			cmds = append(cmds, r.Command)
		}
		tests[r.Command] = append(tests[r.Command], r.Preset.Name)
	}
	environmentsSection(&b, rs)
	rampSection(&b, ramps)
	b.WriteString("\nCommands:\n")
	for _, cmd := range cmds {
		fmt.Fprintf(&b, "\n- %s:\n\n  ```sh\n  %s\n  ```\n", strings.Join(tests[cmd], ", "), cmd)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// sortResults orders results as the matrix does.
func sortResults(rs []*Result) {
	order := map[string]int{}
	for i, p := range presets() {
		order[p.Name] = i
	}
	for i := 1; i < len(rs); i++ {
		for j := i; j > 0 && order[rs[j].Preset.Name] < order[rs[j-1].Preset.Name]; j-- {
			rs[j], rs[j-1] = rs[j-1], rs[j]
		}
	}
}
