package main

import (
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/internal/testwait"
)

// Configuration rollouts × agents, operator CLI: a label's new values
// started with `drover ctl rollouts start-config` reach the canary's real
// agent first while the others keep the previous values, and the others
// only after the next wave; a canary whose agent fails to apply pauses
// the next rollout before anyone else is sent its values, and abort
// gives the canary the previous values back.
func TestSeamConfigRolloutAgents(t *testing.T) {
	t.Parallel()
	data := t.TempDir()
	p := startServe(t, data, "--rollout-interval", "200ms")
	s := &seamServer{addr: p.addr, base: "https://" + p.addr, cert: caFile(data)}
	sec := readSecrets(t, data)
	s.secret, s.admin = sec.Enroll, sec.Admin
	s.c = trustingClient(t, data, 10*time.Second)
	ctl := ctlBinary(t, s.base, s.admin, s.cert)
	dir := t.TempDir()
	machines := []string{"seam-cr-1", "seam-cr-2", "seam-cr-3"}
	appliedFile := func(m string) string { return filepath.Join(dir, m+".json") }
	// once runs machine m's agent once: it pushes and applies what the
	// answer carries; its hook refuses x = 3.
	once := func(m string) {
		t.Helper()
		hook := `if grep -Eq '"x": ?3' "$DROVER_CONFIG_FILE"; then echo 'x = 3 refused' >&2; exit 1; fi; cp "$DROVER_CONFIG_FILE" ` + appliedFile(m)
		cmd := exec.Command(droverBin, "agent", "--once", "--server", s.base, "--ca-cert", s.cert, "--enroll-secret", s.secret,
			"--state-dir", filepath.Join(dir, m), "--root", "../../internal/agent/testdata/root", "--machine-id", m,
			"--device-type", "ICR-3241", "--firmware", "6.3.5", "--commands", "", "--hook", hook)
		cmd.CombinedOutput() // a refused apply exits non-zero; the server hears of it
	}
	x := func(m string) string {
		t.Helper()
		b, _ := os.ReadFile(appliedFile(m))
		var v struct{ X json.Number }
		json.Unmarshal(b, &v)
		return v.X.String()
	}
	for _, m := range machines {
		once(m)
	}
	var out map[string]any
	for _, rq := range []struct{ method, path, body string }{
		{"POST", "/api/v1/labels/assign", `{"label":"g","filter":{"q":"seam-cr-"}}`},
		{"PUT", "/api/v1/labels/g/config", `{"values":{"x":1}}`},
	} {
		if st := s.do(t, rq.method, rq.path, rq.body, &out); st != http.StatusOK {
			t.Fatalf("%s %s: %d %v", rq.method, rq.path, st, out)
		}
	}
	for _, m := range machines {
		once(m) // applies {"x":1}
		once(m) // reports it
		if x(m) != "1" {
			t.Fatalf("%s applied x=%s before any rollout", m, x(m))
		}
	}
	machineOf := map[string]string{}
	var list struct {
		Devices []struct {
			ID        string `json:"id"`
			MachineID string `json:"machine_id"`
		} `json:"devices"`
	}
	s.do(t, "GET", "/api/v1/devices", "", &list)
	for _, d := range list.Devices {
		machineOf[d.ID] = d.MachineID
	}

	type rollout struct {
		ID     string         `json:"id"`
		Kind   string         `json:"kind"`
		State  string         `json:"state"`
		Wave   int            `json:"wave"`
		Reason string         `json:"reason"`
		Counts map[string]int `json:"counts"`
	}
	start := func(values string) rollout {
		t.Helper()
		f := filepath.Join(dir, "values.json")
		os.WriteFile(f, []byte(values), 0o600)
		code, stdout, errOut := ctl("rollouts", "start-config", "g", "--values-file", f, "--waves", "1,100%", "--max-failure-pct", "10", "--json")
		var r rollout
		if code != 0 || json.Unmarshal([]byte(stdout), &r) != nil || r.Kind != "config" {
			t.Fatalf("rollouts start-config: exit %d\n%s\n%s", code, stdout, errOut)
		}
		return r
	}
	status := func(id string) rollout {
		t.Helper()
		code, stdout, errOut := ctl("rollouts", "status", id, "--json")
		var r rollout
		if code != 0 || json.Unmarshal([]byte(stdout), &r) != nil {
			t.Fatalf("rollouts status: exit %d\n%s\n%s", code, stdout, errOut)
		}
		return r
	}
	waitFor := func(id, what string, cond func(r rollout) bool) {
		t.Helper()
		testwait.For(t, 30*time.Second, what, func() bool { return cond(status(id)) })
	}
	canaryOf := func(id string) string {
		t.Helper()
		var page struct {
			Devices []struct {
				DeviceID string `json:"device_id"`
				Wave     int    `json:"wave"`
			} `json:"devices"`
		}
		s.do(t, "GET", "/api/v1/rollouts/"+id+"/devices", "", &page)
		if len(page.Devices) != 1 || page.Devices[0].Wave != 1 {
			t.Fatalf("wave 1 of rollout %s: %+v", id, page)
		}
		return machineOf[page.Devices[0].DeviceID]
	}

	// Canary first, the others after the next wave.
	r := start(`{"x":2}`)
	waitFor(r.ID, "wave 1", func(r rollout) bool { return r.Wave == 1 })
	canary := canaryOf(r.ID)
	// The canary last: its agent reports the apply at once, which may end
	// the wave.
	order := append([]string{}, machines...)
	slices.SortFunc(order, func(a, b string) int { return map[bool]int{true: 1}[a == canary] - map[bool]int{true: 1}[b == canary] })
	for _, m := range order {
		once(m)
		if want := map[bool]string{true: "2", false: "1"}[m == canary]; x(m) != want {
			t.Fatalf("wave 1: %s applied x=%s, want %s (canary %s)", m, x(m), want, canary)
		}
	}
	once(canary) // reports it applied, if it did not yet
	waitFor(r.ID, "wave 2", func(r rollout) bool { return r.Wave == 2 })
	for _, m := range machines {
		once(m)
		once(m)
		if x(m) != "2" {
			t.Fatalf("wave 2: %s applied x=%s", m, x(m))
		}
	}
	waitFor(r.ID, "done", func(r rollout) bool { return r.State == "done" && r.Counts["verified"] == 3 })

	// A canary failing to apply pauses the next rollout.
	r = start(`{"x":3}`)
	waitFor(r.ID, "wave 1", func(r rollout) bool { return r.Wave == 1 })
	canary = canaryOf(r.ID)
	once(canary) // refuses {"x":3}
	once(canary) // reports the error
	waitFor(r.ID, "auto-pause", func(r rollout) bool { return r.State == "paused" && r.Counts["failed"] == 1 })
	if got := status(r.ID); got.Wave != 1 || !strings.Contains(got.Reason, "1 of 1 devices failed") {
		t.Fatalf("paused: %+v", got)
	}
	for _, m := range machines {
		if m != canary {
			once(m)
			if x(m) != "2" {
				t.Fatalf("paused: %s applied x=%s", m, x(m))
			}
		}
	}
	if code, _, errOut := ctl("rollouts", "abort", r.ID); code != 0 {
		t.Fatalf("rollouts abort: exit %d %s", code, errOut)
	}
	once(canary)
	once(canary)
	var dev map[string]any
	for id, m := range machineOf {
		if m == canary {
			s.do(t, "GET", "/api/v1/devices/"+id, "", &dev)
		}
	}
	if x(canary) != "2" || dev["sync_state"] != "synchronized" {
		t.Fatalf("after abort: the canary applied x=%s, device %v", x(canary), dev)
	}
}
