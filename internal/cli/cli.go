// Package cli dispatches drover's subcommands.
package cli

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/drover/drover/internal/server"
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
