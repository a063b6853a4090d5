// Command drover is the Drover fleet server, device agent, emulator and
// performance suite in one binary. Each command is a small function here
// over a library API: it reads its configuration (command.Load: flags,
// DROVER_* environment, config file), calls the library and maps the
// outcome to an exit code.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/drover/drover/cmd/internal/agentcmd"
	"github.com/drover/drover/cmd/internal/command"
)

// cmd is one subcommand.
type cmd struct {
	name, summary string
	run           func(ctx context.Context, args []string, env command.Env) error
}

// commands is every subcommand, in the order `drover help` lists them.
var commands = []cmd{
	{"serve", "run the Drover server", serve},
	{"migrate", "apply pending database migrations (the database of serve's configuration)", migrate},
	{"user", "add, list, change or delete dashboard and API users and their tokens (the first admin)", userCmd},
	{"agent", "run the device agent (register, push state, apply configuration)", func(ctx context.Context, args []string, env command.Env) error {
		return agentcmd.Run(ctx, "drover agent", args, env)
	}},
	{"ctl", "operate a running server through its API: devices, profiles, labels, commands, rollouts, users", ctlCmd},
	{"tunnel", "forward a local port to a host and port as seen from a device (port forwarding)", tunnelCmd},
	{"terminal", "open a shell on a device, or run a command there (remote terminal)", terminalCmd},
	{"files", "copy a file to or from a device (put, get)", filesCmd},
	{"emulate", "emulate a fleet of devices against a server and measure it", emulate},
	{"report", "render drover emulate results as text, Markdown or HTML", report_},
	{"perf", "run the performance tests and write their protocols", perf_},
	{"backup", "copy the database, firmware, secrets and certificates of a running server", backup},
	{"restore", "check a backup is complete and put it in place for a stopped server", restore},
	{"healthcheck", "exit 0 when the server on this host answers (container HEALTHCHECK)", healthcheck},
	{"version", "print the version, commit and Go version (also: drover --version)", version},
}

func main() {
	ctx, reload, stop := command.Signals()
	code := run(ctx, os.Args[1:], command.Env{Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr, Reload: reload})
	stop()
	os.Exit(code)
}

// run runs drover with args (without the program name) and returns the
// exit code.
func run(ctx context.Context, args []string, env command.Env) int {
	if len(args) == 0 {
		usage(env.Stderr)
		return 2
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		usage(env.Stdout)
		return 0
	case "-version", "--version":
		return command.ExitCode("drover", version(ctx, args[1:], env), env.Stderr)
	}
	for _, c := range commands {
		if c.name == args[0] {
			return command.ExitCode("drover "+c.name, c.run(ctx, args[1:], env), env.Stderr)
		}
	}
	fmt.Fprintf(env.Stderr, "drover: unknown command %q\n\n", args[0])
	usage(env.Stderr)
	return 2
}

func usage(w io.Writer) {
	var b strings.Builder
	b.WriteString("usage: drover <command> [flags]\n\ncommands:\n")
	for _, c := range commands {
		fmt.Fprintf(&b, "  %-10s %s\n", c.name, c.summary)
	}
	b.WriteString("\nRun 'drover <command> --help' for a command's flags. Every flag can also be set\n" +
		"as DROVER_<NAME> in the environment or as <name> in a TOML file (--config or\n" +
		"DROVER_CONFIG); a flag wins over the environment, which wins over the file.\n")
	io.WriteString(w, b.String())
}
