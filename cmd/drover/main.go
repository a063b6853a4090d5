// Command drover is the Drover fleet server, device agent, emulator and
// performance suite in one binary.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/drover/drover/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Run(ctx, os.Args[1:], cli.Env{Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr, Getenv: os.Getenv})
	stop()
	os.Exit(code)
}
