package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Configuration layers × agents: the real agent receives its device's
// own value and its group's value merged over the profile, variables
// resolved, applies them, and its device goes back in sync.
func TestSeamConfigLayersAgent(t *testing.T) {
	t.Parallel()
	s := startSeamServer(t)
	dir := t.TempDir()
	applied, versions := filepath.Join(dir, "applied.json"), filepath.Join(dir, "versions.log")
	once := func() {
		t.Helper()
		cmd := exec.Command(droverBin, "agent", "--once", "--server", s.base, "--ca-cert", s.cert, "--enroll-secret", s.secret,
			"--state-dir", filepath.Join(dir, "state"), "--root", "../../internal/agent/testdata/root", "--machine-id", "seam-layers-1",
			"--device-type", "ICR-3241", "--firmware", "6.3.5", "--commands", "",
			"--hook", `cp "$DROVER_CONFIG_FILE" `+applied+` && echo "$DROVER_CONFIG_VERSION" >> `+versions)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("drover agent --once: %v\n%s", err, out)
		}
	}
	var dev struct {
		ID             string  `json:"id"`
		ProfileID      string  `json:"profile_id"`
		SyncState      string  `json:"sync_state"`
		DesiredVersion float64 `json:"desired_version"`
		AppliedVersion float64 `json:"applied_version"`
	}
	device := func() {
		t.Helper()
		var list struct{ Devices []json.RawMessage }
		if st := s.do(t, "GET", "/api/v1/devices", "", &list); st != 200 || len(list.Devices) != 1 {
			t.Fatalf("devices: %d %+v", st, list)
		}
		json.Unmarshal(list.Devices[0], &dev)
	}
	once()
	device()
	var out map[string]any
	for _, rq := range []struct{ method, path, body string }{
		{"PUT", "/api/v1/profiles/" + dev.ProfileID, `{"config":{"apn":"default.iot","log":{"level":"info","to":"syslog"}}}`},
		{"POST", "/api/v1/labels/assign", `{"label":"site=north","filter":{}}`},
		{"PUT", "/api/v1/labels/site=north/config", `{"values":{"apn":"${label.site}.iot"}}`},
		{"PUT", "/api/v1/devices/" + dev.ID + "/config", `{"values":{"log":{"level":"debug"},"hostname":"${device.machine_id}"}}`},
	} {
		if st := s.do(t, rq.method, rq.path, rq.body, &out); st != 200 {
			t.Fatalf("%s %s: %d %v", rq.method, rq.path, st, out)
		}
	}
	var eff struct {
		Version float64           `json:"version"`
		Sources map[string]string `json:"sources"`
	}
	if st := s.do(t, "GET", "/api/v1/devices/"+dev.ID+"/config/effective", "", &eff); st != 200 || eff.Sources["/apn"] != "label site=north" {
		t.Fatalf("effective: %d %+v", st, eff)
	}
	if device(); dev.SyncState != "sync_pending" || dev.DesiredVersion != eff.Version {
		t.Fatalf("before the agent: %+v, effective version %v", dev, eff.Version)
	}
	once() // applies it
	once() // reports it applied
	got, err := os.ReadFile(applied)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"apn":"north.iot","hostname":"seam-layers-1","log":{"level":"debug","to":"syslog"}}`
	var a, b any
	json.Unmarshal(got, &a)
	json.Unmarshal([]byte(want), &b)
	if fmt.Sprint(a) != fmt.Sprint(b) {
		t.Fatalf("the agent applied %s, want %s", got, want)
	}
	log, _ := os.ReadFile(versions)
	if lines := strings.Fields(string(log)); len(lines) != 1 || lines[0] != fmt.Sprint(int64(eff.Version)) {
		t.Fatalf("applied versions %q, want only %v", lines, int64(eff.Version))
	}
	if device(); dev.SyncState != "synchronized" || dev.AppliedVersion != eff.Version {
		t.Fatalf("after applying: %+v", dev)
	}
}
