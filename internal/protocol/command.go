package protocol

import (
	"fmt"
	"slices"
)

// Remote commands (docs/protocol.md#commands): the server lists commands in
// a push answer (PushResponse.Commands); the agent runs each kind it allows
// and reports the outcome in a later push (PushRequest.Results). Old agents
// ignore the field: their commands expire.

// Command kinds, the whole allow-list. Arguments are passed as argv, never
// through a shell.
const (
	KindReboot    = "reboot"     // no arguments
	KindPing      = "ping"       // host name or address
	KindReadLog   = "read-log"   // a log name the agent's operator configured
	KindSetConfig = "set-config" // key, value: handed to the agent's command hook
	KindHook      = "hook"       // arguments handed to the agent's command hook
)

// CommandKinds lists every kind, in documentation order.
var CommandKinds = []string{KindReboot, KindPing, KindReadLog, KindSetConfig, KindHook}

// Limits of commands and results.
const (
	MaxCommandArgs       = 8
	MaxCommandArgLen     = 256
	MaxCommandTimeout    = 3600    // seconds
	MaxCommandsPerPush   = 8       // commands in one answer
	MaxResultsPerPush    = 4       // results in one push
	MaxResultOutputBytes = 8 << 10 // sum of a result's output lines
	MaxResultOutputLines = 256
)

// Command is one command for the device to run.
type Command struct {
	ID      uint64   `json:"id"`
	Kind    string   `json:"kind"`
	Args    []string `json:"args,omitempty"`
	Timeout int      `json:"timeout"` // seconds the agent lets it run
}

// CommandResult is what the agent reports about a command it received.
// A command succeeded when ExitCode is 0 and Error is empty.
type CommandResult struct {
	ID         uint64   `json:"id"`
	ExitCode   int      `json:"exit_code"`
	Error      string   `json:"error,omitempty"`  // why it did not run or was stopped ("timed out", "not allowed")
	Output     []string `json:"output,omitempty"` // lines of output, without control characters
	StartedAt  int64    `json:"started_at"`       // unix seconds, device clock
	FinishedAt int64    `json:"finished_at"`      // unix seconds, device clock
}

// Succeeded reports whether the command ran and exited with status 0.
func (r *CommandResult) Succeeded() bool { return r.ExitCode == 0 && r.Error == "" }

// Validate checks a command's kind and arguments: the rules agents rely on
// (docs/protocol.md#commands).
func (c *Command) Validate() error {
	if c.ID == 0 {
		return invalid("command id must be > 0")
	}
	if c.Timeout < 1 || c.Timeout > MaxCommandTimeout {
		return invalid("timeout must be within 1..%d seconds", MaxCommandTimeout)
	}
	if len(c.Args) > MaxCommandArgs {
		return invalid("a command takes at most %d arguments", MaxCommandArgs)
	}
	for i, a := range c.Args {
		if p := textProblem(a, MaxCommandArgLen, false); p != "" {
			return invalid("args[%d] %s", i, p)
		}
	}
	want := map[string]int{KindReboot: 0, KindPing: 1, KindReadLog: 1, KindSetConfig: 2}
	if n, fixed := want[c.Kind]; fixed && len(c.Args) != n {
		return invalid("%s takes %d argument(s), not %d", c.Kind, n, len(c.Args))
	}
	switch c.Kind {
	case KindReboot, KindHook:
	case KindPing:
		if !isName(c.Args[0], ".:-") {
			return invalid("ping: the host must be a name or an address (letters, digits, '.', ':', '-'; not starting with '-')")
		}
	case KindReadLog:
		if !isName(c.Args[0], "._-") || c.Args[0][0] == '.' {
			return invalid("read-log: the log name must be letters, digits, '.', '_', '-', not starting with '.' or '-'")
		}
	case KindSetConfig:
		if !isName(c.Args[0], "._-") {
			return invalid("set-config: the key must be letters, digits, '.', '_', '-', not starting with '-'")
		}
	default:
		return invalid("kind must be one of %v", CommandKinds)
	}
	return nil
}

// isName reports whether v is 1..MaxCommandArgLen ASCII letters, digits
// and the extra characters, not starting with '-' (never an option).
func isName(v, extra string) bool {
	if v == "" || len(v) > MaxCommandArgLen || v[0] == '-' {
		return false
	}
	for i := 0; i < len(v); i++ {
		c := v[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || slices.Contains([]byte(extra), c)) {
			return false
		}
	}
	return true
}

// validateResults checks the results of a push.
func validateResults(rs []CommandResult) error {
	if len(rs) > MaxResultsPerPush {
		return invalid("results has more than %d entries", MaxResultsPerPush)
	}
	for i := range rs {
		r := &rs[i]
		if r.ID == 0 {
			return invalid("results[%d].id must be > 0", i)
		}
		if r.StartedAt < 0 || r.FinishedAt < 0 {
			return invalid("results[%d] times must be >= 0", i)
		}
		if err := checkText(fmt.Sprintf("results[%d].error", i), r.Error, MaxConfigErrorLen, false); err != nil {
			return err
		}
		if len(r.Output) > MaxResultOutputLines {
			return invalid("results[%d].output has more than %d lines", i, MaxResultOutputLines)
		}
		total := 0
		for j, l := range r.Output {
			total += len(l)
			if p := textProblem(l, MaxResultOutputBytes, false); p != "" {
				return invalid("results[%d].output[%d] %s", i, j, p)
			}
		}
		if total > MaxResultOutputBytes {
			return invalid("results[%d].output is longer than %d bytes", i, MaxResultOutputBytes)
		}
	}
	return nil
}
