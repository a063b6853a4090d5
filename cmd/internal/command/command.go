// Package command is what every drover command shares: the one
// configuration loader (flags, then DROVER_* environment, then a TOML
// config file named by --config or DROVER_CONFIG, then the default), the
// exit codes (0 done or help requested, 1 failed, 2 usage error, or the
// code an error carries: Coded), signals and the process logger.
package command

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
)

// Env is what a command gets from the process.
type Env struct {
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
	Getenv func(string) string // nil: os.Getenv
	// Reload receives a value for each SIGHUP. A command that has nothing
	// to reload leaves it alone: SIGHUP is then ignored, never fatal.
	Reload <-chan struct{}
}

func (e Env) getenv() func(string) string {
	if e.Getenv == nil {
		return os.Getenv
	}
	return e.Getenv
}

// Var is the environment variable k.
func (e Env) Var(k string) string { return e.getenv()(k) }

// UsageError is a wrong invocation: exit code 2.
type UsageError struct {
	Err     error
	Printed bool // already written to stderr (by the flag package)
}

func (e UsageError) Error() string { return e.Err.Error() }
func (e UsageError) Unwrap() error { return e.Err }

// Usage marks err as a usage error (nil stays nil).
func Usage(err error) error {
	if err == nil {
		return nil
	}
	return UsageError{Err: err}
}

// Coded is an error with an exit code of its own, such as drover ctl's
// codes for the API's answers (docs/ctl.md).
type Coded interface {
	error
	ExitCode() int
}

// ExitCode reports err on stderr as prog's and returns the exit code:
// 0 for nil and requested help, 2 for usage errors, a Coded error's code,
// 1 otherwise.
func ExitCode(prog string, err error, stderr io.Writer) int {
	var ue UsageError
	var coded Coded
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &ue):
		if !ue.Printed {
			fmt.Fprintf(stderr, "%s: %v\n", prog, err)
		}
		return 2
	case errors.As(err, &coded) && coded.ExitCode() != 0:
		fmt.Fprintf(stderr, "%s: %v\n", prog, err)
		return coded.ExitCode()
	}
	fmt.Fprintf(stderr, "%s: %v\n", prog, err)
	return 1
}

// Signals is the process's signal handling: ctx ends at the first SIGINT
// or SIGTERM (commands drain and exit 0), and each SIGHUP is offered on
// reload without blocking. stop restores the defaults.
func Signals() (ctx context.Context, reload <-chan struct{}, stop func()) {
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	rc := make(chan struct{}, 1)
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-hup:
				select {
				case rc <- struct{}{}:
				default: // a reload is already pending
				}
			case <-done:
				return
			}
		}
	}()
	return ctx, rc, func() {
		signal.Stop(hup)
		close(done)
		cancel()
	}
}

// NewLogger builds a process logger whose level can change while it runs.
func NewLogger(w io.Writer, format, level string) (*slog.Logger, *slog.LevelVar, error) {
	lv := new(slog.LevelVar)
	if err := SetLevel(lv, level); err != nil {
		return nil, nil, err
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), lv, nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), lv, nil
	}
	return nil, nil, Usage(fmt.Errorf("--log-format must be text or json, not %q", format))
}

// SetLevel sets lv from a level name.
func SetLevel(lv *slog.LevelVar, level string) error {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return Usage(fmt.Errorf("--log-level must be debug, info, warn or error, not %q", level))
	}
	lv.Set(l)
	return nil
}

// Usagef is a usage error from a format.
func Usagef(format string, args ...any) error { return UsageError{Err: fmt.Errorf(format, args...)} }
