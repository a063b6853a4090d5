package agent

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/drover/drover/internal/protocol"
)

// maxOutput bounds what is kept of a hook's or collector's output.
const maxOutput = 64 << 10

// runShell runs command with /bin/sh -c, feeding it stdin, with a timeout
// that kills its whole process group. It returns stdout and stderr.
func runShell(ctx context.Context, command string, stdin []byte, env []string, timeout time.Duration) (stdout, stderr []byte, err error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "/bin/sh", "-c", command)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdin = bytes.NewReader(stdin)
	var out, errOut limitedBuffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	ownProcessGroup(cmd)
	cmd.WaitDelay = 2 * time.Second // do not wait for grandchildren holding the pipes
	err = cmd.Run()
	if ctx.Err() == context.DeadlineExceeded {
		err = fmt.Errorf("timed out after %s", timeout)
	} else if ee := (*exec.ExitError)(nil); errors.As(err, &ee) && ee.Exited() {
		err = fmt.Errorf("exited with status %d", ee.ExitCode())
	}
	return out.Bytes(), errOut.Bytes(), err
}

// limitedBuffer keeps the first maxOutput bytes and discards the rest. It
// wraps rather than embeds bytes.Buffer, whose ReadFrom would bypass Write.
type limitedBuffer struct{ buf bytes.Buffer }

func (b *limitedBuffer) Write(p []byte) (int, error) {
	if room := maxOutput - b.buf.Len(); room > 0 {
		b.buf.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

func (b *limitedBuffer) Bytes() []byte { return b.buf.Bytes() }

// hookResult is the outcome of applying one configuration version.
type hookResult struct {
	err    string // empty: applied
	output string // for the log
}

// lastLine is the last non-empty line of b, the hook's message.
func lastLine(b []byte) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

// collected is what a collector command adds to a push.
type collected struct {
	Signal *protocol.Signal  `json:"signal"`
	Extra  map[string]string `json:"extra"`
}

// signalKeys are the key=value keys that go into state.signal.
var signalKeys = map[string]bool{"rssi": true, "rsrp": true, "rsrq": true, "sinr": true, "operator": true, "technology": true}

// parseCollector reads a collector's output: a JSON object
// {"signal":{...},"extra":{...}} or key=value lines. Values out of the
// protocol's ranges are dropped and named in the returned problems.
func parseCollector(out []byte) (collected, []string) {
	var c collected
	var problems []string
	trimmed := bytes.TrimSpace(out)
	if len(trimmed) > 0 && trimmed[0] == '{' {
		if err := json.Unmarshal(trimmed, &c); err != nil {
			return collected{}, []string{"output is not valid JSON: " + err.Error()}
		}
	} else {
		sc := bufio.NewScanner(bytes.NewReader(out))
		sc.Buffer(make([]byte, 4096), maxOutput)
		for sc.Scan() {
			line := strings.TrimSpace(sc.Text())
			if line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			k, v, ok := strings.Cut(line, "=")
			k, v = strings.TrimSpace(k), unquote(strings.TrimSpace(v))
			if !ok || k == "" {
				problems = append(problems, fmt.Sprintf("line %q is not key=value", clean(line, 40)))
				continue
			}
			if !signalKeys[k] {
				if c.Extra == nil {
					c.Extra = map[string]string{}
				}
				c.Extra[k] = v
				continue
			}
			if c.Signal == nil {
				c.Signal = &protocol.Signal{}
			}
			switch k {
			case "operator":
				c.Signal.Operator = v
			case "technology":
				c.Signal.Technology = v
			default:
				f, err := strconv.ParseFloat(v, 64)
				if err != nil {
					problems = append(problems, fmt.Sprintf("%s=%q is not a number", k, clean(v, 40)))
					continue
				}
				*signalField(c.Signal, k) = &f
			}
		}
	}
	problems = append(problems, sanitizeCollected(&c)...)
	return c, problems
}

// unquote removes one pair of matching surrounding quotes.
func unquote(v string) string {
	if len(v) >= 2 && (v[0] == '"' || v[0] == '\'') && v[len(v)-1] == v[0] {
		return v[1 : len(v)-1]
	}
	return v
}

func signalField(s *protocol.Signal, k string) **float64 {
	switch k {
	case "rssi":
		return &s.RSSI
	case "rsrp":
		return &s.RSRP
	case "rsrq":
		return &s.RSRQ
	default:
		return &s.SINR
	}
}

// sanitizeCollected drops what the server would refuse.
func sanitizeCollected(c *collected) []string {
	var problems []string
	if s := c.Signal; s != nil {
		for _, f := range []struct {
			name     string
			min, max float64
		}{{"rssi", -200, 0}, {"rsrp", -200, 0}, {"rsrq", -100, 100}, {"sinr", -100, 100}} {
			p := signalField(s, f.name)
			if *p != nil && (math.IsNaN(**p) || **p < f.min || **p > f.max) {
				problems = append(problems, fmt.Sprintf("%s=%g is outside %g..%g", f.name, **p, f.min, f.max))
				*p = nil
			}
		}
		s.Operator = clean(s.Operator, protocol.MaxNameLen)
		s.Technology = clean(s.Technology, protocol.MaxNameLen)
		if *s == (protocol.Signal{}) {
			c.Signal = nil
		}
	}
	if len(c.Extra) > 0 {
		keys := make([]string, 0, len(c.Extra))
		for k := range c.Extra {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		extra := make(map[string]string, len(keys))
		for _, k := range keys {
			ck := clean(k, protocol.MaxExtraKeyLen)
			if ck == "" {
				continue
			}
			extra[ck] = clean(c.Extra[k], protocol.MaxExtraValueLen)
		}
		c.Extra = extra
	}
	return problems
}

// merge adds collector output to st; the agent's own extra keys win, and
// the total stays within the protocol's limit.
func (c *collected) merge(st *protocol.State) {
	if c.Signal != nil {
		st.Signal = c.Signal
	}
	keys := make([]string, 0, len(c.Extra))
	for k := range c.Extra {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if len(st.Extra) >= protocol.MaxExtraKeys {
			return
		}
		if st.Extra == nil {
			st.Extra = map[string]string{}
		}
		if _, taken := st.Extra[k]; !taken {
			st.Extra[k] = c.Extra[k]
		}
	}
}
