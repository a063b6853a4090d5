package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/drover/drover/cmd/internal/command"
	"github.com/drover/drover/internal/emulator/results"
	"github.com/drover/drover/internal/report"
)

// report_ is `drover report`.
func report_(ctx context.Context, args []string, env command.Env) error {
	stdin, stdout := env.Stdin, env.Stdout
	fs := flag.NewFlagSet("drover report", flag.ContinueOnError)
	format := fs.String("format", "text", "output format: text, markdown or html (self-contained, with plots)")
	out := fs.String("out", "-", "output file ('-': stdout)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: drover report [--format text|markdown|html] [--out FILE] RESULTS.jsonl...\n\n"+
			"Renders the result streams of drover emulate ('-' reads stdin). Streams of the\n"+
			"shards of one run (--shard, --procs, several machines) are merged exactly.\n\nflags:\n")
		fs.PrintDefaults()
	}
	if err := command.Load(fs, args, env); err != nil {
		return err
	}
	var render func(io.Writer, *results.Merged) error
	switch *format {
	case "text":
		render = report.Text
	case "markdown", "md":
		render = report.Markdown
	case "html":
		render = report.HTML
	default:
		return command.Usagef("--format %q: want text, markdown or html", *format)
	}
	files := fs.Args()
	if len(files) == 0 {
		return command.Usagef("no results file given (drover emulate writes drover-emulate.jsonl; '-' reads stdin)")
	}
	var st results.Stream
	for _, name := range files {
		if err := readResults(&st, name, stdin); err != nil {
			return err
		}
	}
	m, err := st.Merge()
	if err != nil {
		return err
	}
	w := stdout
	if *out != "-" {
		f, err := os.Create(*out)
		if err != nil {
			return err
		}
		defer f.Close()
		w = f
	}
	if err := render(w, m); err != nil {
		return err
	}
	if f, ok := w.(*os.File); ok && f != os.Stdout {
		return f.Close()
	}
	return nil
}

func readResults(st *results.Stream, name string, stdin io.Reader) error {
	if name == "-" {
		if err := st.Read(stdin); err != nil {
			return fmt.Errorf("stdin: %w", err)
		}
		return nil
	}
	f, err := os.Open(name)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := st.Read(f); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}
