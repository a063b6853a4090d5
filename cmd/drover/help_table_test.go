package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// Every subcommand, taken from the commands table (and perf's own list,
// and drover ctl's table),
// answers --help on stdout with exit 0 and an unknown flag on stderr with
// exit 2. A command added to the table is covered without a new line here.
func TestEveryCommandHelpAndBadFlag(t *testing.T) {
	var names []string
	for _, c := range commands {
		names = append(names, c.name)
	}
	for _, sub := range []string{"list", "run", "fleet", "report", "compare", "size", "summary", "worker"} {
		names = append(names, "perf "+sub)
	}
	for _, c := range ctlCommands {
		names = append(names, "ctl "+c.group+" "+c.name)
	}
	var perfHelp bytes.Buffer
	run(context.Background(), []string{"perf", "--help"}, testEnv(nil, &perfHelp, &perfHelp, nil))
	for _, line := range strings.Split(perfHelp.String(), "\n") {
		if f := strings.Fields(line); len(f) > 1 && strings.HasPrefix(line, "  ") && !strings.HasPrefix(line, "   ") {
			found := false
			for _, n := range names {
				found = found || n == "perf "+f[0]
			}
			if !found {
				t.Errorf("drover perf --help lists %q, which this test does not cover", f[0])
			}
		}
	}
	for _, c := range names {
		t.Run(strings.ReplaceAll(c, " ", "_"), func(t *testing.T) {
			for _, h := range []string{"--help", "-h"} {
				var out, errOut bytes.Buffer
				args := append(strings.Fields(c), h)
				if code := run(context.Background(), args, testEnv(nil, &out, &errOut, nil)); code != 0 || out.Len() == 0 || errOut.Len() != 0 {
					t.Errorf("drover %s %s: exit %d, stdout %d bytes, stderr %q", c, h, code, out.Len(), errOut.String())
				}
			}
			var out, errOut bytes.Buffer
			args := append(strings.Fields(c), "--no-such-flag")
			if code := run(context.Background(), args, testEnv(nil, &out, &errOut, nil)); code != 2 || !strings.Contains(errOut.String(), "no-such-flag") {
				t.Errorf("drover %s --no-such-flag: exit %d, stdout %q, stderr %q", c, code, out.String(), errOut.String())
			}
		})
	}
}
