package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Identity × a wiped agent, through the real binaries: the real `drover
// agent` registers and pushes; its state directory is wiped (agent
// reinstalled, router reset); the agent derives the same machine ID from
// the hardware, its registration waits as a re-enrollment request, the
// operator approves, and the fleet holds one device with its whole
// history; the old token is refused. Wiped once more, an enrollment
// token brings it back at once, and the shell agent on the same box comes
// back as the same device too.
func TestSeamIdentityWipedAgent(t *testing.T) {
	t.Parallel()
	data := t.TempDir()
	// Every accepted push is a history sample: the history shows what the
	// wipe must not lose.
	p := startServe(t, data, "--quota-history-samples", "0", "--quota-history-bytes", "0")
	secrets := readSecrets(t, data)
	caFile := caFile(data)
	c := trustingClient(t, data, 10*time.Second)
	base := "https://" + p.addr
	api := func(method, path, token, body string, into any) int {
		t.Helper()
		req, _ := http.NewRequest(method, base+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if into != nil {
			if err := json.Unmarshal(b, into); err != nil {
				t.Fatalf("%s %s: %d %q: %v", method, path, resp.StatusCode, b, err)
			}
		}
		return resp.StatusCode
	}

	// The box: a DMI product UUID, /etc/machine-id and one NIC.
	root := t.TempDir()
	for p, v := range map[string]string{
		"sys/class/dmi/id/product_uuid": "8D3B2C1A-5E4F-4A3B-9C2D-1E0F2A3B4C5D\n",
		"etc/machine-id":                "5f0c0a41e0d94c7c9f1d2b8e3a7c6d21\n",
	} {
		if err := os.MkdirAll(filepath.Join(root, filepath.Dir(p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, p), []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	stateDir := filepath.Join(t.TempDir(), "state")
	agent := func(extra ...string) (string, error) {
		args := append([]string{"agent", "--server", base, "--ca-cert", caFile, "--state-dir", stateDir, "--root", root,
			"--device-type", "ICR-3241", "--firmware", "6.3.5", "--once", "--timeout", "10s"}, extra...)
		out, err := exec.Command(droverBin, args...).CombinedOutput()
		return string(out), err
	}
	type agentState struct {
		DeviceID string `json:"device_id"`
		Token    string `json:"token"`
	}
	state := func() (agentState, string) {
		var st agentState
		b, err := os.ReadFile(filepath.Join(stateDir, "state.json"))
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(b, &st); err != nil {
			t.Fatal(err)
		}
		mid, err := os.ReadFile(filepath.Join(stateDir, "machine-id"))
		if err != nil {
			t.Fatal(err)
		}
		return st, strings.TrimSpace(string(mid))
	}
	type device struct {
		ID        string `json:"id"`
		MachineID string `json:"machine_id"`
		Seq       uint64 `json:"seq"`
		Admission string `json:"admission"`
		Request   *struct {
			Approved bool `json:"approved"`
		} `json:"enrollment_request"`
	}
	devices := func() []device {
		t.Helper()
		var l struct {
			Devices []device `json:"devices"`
		}
		if st := api("GET", "/api/v1/devices", secrets.Admin, "", &l); st != 200 {
			t.Fatalf("device list: %d", st)
		}
		return l.Devices
	}
	history := func(id string) int {
		t.Helper()
		var h struct {
			Samples []json.RawMessage `json:"samples"`
		}
		if st := api("GET", "/api/v1/devices/"+id+"/history", secrets.Admin, "", &h); st != 200 {
			t.Fatalf("history: %d", st)
		}
		return len(h.Samples)
	}

	// The agent's own view of its machine ID is the one it registers with.
	printed, err := exec.Command(droverBin, "agent", "--print-machine-id", "--root", root, "--state-dir", stateDir).Output()
	if err != nil {
		t.Fatalf("--print-machine-id: %v", err)
	}
	for i := range 3 {
		if out, err := agent("--enroll-secret", secrets.Enroll); err != nil {
			t.Fatalf("run %d: %v\n%s", i, err, out)
		}
	}
	first, machineID := state()
	if machineID != strings.TrimSpace(string(printed)) || !strings.HasPrefix(machineID, "hw-") {
		t.Fatalf("machine ID %q, --print-machine-id said %q", machineID, printed)
	}
	before := history(first.DeviceID)
	if before < 3 {
		t.Fatalf("history before the wipe: %d samples", before)
	}

	// Wiped: the same machine ID, held as a re-enrollment request.
	if err := os.RemoveAll(stateDir); err != nil {
		t.Fatal(err)
	}
	out, err := agent("--enroll-secret", secrets.Enroll)
	if err == nil || !strings.Contains(out, "approval") {
		t.Fatalf("wiped agent's registration: %v\n%s", err, out)
	}
	if st, mid := state(); mid != machineID || st.DeviceID != first.DeviceID || st.Token != "" {
		t.Fatalf("wiped agent: machine ID %q device %q (token %v), want %q device %q", mid, st.DeviceID, st.Token != "", machineID, first.DeviceID)
	}
	if l := devices(); len(l) != 1 || l[0].ID != first.DeviceID || l[0].Request == nil || l[0].Admission != "active" {
		t.Fatalf("devices while the request waits: %+v", l)
	}
	if st := api("POST", "/api/v1/devices/"+first.DeviceID+"/approve", secrets.Admin, "", nil); st != 200 {
		t.Fatalf("approve: %d", st)
	}
	if out, err := agent("--enroll-secret", secrets.Enroll); err != nil {
		t.Fatalf("after approval: %v\n%s", err, out)
	}
	second, _ := state()
	if second.DeviceID != first.DeviceID || second.Token == "" || second.Token == first.Token {
		t.Fatalf("after approval: %+v, first %+v", second, first)
	}
	var ans map[string]any
	if st := api("POST", "/api/v1/push", first.Token, `{"seq":99,"state":{}}`, &ans); st != 401 {
		t.Fatalf("old token after re-enrollment: %d %v", st, ans)
	}
	l := devices()
	if len(l) != 1 || l[0].ID != first.DeviceID || l[0].MachineID != machineID || l[0].Request != nil {
		t.Fatalf("devices after re-enrollment: %+v", l)
	}
	if n := history(first.DeviceID); n <= before {
		t.Fatalf("history after re-enrollment: %d samples, had %d", n, before)
	}

	// Wiped again: an enrollment token bound to the machine ID re-keys it
	// at once.
	var tok struct {
		Token string `json:"token"`
	}
	if st := api("POST", "/api/v1/enrollment-tokens", secrets.Admin, fmt.Sprintf(`{"machine_id":%q}`, machineID), &tok); st != 201 {
		t.Fatalf("enrollment token: %d", st)
	}
	if err := os.RemoveAll(stateDir); err != nil {
		t.Fatal(err)
	}
	if out, err := agent("--enroll-token", tok.Token); err != nil {
		t.Fatalf("with an enrollment token: %v\n%s", err, out)
	}
	if third, _ := state(); third.DeviceID != first.DeviceID {
		t.Fatalf("with an enrollment token: device %q, want %q", third.DeviceID, first.DeviceID)
	}

	// The shell agent on the same box derives the same machine ID: an
	// enrollment token brings it in as the same device.
	if st := api("POST", "/api/v1/enrollment-tokens", secrets.Admin, fmt.Sprintf(`{"machine_id":%q}`, machineID), &tok); st != 201 {
		t.Fatalf("enrollment token: %d", st)
	}
	shState := filepath.Join(t.TempDir(), "sh-state")
	cmd := exec.Command("sh", "../../agent/drover-agent.sh", "--server", base, "--ca-cert", caFile, "--state-dir", shState,
		"--root", root, "--device-type", "ICR-3241", "--firmware", "6.3.5", "--once", "--enroll-token", tok.Token)
	cmd.Env = append(os.Environ(), "TMPDIR="+t.TempDir())
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("shell agent: %v\n%s", err, out)
	}
	if b, _ := os.ReadFile(filepath.Join(shState, "machine-id")); strings.TrimSpace(string(b)) != machineID {
		t.Fatalf("shell agent's machine ID %q, the Go agent's %q", b, machineID)
	}
	if l := devices(); len(l) != 1 || l[0].ID != first.DeviceID {
		t.Fatalf("devices after the shell agent: %+v", l)
	}
	c.CloseIdleConnections()
	p.stop(t)
}
