// Command drover-agent is the Drover device agent alone, small enough for
// routers; `drover agent` is the same program inside the full binary.
package main

import (
	"os"

	"github.com/drover/drover/cmd/internal/agentcmd"
	"github.com/drover/drover/cmd/internal/command"
)

func main() {
	ctx, reload, stop := command.Signals()
	err := agentcmd.Run(ctx, "drover-agent", os.Args[1:], command.Env{Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr, Reload: reload})
	stop()
	os.Exit(command.ExitCode("drover-agent", err, os.Stderr))
}
