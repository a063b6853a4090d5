// Package cli dispatches drover's subcommands.
package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"

	"github.com/drover/drover/internal/agent"
	"github.com/drover/drover/internal/emulator"
	"github.com/drover/drover/internal/perf"
	"github.com/drover/drover/internal/report"
	"github.com/drover/drover/internal/server"
	"github.com/drover/drover/internal/store"
)

// Env is what a subcommand gets from the process.
type Env struct {
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
	Getenv func(string) string
}

// Command runs one subcommand with its arguments.
type Command struct {
	Summary string
	Run     func(ctx context.Context, args []string, env Env) error
}

func commands() map[string]Command {
	return map[string]Command{
		"agent": {"run the device agent (register, push state, apply configuration)", func(ctx context.Context, args []string, env Env) error {
			return agent.Main(ctx, args, env.Stdout, env.Stderr)
		}},
		"emulate": {"emulate a fleet of devices against a server and measure it", func(ctx context.Context, args []string, env Env) error {
			return emulator.Main(ctx, args, env.Stdout, env.Stderr)
		}},
		"report": {"render drover emulate results as text, Markdown or HTML", func(ctx context.Context, args []string, env Env) error {
			return report.Main(ctx, args, env.Stdin, env.Stdout, env.Stderr)
		}},
		"perf": {"run the performance tests and write their protocols", func(ctx context.Context, args []string, env Env) error {
			exe, err := os.Executable()
			if err != nil {
				return err
			}
			return perf.Main(ctx, args, env.Stdout, env.Stderr, []string{exe, "serve"}, server.Version())
		}},
		"migrate": {"apply pending database migrations (--db DSN)", func(ctx context.Context, args []string, env Env) error {
			return store.MigrateMain(ctx, args, env.Stdout, env.Stderr, env.Getenv)
		}},
		"serve": {"run the Drover server", func(ctx context.Context, args []string, env Env) error {
			return server.Main(ctx, args, env.Stdout, env.Stderr, env.Getenv)
		}},
		"version": {"print the version", func(_ context.Context, _ []string, env Env) error {
			_, err := fmt.Fprintln(env.Stdout, "drover", server.Version())
			return err
		}},
	}
}

// ExitError carries a specific exit code.
type ExitError struct{ Code int }

func (e ExitError) Error() string { return fmt.Sprintf("exit %d", e.Code) }

// Run runs drover with args (without the program name) and returns the
// process exit code.
func Run(ctx context.Context, args []string, env Env) int {
	cmds := commands()
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(env.Stderr, cmds)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	cmd, ok := cmds[args[0]]
	if !ok {
		fmt.Fprintf(env.Stderr, "drover: unknown command %q\n\n", args[0])
		usage(env.Stderr, cmds)
		return 2
	}
	if err := cmd.Run(ctx, args[1:], env); err != nil {
		var exit ExitError
		if e, ok := err.(ExitError); ok {
			exit = e
			return exit.Code
		}
		if err.Error() == "flag: help requested" {
			return 0
		}
		fmt.Fprintf(env.Stderr, "drover %s: %v\n", args[0], err)
		return 1
	}
	return 0
}

func usage(w io.Writer, cmds map[string]Command) {
	names := make([]string, 0, len(cmds))
	for n := range cmds {
		names = append(names, n)
	}
	sort.Strings(names)
	var b strings.Builder
	b.WriteString("usage: drover <command> [flags]\n\ncommands:\n")
	for _, n := range names {
		fmt.Fprintf(&b, "  %-10s %s\n", n, cmds[n].Summary)
	}
	b.WriteString("\nRun 'drover <command> --help' for a command's flags.\n")
	io.WriteString(w, b.String())
}
