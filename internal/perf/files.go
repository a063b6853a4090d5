package perf

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"text/tabwriter"
)

// List writes the table of presets.
func List(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tTYPE\tSSL\tDEVICES\tTHREADS\tHANDLERS\tLOOPS\tDURATION\tLOOP TIME\tNOTE")
	for _, p := range presets() {
		loops, hs := "—", "—"
		if p.Loops > 0 {
			loops = strconv.Itoa(p.Loops)
		}
		if len(p.Handlers) > 0 {
			hs = joinInts(p.Handlers)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\t%s\t%s\t%d s\t%s\n", p.Name, p.Kind, yesNo(p.SSL), p.Devices, p.Threads, hs, loops,
			fmtDuration(p.Duration), p.LoopTime, p.Note)
	}
	return tw.Flush()
}

// WriteReports writes r's JSON, Markdown and HTML into dir.
func WriteReports(r *Result, dir string) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	base := filepath.Join(dir, r.FileBase())
	if err := r.Save(base + ".json"); err != nil {
		return nil, err
	}
	if err := os.WriteFile(base+".md", []byte(markdownOf(r)), 0o644); err != nil {
		return nil, err
	}
	if err := os.WriteFile(base+".html", []byte(htmlProtocol(r)), 0o644); err != nil {
		return nil, err
	}
	return []string{base + ".md", base + ".html", base + ".json"}, nil
}
