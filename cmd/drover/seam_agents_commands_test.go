package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/drover/drover/internal/agent/shelltest"
	"github.com/drover/drover/internal/testwait"
)

// The agents × commands seam, through the real binaries: `drover serve`,
// `drover agent --connect`, `drover-agent` pushing on its interval, and
// agent/drover-agent.sh under busybox ash (busybox applets and curl only)
// and under dash (the shell agent has no persistent connection).
//
// Each agent gets a chain of set-config and hook commands in which every
// command is queued by the hook of the one before, so it arrives in the
// answer to the push carrying the previous result (what an operator
// sending commands one after another gets). Every result must reach the
// server within 5 s of its command's delivery, half the push interval of
// 10 s: a result held for the next interval comes 10 s later, while the
// shell agent's result, sent at once, can take seconds on a loaded CI
// machine (each of its state readings is a process). The device's start
// and finish times must be shown by
// the API; every job must be done as its last copy ends, and a bulk job
// over all four agents too. The push quota is off here: which pushes it
// counts is the quota × commands seam's test.
func TestSeamAgentCommands(t *testing.T) {
	const interval, chainLen = 10, 4
	const bound = interval * time.Second / 2
	t.Parallel()
	data := t.TempDir()
	p := startServe(t, data, "--push-interval", fmt.Sprint(interval), "--quota-push-rate", "0")
	base := "https://" + p.addr
	secrets := readSecrets(t, data)
	caFile := caFile(data)
	c := trustingClient(t, data, 10*time.Second)
	api := func(path, body string, into any) int {
		t.Helper()
		return call(t, c, base+path, secrets.Admin, body, into)
	}

	// The command hook: records its argv and, for the chain, queues the
	// next command (set-config and hook in turn) before its result goes.
	dir := t.TempDir()
	hook := filepath.Join(dir, "command-hook")
	hookScript := `#!/bin/sh
echo "$1 $2 $3" >> "$SEAM_DIR/ran.$DROVER_DEVICE_ID"
if [ "$2" = chain ] && [ "$3" -lt ` + fmt.Sprint(chainLen) + ` ]; then
	n=$(($3 + 1))
	kind=set-config
	[ $((n % 2)) = 0 ] && kind=hook
	curl -sS --fail -o /dev/null --cacert "$SEAM_CA" -H "Authorization: Bearer $SEAM_ADMIN" \
		-d "{\"kind\":\"$kind\",\"args\":[\"chain\",\"$n\"],\"device_id\":\"$DROVER_DEVICE_ID\"}" "$SEAM_API/api/v1/commands" || exit 1
fi
echo "$2 is $3"
`
	if err := os.WriteFile(hook, []byte(hookScript), 0o755); err != nil {
		t.Fatal(err)
	}
	hookEnv := []string{"SEAM_DIR=" + dir, "SEAM_CA=" + caFile, "SEAM_ADMIN=" + secrets.Admin, "SEAM_API=" + base}
	root, _ := filepath.Abs("../../internal/agent/testdata/root")
	script, _ := filepath.Abs("../../agent/drover-agent.sh")

	type agentRun struct {
		name string
		argv []string
		env  []string
	}
	common := func(name string) []string {
		return []string{"--server", base, "--enroll-secret", secrets.Enroll, "--ca-cert", caFile, "--state-dir", filepath.Join(dir, name),
			"--machine-id", "seam-" + name, "--root", root, "--command-hook", hook}
	}
	runs := []agentRun{
		{name: "drover-agent-connect", argv: append([]string{droverBin, "agent", "--connect"}, common("drover-agent-connect")...), env: os.Environ()},
		{name: "drover-agent", argv: append([]string{agentBinary(t)}, common("drover-agent")...), env: os.Environ()},
	}
	if bb, err := exec.LookPath("busybox"); err == nil {
		runs = append(runs, agentRun{name: "sh-busybox", argv: append([]string{bb, "sh", script}, common("sh-busybox")...), env: busyboxPath(t, bb)})
	} else {
		t.Log("busybox is not installed: the shell agent runs under dash only")
	}
	if dash, err := exec.LookPath("dash"); err == nil {
		runs = append(runs, agentRun{name: "sh-dash", argv: append([]string{dash, script}, common("sh-dash")...), env: os.Environ()})
	}
	for _, r := range runs {
		cmd := exec.Command(r.argv[0], r.argv[1:]...)
		cmd.Env = append(append(r.env, hookEnv...), "TMPDIR="+t.TempDir())
		logf, err := os.Create(filepath.Join(dir, r.name+".log"))
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stdout, cmd.Stderr = logf, logf
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			cmd.Process.Kill()
			cmd.Wait()
			logf.Close()
			if t.Failed() {
				out, _ := os.ReadFile(logf.Name())
				t.Logf("%s log:\n%s", r.name, out)
			}
		})
	}
	ids := map[string]string{} // agent name -> device ID
	if !testwait.Until(60*time.Second, func() bool {
		var list struct {
			Devices []struct {
				ID        string `json:"id"`
				MachineID string `json:"machine_id"`
				Seq       uint64 `json:"seq"`
			} `json:"devices"`
		}
		api("/api/v1/devices?q=seam-", "", &list)
		for _, d := range list.Devices {
			if d.Seq > 0 {
				ids[strings.TrimPrefix(d.MachineID, "seam-")] = d.ID
			}
		}
		return len(ids) == len(runs)
	}) {
		t.Fatalf("registered and pushed within 60 s: %v of %d agents", ids, len(runs))
	}

	type copyView struct {
		JobID       string    `json:"job_id"`
		State       string    `json:"state"`
		DeliveredAt time.Time `json:"delivered_at"`
		FinishedAt  time.Time `json:"finished_at"`
		Output      []string  `json:"output"`
		StartedOn   int64     `json:"started_on"`
		FinishedOn  int64     `json:"finished_on"`
	}
	type jobView struct {
		State  string         `json:"state"`
		Total  int            `json:"total"`
		Counts map[string]int `json:"counts"`
	}
	// checkCopy: the result came within bound of the delivery, and the
	// API shows when it ran on the device and when it was recorded.
	checkCopy := func(who string, cp copyView) {
		t.Helper()
		if cp.State != "succeeded" {
			t.Errorf("%s: command %s %s: %v", who, cp.JobID, cp.State, cp.Output)
		}
		if d := cp.FinishedAt.Sub(cp.DeliveredAt); cp.DeliveredAt.IsZero() || d > bound || d < 0 {
			t.Errorf("%s: command %s: result %v after its delivery (push interval %d s), want within %v", who, cp.JobID, d, interval, bound)
		}
		if cp.StartedOn == 0 || cp.FinishedOn == 0 || cp.FinishedOn < cp.StartedOn || cp.FinishedAt.IsZero() {
			t.Errorf("%s: command %s: started_on %d, finished_on %d, finished_at %v: no finish time shown", who, cp.JobID, cp.StartedOn, cp.FinishedOn, cp.FinishedAt)
		}
	}
	// jobDone: a job whose copies all ended is done at once (the sweep
	// runs every 30 s: within a second is not the sweep).
	jobDone := func(who, id string) {
		t.Helper()
		var j jobView
		testwait.Until(time.Second, func() bool { return api("/api/v1/commands/"+id, "", &j) != 200 || j.State == "done" })
		if j.State != "done" {
			t.Errorf("%s: job %s is %q with counts %v after its last copy ended", who, id, j.State, j.Counts)
		}
	}

	// The chains, all agents at once.
	var wg sync.WaitGroup
	for _, r := range runs {
		id := ids[r.name]
		if st := api("/api/v1/commands", fmt.Sprintf(`{"kind":"set-config","args":["chain","1"],"device_id":%q}`, id), &map[string]any{}); st != 201 {
			t.Fatalf("send to %s: %d", r.name, st)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			var list struct{ Commands []copyView }
			ended := 0
			if !testwait.Until(3*interval*time.Second+10*time.Second, func() bool {
				list.Commands = nil
				api("/api/v1/devices/"+id+"/commands", "", &list)
				ended = 0
				for _, cp := range list.Commands {
					if cp.State != "queued" && cp.State != "delivered" {
						ended++
					}
				}
				return ended == chainLen
			}) {
				t.Errorf("%s: %d of %d chained commands ended: %+v", r.name, ended, chainLen, list.Commands)
				return
			}
			for _, cp := range list.Commands {
				checkCopy(r.name, cp)
				jobDone(r.name, cp.JobID)
			}
			ran, _ := os.ReadFile(filepath.Join(dir, "ran."+id))
			want := "set-config chain 1\nhook chain 2\nset-config chain 3\nhook chain 4\n"
			if string(ran) != want {
				t.Errorf("%s: the hook ran\n%s\nwant\n%s", r.name, ran, want)
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}

	// A bulk job over every agent: done as its last copy ends, and a
	// cancel then is refused with the JSON error body.
	var bulk struct {
		ID string `json:"id"`
	}
	if st := api("/api/v1/commands", `{"kind":"hook","args":["bulk","1"],"filter":{"q":"seam-"}}`, &bulk); st != 201 {
		t.Fatalf("bulk send: %d", st)
	}
	var j jobView
	if !testwait.Until(2*interval*time.Second+10*time.Second, func() bool {
		api("/api/v1/commands/"+bulk.ID, "", &j)
		return j.Total == len(runs) && j.Counts["succeeded"]+j.Counts["failed"]+j.Counts["expired"]+j.Counts["cancelled"] == j.Total
	}) {
		t.Fatalf("bulk job: %+v", j)
	}
	jobDone("bulk", bulk.ID)
	var copies struct{ Commands []copyView }
	api("/api/v1/commands/"+bulk.ID+"/devices", "", &copies)
	if len(copies.Commands) != len(runs) {
		t.Fatalf("bulk copies: %+v", copies.Commands)
	}
	for _, cp := range copies.Commands {
		checkCopy("bulk", cp)
	}
	var refused struct {
		Error struct{ Code, Message string } `json:"error"`
	}
	if st := api("/api/v1/commands/"+bulk.ID+"/cancel", "{}", &refused); st != 409 || refused.Error.Code != "conflict" {
		t.Fatalf("cancel of a done job: %d %+v", st, refused)
	}
	if api("/api/v1/commands/"+bulk.ID, "", &j); j.State != "done" || j.Counts["succeeded"] != len(runs) || j.Counts["cancelled"] != 0 {
		t.Fatalf("after the refused cancel: %+v", j)
	}
}

var agentBuild struct {
	once sync.Once
	path string
	err  error
	out  []byte
}

// agentBinary builds cmd/drover-agent once, next to the drover binary.
func agentBinary(t *testing.T) string {
	t.Helper()
	agentBuild.once.Do(func() {
		agentBuild.path = filepath.Join(filepath.Dir(droverBin), "drover-agent")
		agentBuild.out, agentBuild.err = exec.Command("go", "build", "-o", agentBuild.path, "../drover-agent").CombinedOutput()
	})
	if agentBuild.err != nil {
		t.Fatalf("building drover-agent: %v\n%s", agentBuild.err, agentBuild.out)
	}
	return agentBuild.path
}

// busyboxPath is the environment with a PATH of busybox applets and curl
// only, as on an OpenWrt router.
func busyboxPath(t *testing.T, bb string) []string {
	t.Helper()
	curl, err := exec.LookPath("curl")
	if err != nil {
		t.Skip("curl is not installed")
	}
	return shelltest.BusyboxEnv(t, bb, curl)
}
