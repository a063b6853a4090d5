package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The operator CLI × agents' commands seam, through the real binaries:
// `drover serve`, a `drover agent --connect`, and `drover ctl commands
// send … --wait` as an operator runs it (server, token and CA from the
// environment), which must get the device's result, within the push
// interval, and exit 0; a command the agent refuses makes --wait exit 1
// with the device's error shown.
func TestSeamCtlCommandsAgent(t *testing.T) {
	data := t.TempDir()
	// A result must not wait for the interval.
	p := startServe(t, data, "--push-interval", "600", "--quota-push-rate", "0")
	base := "https://" + p.addr
	secrets := readSecrets(t, data)
	caFile := caFile(data)
	dir := t.TempDir()
	hook := filepath.Join(dir, "command-hook")
	if err := os.WriteFile(hook, []byte("#!/bin/sh\necho \"hook got $2 $3 on $DROVER_DEVICE_ID\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	startAgent(t, base, secrets.Enroll, caFile, filepath.Join(dir, "state"), "seam-ctl", "--connect", "--command-hook", hook)
	ctl := ctlBinary(t, base, secrets.Admin, caFile)

	// The device as the CLI lists it, once it pushed.
	var id string
	for deadline := time.Now().Add(60 * time.Second); id == ""; {
		code, out, errOut := ctl("devices", "list", "--q", "seam-ctl", "--liveness", "online", "--json")
		if code != 0 {
			t.Fatalf("devices list: exit %d: %s", code, errOut)
		}
		var list struct {
			Devices []struct {
				ID string `json:"id"`
			} `json:"devices"`
		}
		if err := json.Unmarshal([]byte(out), &list); err != nil {
			t.Fatalf("devices list --json: %v\n%s", err, out)
		}
		if len(list.Devices) == 1 {
			id = list.Devices[0].ID
		} else if time.Now().After(deadline) {
			t.Fatal("the agent did not register and push within 60 s")
		} else {
			time.Sleep(100 * time.Millisecond)
		}
	}

	start := time.Now()
	code, out, errOut := ctl("commands", "send", "hook", "hello", "world", "--device", id, "--wait", "--wait-timeout", "30s")
	took := time.Since(start)
	if code != 0 {
		t.Fatalf("commands send --wait: exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	for _, w := range []string{"DEVICE", id, "succeeded", "hook got hello world on " + id} {
		if !strings.Contains(out, w) {
			t.Errorf("commands send --wait: stdout lacks %q:\n%s", w, out)
		}
	}
	if took > 10*time.Second {
		t.Errorf("commands send --wait took %v (push interval 600 s): the result did not come over the connection", took)
	}

	// The same as JSON, to a label, parsed as the API's results.
	if code, _, errOut := ctl("labels", "create", "seam", "--q", "seam-ctl"); code != 0 {
		t.Fatalf("labels create: exit %d %s", code, errOut)
	}
	code, out, errOut = ctl("commands", "send", "hook", "to", "label", "--label", "seam", "--wait", "--json")
	if code != 0 {
		t.Fatalf("commands send --label --wait --json: exit %d %s", code, errOut)
	}
	var res struct {
		Commands []struct {
			DeviceID string   `json:"device_id"`
			State    string   `json:"state"`
			Output   []string `json:"output"`
		} `json:"commands"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil || len(res.Commands) != 1 || res.Commands[0].State != "succeeded" ||
		res.Commands[0].DeviceID != id || !strings.Contains(strings.Join(res.Commands[0].Output, "\n"), "hook got to label") {
		t.Fatalf("commands send --label --wait --json: %v\n%s", err, out)
	}

	// A command the agent does not allow: the device's error, exit 1.
	code, out, errOut = ctl("commands", "send", "reboot", "--device", id, "--wait", "--wait-timeout", "30s")
	if code != 1 || !strings.Contains(out, "failed") || !strings.Contains(errOut, "1 of 1 devices failed") {
		t.Fatalf("reboot refused by the agent: exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
}
