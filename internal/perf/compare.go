package perf

import (
	"fmt"
	"io"
	"math"
	"strings"
	"text/tabwriter"

	"github.com/drover/drover/internal/render"
)

// figures are the three numbers the version comparison looks at.
type figures struct {
	RSSMiB       float64 // server RSS after the stability test
	KiBPerDevice float64
	PushesPerSec float64 // benchmark: lowest SSL throughput, else lowest measured
	From         []string
}

// figuresOf collects the comparison figures from results: RSS and KiB per
// device from the stability tests (the largest fleet), pushes/s from the
// benchmarks (SSL preferred, the lowest). NaN marks a figure not measured.
func figuresOf(rs []*Result) figures {
	f := figures{RSSMiB: math.NaN(), KiBPerDevice: math.NaN(), PushesPerSec: math.NaN()}
	stabDevices := -1
	var benchSSL, benchAny = math.Inf(1), math.Inf(1)
	var benchFrom, anyFrom string
	for _, r := range rs {
		c := Compute(r)
		switch r.Preset.Kind {
		case stability:
			if r.Preset.Devices > stabDevices {
				stabDevices = r.Preset.Devices
				f.RSSMiB, f.KiBPerDevice = c.RSSAfter, c.KiBPerDevice
				f.From = append(f.From, r.Title())
			}
		case benchmark:
			if c.Lowest <= 0 {
				continue
			}
			if r.Preset.SSL && c.Lowest < benchSSL {
				benchSSL, benchFrom = c.Lowest, r.Title()
			}
			if c.Lowest < benchAny {
				benchAny, anyFrom = c.Lowest, r.Title()
			}
		}
	}
	switch {
	case !math.IsInf(benchSSL, 1):
		f.PushesPerSec = benchSSL
		f.From = append(f.From, benchFrom)
	case !math.IsInf(benchAny, 1):
		f.PushesPerSec = benchAny
		f.From = append(f.From, anyFrom)
	}
	return f
}

// judge grades a % of previous: resources may grow up to 120 %, throughput
// may fall to 80 % (the reports' rule).
func judge(pct float64, resource bool) string {
	if math.IsNaN(pct) {
		return "—"
	}
	if resource {
		switch {
		case pct <= 100:
			return "success"
		case pct <= 120:
			return "acceptable"
		}
		return "regression"
	}
	switch {
	case pct >= 100:
		return "success"
	case pct >= 80:
		return "acceptable"
	}
	return "regression"
}

// Compare writes the version comparison of new against previous.
func Compare(w io.Writer, prevName string, prev []*Result, curName string, cur []*Result) error {
	a, b := figuresOf(prev), figuresOf(cur)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "\tRAM – RSS MiB\t% of previous\tKiB per device\t% of previous\tPushes/sec\t% of previous\t")
	val := func(v float64, prec int) string {
		if math.IsNaN(v) {
			return "—"
		}
		return render.Fixed(v, prec)
	}
	pct := func(v, p float64) float64 {
		if math.IsNaN(v) || math.IsNaN(p) || p == 0 {
			return math.NaN()
		}
		return pctOfPrevious(v, p)
	}
	fmt.Fprintf(tw, "%s\t%s\t100\t%s\t100\t%s\t100\t\n", prevName, val(a.RSSMiB, 1), val(a.KiBPerDevice, 2), val(a.PushesPerSec, 2))
	r, k, s := pct(b.RSSMiB, a.RSSMiB), pct(b.KiBPerDevice, a.KiBPerDevice), pct(b.PushesPerSec, a.PushesPerSec)
	fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", curName, val(b.RSSMiB, 1), val(r, 0), val(b.KiBPerDevice, 2), val(k, 0), val(b.PushesPerSec, 2), val(s, 0))
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "\nRSS: %s; KiB per device: %s; pushes/s: %s\n", judge(r, true), judge(k, true), judge(s, false))
	fmt.Fprintln(w, "Rule: 100 % is success; 101–120 % of resources and 80–99 % of throughput are acceptable.")
	fmt.Fprintf(w, "Previous from: %s\nCurrent from:  %s\n", fromText(a.From), fromText(b.From))
	return nil
}

func fromText(s []string) string {
	if len(s) == 0 {
		return "—"
	}
	return strings.Join(s, "; ")
}
