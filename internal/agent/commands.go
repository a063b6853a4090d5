package agent

// Remote commands (docs/protocol.md#commands): the allow-list, run with
// argv (never a shell), bounded in time and output; results go with the
// next push and are kept in the state file until the server has them.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"

	"github.com/drover/drover/internal/protocol"
)

// DefaultCommandKinds are the kinds run unless Config.CommandKinds says
// otherwise: reboot must be enabled explicitly.
var DefaultCommandKinds = []string{protocol.KindPing, protocol.KindReadLog, protocol.KindSetConfig, protocol.KindHook}

// KnownCommandKinds is the protocol's whole allow-list.
var KnownCommandKinds = protocol.CommandKinds

// rememberedCommands is how many command IDs the agent keeps to never run
// one twice.
const rememberedCommands = 64

// runCommands runs the commands of a push answer and queues their results.
// It returns whether any ran (their results should be pushed at once).
func (a *Agent) runCommands(ctx context.Context, cmds []protocol.Command) bool {
	ran := false
	for _, c := range cmds {
		if slices.Contains(a.st.DoneCommands, c.ID) {
			continue
		}
		a.st.DoneCommands = append(a.st.DoneCommands, c.ID)
		if n := len(a.st.DoneCommands); n > rememberedCommands {
			a.st.DoneCommands = slices.Clone(a.st.DoneCommands[n-rememberedCommands:])
		}
		a.save() // before running: a crash must not run it again
		r := a.runCommand(ctx, c)
		if ctx.Err() != nil {
			return ran
		}
		a.log.Info("command ran", "id", c.ID, "kind", c.Kind, "exit_code", r.ExitCode, "error", r.Error)
		a.st.Results = append(a.st.Results, r)
		a.save()
		ran = true
	}
	return ran
}

// runCommand runs one command within its timeout. The result carries
// when it started and when it finished (device clock, unix seconds),
// whichever way it ends.
func (a *Agent) runCommand(ctx context.Context, c protocol.Command) (r protocol.CommandResult) {
	r = protocol.CommandResult{ID: c.ID, StartedAt: time.Now().Unix()}
	defer func() { r.FinishedAt = time.Now().Unix() }() // r is the named result: this sets what is returned
	fail := func(msg string) protocol.CommandResult {
		r.ExitCode, r.Error = -1, clean(msg, protocol.MaxConfigErrorLen)
		return r
	}
	if err := c.Validate(); err != nil {
		return fail("invalid command: " + err.Error())
	}
	if !slices.Contains(a.cfg.CommandKinds, c.Kind) {
		return fail(c.Kind + " is not allowed on this device (drover agent --commands)")
	}
	timeout := time.Duration(c.Timeout) * time.Second
	var argv []string
	switch c.Kind {
	case protocol.KindReboot:
		if len(a.cfg.RebootCommand) == 0 {
			return fail("no reboot command configured")
		}
		a.rebootAfterPush = true // after the result reached the server
		r.Output = []string{"rebooting after this result is sent"}
		return r
	case protocol.KindPing:
		argv = []string{"ping", "-c", "3", c.Args[0]}
	case protocol.KindReadLog:
		path, ok := a.cfg.Logs[c.Args[0]]
		if !ok {
			return fail("no log named " + c.Args[0] + " is configured on this device (drover agent --log NAME=PATH)")
		}
		out, err := tailFile(path, protocol.MaxResultOutputBytes)
		if err != nil {
			return fail(err.Error())
		}
		r.Output = outputLines(out)
		return r
	case protocol.KindSetConfig, protocol.KindHook:
		if a.cfg.CommandHook == "" {
			return fail("no command hook configured on this device (drover agent --command-hook)")
		}
		argv = append([]string{a.cfg.CommandHook, c.Kind}, c.Args...)
	}
	out, code, err := runArgv(ctx, argv, a.env(), timeout)
	r.Output, r.ExitCode = outputLines(out), code
	if err != nil {
		r.Error = clean(err.Error(), protocol.MaxConfigErrorLen)
	}
	return r
}

// runArgv runs argv without a shell, stdout and stderr together, killing
// its process group after timeout. code is the exit status (-1: none).
func runArgv(ctx context.Context, argv []string, env []string, timeout time.Duration) (out []byte, code int, err error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), env...)
	var buf tailBuffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	ownProcessGroup(cmd)
	cmd.WaitDelay = 2 * time.Second
	err = cmd.Run()
	var ee *exec.ExitError
	switch {
	case ctx.Err() == context.DeadlineExceeded:
		return buf.Bytes(), -1, fmt.Errorf("timed out after %s", timeout)
	case errors.As(err, &ee) && ee.Exited():
		return buf.Bytes(), ee.ExitCode(), nil
	case err != nil:
		return buf.Bytes(), -1, err
	}
	return buf.Bytes(), 0, nil
}

// tailBuffer keeps the last MaxResultOutputBytes bytes written to it.
type tailBuffer struct{ b []byte }

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.b = append(t.b, p...)
	if over := len(t.b) - protocol.MaxResultOutputBytes; over > 0 {
		t.b = append(t.b[:0], t.b[over:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) Bytes() []byte { return t.b }

// tailFile reads the last n bytes of a file.
func tailFile(path string, n int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if end, err := f.Seek(0, io.SeekEnd); err == nil && end > n {
		f.Seek(end-n, io.SeekStart)
	} else {
		f.Seek(0, io.SeekStart)
	}
	return io.ReadAll(io.LimitReader(f, n))
}

// outputLines turns output into lines the protocol accepts: valid UTF-8,
// no control characters (tabs become spaces), at most the protocol's
// limits, keeping the end.
func outputLines(out []byte) []string {
	text := strings.ToValidUTF8(string(bytes.TrimRight(out, "\r\n")), "?")
	if text == "" {
		return nil
	}
	lines := strings.Split(text, "\n")
	for i, l := range lines {
		lines[i] = strings.Map(func(r rune) rune {
			switch {
			case r == '\t':
				return ' '
			case protocol.IsControl(r):
				return -1
			}
			return r
		}, l)
	}
	if n := len(lines); n > protocol.MaxResultOutputLines {
		lines = lines[n-protocol.MaxResultOutputLines:]
	}
	for total := 0; ; lines = lines[1:] {
		total = 0
		for _, l := range lines {
			total += len(l)
		}
		if total <= protocol.MaxResultOutputBytes || len(lines) == 1 {
			break
		}
	}
	if len(lines) == 1 && len(lines[0]) > protocol.MaxResultOutputBytes {
		lines[0] = strings.ToValidUTF8(lines[0][len(lines[0])-protocol.MaxResultOutputBytes:], "")
	}
	return lines
}

// reboot runs the configured reboot command after its result was pushed.
func (a *Agent) reboot(ctx context.Context) {
	a.rebootAfterPush = false
	a.log.Warn("rebooting as an operator asked", "command", a.cfg.RebootCommand)
	if out, _, err := runArgv(ctx, a.cfg.RebootCommand, a.env(), time.Minute); err != nil {
		a.log.Error("reboot command failed", "err", err, "output", clean(string(out), 512))
	}
}
