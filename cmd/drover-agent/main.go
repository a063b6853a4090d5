// Command drover-agent is the Drover device agent alone, small enough for
// routers; `drover agent` is the same program inside the full binary.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/drover/drover/internal/agent"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := agent.MainAs(ctx, "drover-agent", os.Args[1:], os.Stdout, os.Stderr)
	stop()
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
	default:
		fmt.Fprintln(os.Stderr, "drover-agent:", err)
		os.Exit(1)
	}
}
