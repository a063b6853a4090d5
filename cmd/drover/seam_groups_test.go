package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/internal/testwait"
)

// The live groups seam, through the real binaries: `drover serve`, a
// `drover agent` whose collector reports a site in the state's extras,
// and `drover ctl` as an operator runs it. A live label defined on the
// site takes the device once it reports that site, and lets it go when it
// reports another; the devices list's --filter reads the reported field;
// a bad expression is refused before anything is sent.
func TestSeamLiveGroups(t *testing.T) {
	t.Parallel()
	data := t.TempDir()
	p := startServe(t, data, "--push-interval", "1", "--quota-push-rate", "0")
	base := "https://" + p.addr
	secrets := readSecrets(t, data)
	ca := caFile(data)
	dir := t.TempDir()
	siteFile := filepath.Join(dir, "site")
	setSite := func(site string) {
		t.Helper()
		if err := os.WriteFile(siteFile, []byte("site="+site+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	setSite("depot")
	startAgent(t, base, secrets.Enroll, ca, filepath.Join(dir, "state"), "seam-groups", "--collector", "cat "+siteFile)
	ctl := ctlBinary(t, base, secrets.Admin, ca)
	listed := func(args ...string) []string {
		t.Helper()
		code, out, errOut := ctl(append([]string{"devices", "list", "--json"}, args...)...)
		if code != 0 {
			t.Fatalf("devices list %v: exit %d: %s", args, code, errOut)
		}
		var list struct {
			Devices []struct {
				MachineID string `json:"machine_id"`
			} `json:"devices"`
		}
		if err := json.Unmarshal([]byte(out), &list); err != nil {
			t.Fatalf("devices list --json: %v\n%s", err, out)
		}
		var ids []string
		for _, d := range list.Devices {
			ids = append(ids, d.MachineID)
		}
		return ids
	}
	if !testwait.Until(60*time.Second, func() bool { return len(listed("--filter", "state.extra.site = depot")) == 1 }) {
		t.Fatal("the agent did not register and report its site within 60 s")
	}

	if code, out, errOut := ctl("labels", "define", "north-group", "state.extra.site = north and state.uptime exists"); code != 0 ||
		!strings.Contains(out, "north-group") {
		t.Fatalf("labels define: exit %d\n%s\n%s", code, out, errOut)
	}
	if got := listed("--label", "north-group"); len(got) != 0 {
		t.Fatalf("in the group before reporting north: %v", got)
	}
	setSite("north")
	if !testwait.Until(30*time.Second, func() bool {
		got := listed("--label", "north-group")
		return len(got) == 1 && got[0] == "seam-groups"
	}) {
		t.Fatal("the device did not join the live group after reporting north")
	}
	code, out, _ := ctl("labels", "list")
	if code != 0 || !strings.Contains(out, "north-group") || !strings.Contains(out, `state.extra.site = "north" and state.uptime exists`) {
		t.Fatalf("labels list: exit %d\n%s", code, out)
	}
	setSite("south")
	if !testwait.Until(30*time.Second, func() bool { return len(listed("--label", "north-group")) == 0 }) {
		t.Fatal("the device did not leave the live group after reporting south")
	}
	if got := listed("--filter", "state.extra.site prefix so", "--filter", "machine_id = seam-groups"); len(got) != 1 {
		t.Fatalf("--filter twice: %v", got)
	}

	// Refusals: a bad expression (exit 2, before any request), a manual
	// assignment to a live label (the API's 409: exit 5).
	if code, _, errOut := ctl("devices", "list", "--filter", "state.extra.site ="); code != 2 || !strings.Contains(errOut, "a value must follow") {
		t.Fatalf("bad --filter: exit %d %s", code, errOut)
	}
	if code, _, errOut := ctl("labels", "define", "x", "site = north"); code != 2 || !strings.Contains(errOut, `unknown field "site"`) {
		t.Fatalf("bad labels define: exit %d %s", code, errOut)
	}
	if code, _, errOut := ctl("labels", "assign", "north-group", "--all"); code != 5 || !strings.Contains(errOut, "live") {
		t.Fatalf("assigning a live label: exit %d %s", code, errOut)
	}
}

// startAgent runs `drover agent` against base as machineID until the test
// ends, with more flags; its output is logged when the test fails.
func startAgent(t *testing.T, base, enroll, ca, stateDir, machineID string, more ...string) {
	t.Helper()
	root, _ := filepath.Abs("../../internal/agent/testdata/root")
	args := append([]string{"agent", "--server", base, "--enroll-secret", enroll, "--ca-cert", ca,
		"--state-dir", stateDir, "--machine-id", machineID, "--root", root}, more...)
	agent := exec.Command(droverBin, args...)
	var agentLog bytes.Buffer
	agent.Stdout, agent.Stderr = &agentLog, &agentLog
	if err := agent.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		agent.Process.Kill()
		agent.Wait()
		if t.Failed() {
			t.Logf("agent log:\n%s", agentLog.String())
		}
	})
}

// ctlBinary runs the `drover ctl` binary as an operator does, with the
// server, token and CA from the environment; it returns the exit code,
// stdout and stderr.
func ctlBinary(t *testing.T, base, token, ca string) func(args ...string) (int, string, string) {
	return func(args ...string) (int, string, string) {
		t.Helper()
		cmd := exec.Command(droverBin, append([]string{"ctl"}, args...)...)
		cmd.Env = append(os.Environ(), "DROVER_SERVER="+base, "DROVER_API_TOKEN="+token, "DROVER_CA_CERT="+ca)
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return code, out.String(), errb.String()
	}
}
