package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/csv"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/drover/drover/internal/server/servertest"
)

// ctlResult is one drover ctl run.
type ctlResult struct {
	code           int
	stdout, stderr string
}

// ctlRunner runs `drover ctl` in-process against s with the environment
// an operator would set (DROVER_SERVER, DROVER_API_TOKEN, DROVER_CA_CERT).
func ctlRunner(t *testing.T, s *servertest.Server) func(token, stdin string, args ...string) ctlResult {
	ca := filepath.Join(t.TempDir(), "cert.pem")
	if err := os.WriteFile(ca, s.CACertPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	return func(token, stdin string, args ...string) ctlResult {
		t.Helper()
		var out, errb bytes.Buffer
		vars := map[string]string{"DROVER_SERVER": s.URL, "DROVER_API_TOKEN": token, "DROVER_CA_CERT": ca}
		code := run(context.Background(), append([]string{"ctl"}, args...), testEnv(strings.NewReader(stdin), &out, &errb, vars))
		return ctlResult{code, out.String(), errb.String()}
	}
}

// ctlRecorder is ctlRunner through a proxy on loopback that records each
// request's method and path ("GET /api/v1/devices/3").
func ctlRecorder(t *testing.T, s *servertest.Server) (func(token, stdin string, args ...string) ctlResult, func() []string) {
	target, err := url.Parse(s.URL)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var calls []string
	rp := &httputil.ReverseProxy{Rewrite: func(r *httputil.ProxyRequest) { r.SetURL(target) }, Transport: s.Client().Transport}
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		calls = append(calls, r.Method+" "+r.URL.EscapedPath())
		mu.Unlock()
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(proxy.Close)
	return func(token, stdin string, args ...string) ctlResult {
			t.Helper()
			var out, errb bytes.Buffer
			vars := map[string]string{"DROVER_SERVER": proxy.URL, "DROVER_API_TOKEN": token}
			code := run(context.Background(), append([]string{"ctl"}, args...), testEnv(strings.NewReader(stdin), &out, &errb, vars))
			return ctlResult{code, out.String(), errb.String()}
		}, func() []string {
			mu.Lock()
			defer mu.Unlock()
			return slices.Clone(calls)
		}
}

// registerDevice registers a device over the device API, pushes its first
// state (rollouts take only devices seen) and returns its ID.
func registerDevice(t *testing.T, s *servertest.Server, machineID, deviceType string) string {
	t.Helper()
	body := fmt.Sprintf(`{"machine_id":%q,"device_type":%q,"firmware":"1.0","enrollment_secret":%q}`, machineID, deviceType, s.EnrollmentSecret)
	resp, err := s.Client().Post(s.URL+"/api/v1/register", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var r struct {
		DeviceID string `json:"device_id"`
		Token    string `json:"token"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil || r.DeviceID == "" {
		t.Fatalf("register %s: %d %v", machineID, resp.StatusCode, err)
	}
	req, _ := http.NewRequest("POST", s.URL+"/api/v1/push", strings.NewReader(`{"seq":1,"config_version":0,"state":{"uptime":1}}`))
	req.Header.Set("Authorization", "Bearer "+r.Token)
	push, err := s.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	push.Body.Close()
	if push.StatusCode != 200 {
		t.Fatalf("push of %s: %d", machineID, push.StatusCode)
	}
	return r.DeviceID
}

// Every group of drover ctl against a real server: tables, --json parsed
// as the API's answer, CSV, and the exit codes of each kind of failure.
//
// Every request the commands made is an operation of the server's OpenAPI
// document: the CLI uses the API as documented, and a route renamed on
// the server fails here.
func TestCtlCommands(t *testing.T) {
	s := servertest.Start(t, servertest.Options{})
	ctl, calls := ctlRecorder(t, s)
	dev1 := registerDevice(t, s, "ctl-test-1", "router")
	dev2 := registerDevice(t, s, "ctl-test-2", "router")
	fw := []byte("firmware image 2.0")
	sum := sha256.Sum256(fw)
	var firmware struct {
		ID string `json:"id"`
	}
	if st := s.Admin(t, "POST", "/api/v1/firmware?device_type=router&version=2.0&sha256="+hex.EncodeToString(sum[:]), fw, &firmware); st != 201 {
		t.Fatalf("firmware upload: %d", st)
	}

	saved := map[string]string{"dev1": dev1, "dev2": dev2, "firmware": firmware.ID}
	type step struct {
		name  string
		args  []string
		stdin string
		token string // "" : the admin token; "viewer": the viewer's; else as is
		code  int
		out   []string                    // in stdout
		err   []string                    // in stderr
		json  func(t *testing.T, v any)   // stdout parsed as JSON
		save  func(v map[string]any) bool // after json: keep IDs
	}
	str := func(v any, path ...string) string {
		for _, p := range path {
			m, _ := v.(map[string]any)
			v = m[p]
		}
		s, _ := v.(string)
		return s
	}
	steps := []step{
		// devices
		{name: "devices list table", args: []string{"devices", "list"}, out: []string{"MACHINE ID", "ctl-test-1", "ctl-test-2", "router"}},
		{name: "devices list filter json", args: []string{"devices", "list", "--q", "ctl-test-2", "--json"}, json: func(t *testing.T, v any) {
			ds, _ := v.(map[string]any)["devices"].([]any)
			if len(ds) != 1 || str(ds[0], "machine_id") != "ctl-test-2" {
				t.Errorf("devices --q ctl-test-2: %v", v)
			}
		}},
		{name: "devices list csv", args: []string{"devices", "list", "--output", "csv", "--device-type", "router"}, out: []string{"id,machine_id,device_type"}},
		{name: "devices export", args: []string{"devices", "export"}, out: []string{"ctl-test-1", "ctl-test-2"}},
		{name: "devices get, flags after the argument", args: []string{"devices", "get", "{dev1}", "--json"}, json: func(t *testing.T, v any) {
			if str(v, "machine_id") != "ctl-test-1" {
				t.Errorf("devices get: %v", v)
			}
		}},
		{name: "devices history", args: []string{"devices", "history", "{dev1}"}, out: []string{"AT", "SEQ", "1"}},
		{name: "devices history json", args: []string{"devices", "history", "{dev1}", "--limit", "5", "--json"}, json: func(t *testing.T, v any) {
			if ss, _ := v.(map[string]any)["samples"].([]any); len(ss) != 1 {
				t.Errorf("history: %v", v)
			}
		}},
		{name: "devices history csv", args: []string{"devices", "history", "{dev1}", "--output", "csv"}, out: []string{"at,seq,uptime"}},
		{name: "devices history bad time", args: []string{"devices", "history", "{dev1}", "--from", "yesterday"}, code: 2, err: []string{"RFC 3339"}},
		{name: "devices get unknown", args: []string{"devices", "get", "999999"}, code: 3, err: []string{"no device 999999", "404"}},
		{name: "devices list bad filter", args: []string{"devices", "list", "--sync-state", "bogus"}, code: 2, err: []string{"sync_state must be"}},
		{name: "devices unknown command", args: []string{"devices", "frobnicate"}, code: 2, err: []string{"unknown command"}},
		{name: "devices get without ID", args: []string{"devices", "get"}, code: 2, err: []string{"takes ID"}},
		{name: "unknown flag", args: []string{"devices", "list", "--no-such-flag"}, code: 2},
		{name: "wrong token", token: "drv_wrong", args: []string{"devices", "list"}, code: 4, err: []string{"401"}},

		// profiles
		{name: "profiles list", args: []string{"profiles", "list", "--json"}, json: func(t *testing.T, v any) {
			ps, _ := v.(map[string]any)["profiles"].([]any)
			if len(ps) != 1 {
				t.Fatalf("profiles: %v", v)
			}
		}, save: func(v map[string]any) bool {
			saved["profile"] = str(v["profiles"].([]any)[0], "id")
			return true
		}},
		{name: "profiles set from stdin", args: []string{"profiles", "set", "{profile}", "--config-file", "-", "--push-interval", "90"}, stdin: `{"ntp":"pool.ntp.org","vpn":{"peer":"a"}}`,
			out: []string{"push_interval", "90", "pool.ntp.org"}},
		{name: "profiles set nothing", args: []string{"profiles", "set", "{profile}"}, code: 2, err: []string{"nothing to change"}},
		{name: "profiles set bad json", args: []string{"profiles", "set", "{profile}", "--config-file", "-"}, stdin: `{"ntp":`, code: 2, err: []string{"not valid JSON"}},
		{name: "profiles get config only", args: []string{"profiles", "get", "{profile}", "--config-only"}, json: func(t *testing.T, v any) {
			if str(v, "ntp") != "pool.ntp.org" {
				t.Errorf("config: %v", v)
			}
		}},
		{name: "profiles history", args: []string{"profiles", "history", "{profile}"}, out: []string{"REV", "updated"}},
		{name: "profiles diff", args: []string{"profiles", "diff", "{profile}", "1", "2", "--json"}, json: func(t *testing.T, v any) {
			if cs, _ := v.(map[string]any)["changes"].([]any); len(cs) != 3 {
				t.Errorf("diff 1 2: %v", v)
			}
		}},
		{name: "profiles diff table", args: []string{"profiles", "diff", "{profile}", "1", "2"}, out: []string{"/vpn", `{"peer":"a"}`, "push_interval"}},
		{name: "profiles diff bad rev", args: []string{"profiles", "diff", "{profile}", "1", "two"}, code: 2},
		{name: "profiles rollback", args: []string{"profiles", "rollback", "{profile}", "1", "--json"}, json: func(t *testing.T, v any) {
			if str(v, "id") == "" {
				t.Errorf("rollback: %v", v)
			}
		}},
		{name: "profiles get unknown", args: []string{"profiles", "get", "424242"}, code: 3},

		// users and tokens: a viewer for the 403s
		{name: "users create", args: []string{"users", "create", "vera", "viewer"}, out: []string{"vera", "viewer"}},
		{name: "users create again", args: []string{"users", "create", "vera", "viewer"}, code: 5, err: []string{"409"}},
		{name: "tokens create", args: []string{"tokens", "create", "vera", "laptop", "--expires-in", "24h", "--json"}, json: func(t *testing.T, v any) {
			if !strings.HasPrefix(str(v, "token"), "drv_") {
				t.Errorf("token: %v", v)
			}
		}, save: func(v map[string]any) bool {
			saved["viewer"], saved["tokenid"] = str(v, "token"), str(v, "id")
			return true
		}},
		{name: "users list", args: []string{"users", "list"}, out: []string{"NAME", "vera"}},
		{name: "tokens list", args: []string{"tokens", "list", "--user", "vera"}, out: []string{"{tokenid}", "laptop"}},
		{name: "whoami viewer", token: "viewer", args: []string{"users", "whoami"}, out: []string{"vera", "viewer"}},
		{name: "viewer may read", token: "viewer", args: []string{"devices", "list"}, out: []string{"ctl-test-1"}},
		{name: "viewer may not label", token: "viewer", args: []string{"labels", "assign", "x", "--all"}, code: 4, err: []string{"403"}},
		{name: "viewer may not list users", token: "viewer", args: []string{"users", "list"}, code: 4},

		// labels
		{name: "labels create", args: []string{"labels", "create", "north", "--q", "ctl-test-1"}, out: []string{"changed", "1"}},
		{name: "labels create exists", args: []string{"labels", "create", "north", "--all"}, code: 5, err: []string{"exists"}},
		{name: "labels create needs a filter", args: []string{"labels", "create", "south"}, code: 2},
		{name: "labels assign", args: []string{"labels", "assign", "north", "--all", "--json"}, json: func(t *testing.T, v any) {
			if n, _ := v.(map[string]any)["changed"].(float64); n != 1 {
				t.Errorf("assign north to all: %v", v)
			}
		}},

		// configuration layers
		{name: "config set label", args: []string{"config", "set", "--label", "north", "--priority", "3", "--values-file", "-"}, stdin: `{"apn":"north.iot","log":{"level":"info"}}`,
			out: []string{"rev", "north"}},
		{name: "rollouts start-config dry run", args: []string{"rollouts", "start-config", "north", "--values-file", "-", "--waves", "1,100%", "--dry-run", "--json"}, stdin: `{"apn":"south.iot"}`,
			json: func(t *testing.T, v any) {
				if str(v, "id") != "0" || str(v, "kind") != "config" || str(v, "config", "label") != "north" || v.(map[string]any)["total"] != 2.0 {
					t.Errorf("start-config --dry-run: %v", v)
				}
			}},
		{name: "rollouts start-profile dry run", args: []string{"rollouts", "start-profile", "{profile}", "--config-file", "-", "--dry-run", "--json"}, stdin: `{"ntp":"time.example"}`,
			json: func(t *testing.T, v any) {
				if str(v, "id") != "0" || str(v, "config", "profile_id") != saved["profile"] {
					t.Errorf("start-profile --dry-run: %v", v)
				}
			}},
		{name: "rollouts start-config dry run unknown label", args: []string{"rollouts", "start-config", "nobody", "--values-file", "-", "--dry-run"}, stdin: `{}`, code: 3},
		{name: "rollouts none after dry runs", args: []string{"rollouts", "list", "--json"}, json: func(t *testing.T, v any) {
			if rs, _ := v.(map[string]any)["rollouts"].([]any); len(rs) != 0 {
				t.Errorf("rollouts after dry runs: %v", v)
			}
		}},
		{name: "config get label after dry run", args: []string{"config", "get", "--label", "north", "--json"}, json: func(t *testing.T, v any) {
			if str(v, "values", "apn") != "north.iot" {
				t.Errorf("label values after a dry run: %v", v)
			}
		}},
		{name: "config set device", args: []string{"config", "set", "--device", "{dev1}", "--values-file", "-", "--json"}, stdin: `{"log":{"level":"debug"},"host":"${device.machine_id}"}`,
			json: func(t *testing.T, v any) {
				if n, _ := v.(map[string]any)["rev"].(float64); n != 1 {
					t.Errorf("config set device: %v", v)
				}
			}},
		{name: "config set device again", args: []string{"config", "set", "--device", "{dev1}", "--values-file", "-"}, stdin: `{"log":{"level":"warn"}}`, out: []string{"warn"}},
		{name: "config set unknown variable", args: []string{"config", "set", "--device", "{dev1}", "--values-file", "-"}, stdin: `{"x":"${device.nope}"}`,
			code: 2, err: []string{"unknown variable ${device.nope}"}},
		{name: "config set two layers", args: []string{"config", "set", "--device", "{dev1}", "--label", "north", "--values-file", "-"}, stdin: `{}`, code: 2, err: []string{"name one layer"}},
		{name: "config get device", args: []string{"config", "get", "--device", "{dev1}"}, out: []string{"warn"}},
		{name: "config get effective", args: []string{"config", "get", "--device", "{dev1}", "--effective"},
			out: []string{"PATH", "SOURCE", "/apn", `"north.iot"`, "label north", "/log/level", `"warn"`, "device"}},
		{name: "config get effective json", args: []string{"config", "get", "--device", "{dev1}", "--effective", "--json"}, json: func(t *testing.T, v any) {
			if str(v, "sources", "/log/level") != "device" || str(v, "config", "apn") != "north.iot" {
				t.Errorf("effective: %v", v)
			}
		}},
		{name: "config history", args: []string{"config", "history", "--device", "{dev1}"}, out: []string{"REV", "set"}},
		{name: "config diff", args: []string{"config", "diff", "--device", "{dev1}", "1", "2"}, out: []string{"/host", "removed", "/log/level"}},
		{name: "config rollback", args: []string{"config", "rollback", "--device", "{dev1}", "1", "--json"}, json: func(t *testing.T, v any) {
			if str(v, "note") != "rollback to revision 1" {
				t.Errorf("rollback: %v", v)
			}
		}},
		{name: "viewer may not set config", token: "viewer", args: []string{"config", "set", "--label", "north", "--values-file", "-"}, stdin: `{}`, code: 4, err: []string{"403"}},
		{name: "config delete label", args: []string{"config", "delete", "--label", "north"}, out: []string{"deleted"}},
		{name: "config get deleted", args: []string{"config", "get", "--label", "north"}, code: 3},
		{name: "labels list", args: []string{"labels", "list"}, out: []string{"NAME", "north", "2"}},
		{name: "labels assign remove", args: []string{"labels", "assign", "north", "--q", "ctl-test-2", "--remove"}, out: []string{"removed", "true"}},
		{name: "labels remove unknown", args: []string{"labels", "assign", "nowhere", "--all", "--remove"}, code: 3},
		{name: "devices list by label", args: []string{"devices", "list", "--label", "north", "--json"}, json: func(t *testing.T, v any) {
			if ds, _ := v.(map[string]any)["devices"].([]any); len(ds) != 1 {
				t.Errorf("--label north: %v", v)
			}
		}},

		// commands: the devices never push, so copies stay queued
		{name: "commands send to device", args: []string{"commands", "send", "hook", "a", "b", "--device", "{dev1}", "--json"}, json: func(t *testing.T, v any) {
			if str(v, "kind") != "hook" || str(v, "state") != "active" {
				t.Errorf("send: %v", v)
			}
		}, save: func(v map[string]any) bool { saved["job1"] = str(v, "id"); return true }},
		{name: "commands send wait times out", args: []string{"commands", "send", "ping", "example.org", "--label", "north", "--wait", "--wait-timeout", "300ms"},
			code: 6, out: []string{"DEVICE", "{dev1}", "queued"}, err: []string{"no result after 300ms"}},
		{name: "commands send two targets", args: []string{"commands", "send", "reboot", "--device", "{dev1}", "--all"}, code: 2, err: []string{"one target"}},
		{name: "commands send bad kind", args: []string{"commands", "send", "format-disk", "--all"}, code: 2},
		{name: "commands list", args: []string{"commands", "list"}, out: []string{"KIND", "hook", "ping"}},
		{name: "commands get", args: []string{"commands", "get", "{job1}"}, out: []string{"kind", "hook"}},
		{name: "commands results", args: []string{"commands", "results", "{job1}", "--json"}, json: func(t *testing.T, v any) {
			cs, _ := v.(map[string]any)["commands"].([]any)
			if len(cs) != 1 || str(cs[0], "state") != "queued" {
				t.Errorf("results: %v", v)
			}
		}},
		{name: "commands wait times out", args: []string{"commands", "wait", "{job1}", "--wait-timeout", "200ms"}, code: 6},
		{name: "commands pause", args: []string{"commands", "pause", "{job1}"}, out: []string{"paused"}},
		{name: "commands resume", args: []string{"commands", "resume", "{job1}"}, out: []string{"active"}},
		{name: "commands cancel", args: []string{"commands", "cancel", "{job1}"}, out: []string{"cancelled"}},
		{name: "commands cancel again", args: []string{"commands", "cancel", "{job1}"}, out: []string{"cancelled"}},
		{name: "commands send to no device", args: []string{"commands", "send", "reboot", "--q", "no-such-device", "--wait", "--json"}, json: func(t *testing.T, v any) {
			if cs, _ := v.(map[string]any)["commands"].([]any); len(cs) != 0 {
				t.Errorf("results of a command to no device: %v", v)
			}
		}},
		{name: "commands list json", args: []string{"commands", "list", "--limit", "1", "--json"}, json: func(t *testing.T, v any) {}, save: func(v map[string]any) bool {
			saved["done"] = str(v["jobs"].([]any)[0], "id")
			return true
		}},
		{name: "commands cancel done", args: []string{"commands", "cancel", "{done}"}, code: 5, err: []string{"cannot cancel a command that is done", "409"}},
		{name: "commands wait on cancelled", args: []string{"commands", "wait", "{job1}"}, code: 1, err: []string{"cancelled"}},
		{name: "commands get unknown", args: []string{"commands", "get", "777"}, code: 3},
		{name: "commands send viewer", token: "viewer", args: []string{"commands", "send", "reboot", "--all"}, code: 4},

		// rollouts
		{name: "rollouts start needs firmware", args: []string{"rollouts", "start"}, code: 2},
		{name: "rollouts start", args: []string{"rollouts", "start", "--firmware-id", "{firmware}", "--label", "north", "--waves", "1,50%", "--json"}, json: func(t *testing.T, v any) {
			if str(v, "firmware_id") != saved["firmware"] || str(v, "filter") != "label=north" {
				t.Errorf("rollout: %v", v)
			}
		}, save: func(v map[string]any) bool { saved["rollout"] = str(v, "id"); return true }},
		{name: "rollouts pause", args: []string{"rollouts", "pause", "{rollout}"}, out: []string{"state", "paused"}},
		{name: "rollouts status", args: []string{"rollouts", "status", "{rollout}", "--json"}, json: func(t *testing.T, v any) {
			if str(v, "state") != "paused" {
				t.Errorf("status: %v", v)
			}
		}},
		{name: "rollouts resume", args: []string{"rollouts", "resume", "{rollout}"}, out: []string{"state"}},
		{name: "rollouts list", args: []string{"rollouts", "list"}, out: []string{"FIRMWARE", "{firmware}"}},
		{name: "rollouts abort", args: []string{"rollouts", "abort", "{rollout}"}, out: []string{"aborted"}},
		{name: "rollouts status unknown", args: []string{"rollouts", "status", "999"}, code: 3},

		// rollout policies
		{name: "rollout-policies set", args: []string{"rollout-policies", "set", "slow", "-f", "-"}, stdin: `{"waves":["1","50%"],"max_failure_pct":5}`, out: []string{"slow", "50%"}},
		{name: "rollout-policies set invalid", args: []string{"rollout-policies", "set", "slow", "-f", "-"}, stdin: `{"waves":["0"]}`, code: 2, err: []string{"wave"}},
		{name: "rollout-policies set not JSON", args: []string{"rollout-policies", "set", "slow", "-f", "-"}, stdin: `waves: [1]`, code: 1, err: []string{"not JSON"}},
		{name: "rollout-policies set viewer", token: "viewer", args: []string{"rollout-policies", "set", "slow", "-f", "-"}, stdin: `{}`, code: 4},
		{name: "rollout-policies list", token: "viewer", args: []string{"rollout-policies", "list"}, out: []string{"NAME", "slow", "50%"}},
		{name: "rollout-policies get", args: []string{"rollout-policies", "get", "slow", "--json"}, json: func(t *testing.T, v any) {
			if str(v, "name") != "slow" || v.(map[string]any)["max_failure_pct"] != 5.0 {
				t.Errorf("policy: %v", v)
			}
		}},
		{name: "rollouts start by policy and flags", args: []string{"rollouts", "start", "--firmware-id", "{firmware}", "--policy", "slow", "--waves", "100%"}, code: 2, err: []string{"not both"}},
		{name: "rollouts start by policy", args: []string{"rollouts", "start", "--firmware-id", "{firmware}", "--label", "north", "--policy", "slow", "--json"}, json: func(t *testing.T, v any) {
			if str(v, "policy") != "slow" || fmt.Sprint(v.(map[string]any)["waves"]) != "[1 50%]" {
				t.Errorf("rollout by policy: %v", v)
			}
		}, save: func(v map[string]any) bool { saved["rollout2"] = str(v, "id"); return true }},
		{name: "rollouts abort by policy", args: []string{"rollouts", "abort", "{rollout2}"}, out: []string{"aborted"}},
		{name: "rollout-policies delete", args: []string{"rollout-policies", "delete", "slow"}, out: []string{"deleted"}},
		{name: "rollout-policies get deleted", args: []string{"rollout-policies", "get", "slow"}, code: 3},

		// tokens revoked, users deleted
		{name: "tokens revoke", args: []string{"tokens", "revoke", "{tokenid}"}, out: []string{"revoked_at"}},
		{name: "revoked token", token: "viewer", args: []string{"devices", "list"}, code: 4},
		{name: "users delete", args: []string{"users", "delete", "vera"}, out: []string{"deleted"}},
		{name: "users delete unknown", args: []string{"users", "delete", "vera"}, code: 3},
		{name: "labels delete", args: []string{"labels", "delete", "north"}, out: []string{"deleted"}},

		// usage
		{name: "no group", args: nil, code: 2, err: []string{"usage: drover ctl"}},
		{name: "help", args: []string{"--help"}, out: []string{"devices", "profiles", "labels", "commands", "rollouts", "users", "tokens", "completion", "Exit codes"}},
		{name: "command help", args: []string{"commands", "send", "--help"}, out: []string{"-wait-timeout", "-api-token-file", "-ca-cert"}},
		{name: "unknown group", args: []string{"nope"}, code: 2},
		{name: "json and csv", args: []string{"devices", "list", "--json", "--output", "csv"}, code: 2},
		{name: "csv where there is none", args: []string{"labels", "list", "--output", "csv"}, code: 2},
	}
	placeholder := regexp.MustCompile(`\{(\w+)\}`)
	fill := func(s string) string {
		return placeholder.ReplaceAllStringFunc(s, func(m string) string {
			if v, ok := saved[m[1:len(m)-1]]; ok {
				return v
			}
			return m
		})
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			token := s.AdminToken
			switch st.token {
			case "":
			case "viewer":
				token = saved["viewer"]
			default:
				token = st.token
			}
			args := make([]string, len(st.args))
			for i, a := range st.args {
				args[i] = fill(a)
			}
			r := ctl(token, st.stdin, args...)
			if r.code != st.code {
				t.Fatalf("drover ctl %s: exit %d, want %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), r.code, st.code, r.stdout, r.stderr)
			}
			for _, w := range st.out {
				if !strings.Contains(r.stdout, fill(w)) {
					t.Errorf("stdout lacks %q:\n%s", fill(w), r.stdout)
				}
			}
			for _, w := range st.err {
				if !strings.Contains(r.stderr, fill(w)) {
					t.Errorf("stderr lacks %q:\n%s", fill(w), r.stderr)
				}
			}
			if st.json != nil || st.save != nil {
				var v map[string]any
				if err := json.Unmarshal([]byte(r.stdout), &v); err != nil {
					t.Fatalf("stdout is not one JSON object: %v\n%s", err, r.stdout)
				}
				if st.json != nil {
					st.json(t, v)
				}
				if st.save != nil {
					st.save(v)
				}
			}
		})
	}
	// The CSV export is the API's: every device, a header first.
	r := ctl(s.AdminToken, "", "devices", "export")
	rows, err := csv.NewReader(strings.NewReader(r.stdout)).ReadAll()
	if err != nil || len(rows) != 3 || rows[0][0] != "id" {
		t.Fatalf("export: %v %q", err, r.stdout)
	}

	var doc struct {
		Paths map[string]map[string]json.RawMessage `json:"paths"`
	}
	if st := s.Admin(t, "GET", "/api/v1/openapi.json", nil, &doc); st != 200 || len(doc.Paths) == 0 {
		t.Fatalf("openapi.json: %d", st)
	}
	type op struct {
		method string
		path   *regexp.Regexp
	}
	var ops []op
	for p, methods := range doc.Paths {
		re := regexp.MustCompile("^" + regexp.MustCompile(`\\\{[^}]+\\\}`).ReplaceAllString(regexp.QuoteMeta(p), "[^/]+") + "$")
		for m := range methods {
			ops = append(ops, op{strings.ToUpper(m), re})
		}
	}
	seen := map[string]bool{}
	for _, c := range calls() {
		method, path, _ := strings.Cut(c, " ")
		if !slices.ContainsFunc(ops, func(o op) bool { return o.method == method && o.path.MatchString(path) }) {
			t.Errorf("drover ctl called %s, which the OpenAPI document does not describe", c)
		}
		seen[method] = true
	}
	if !seen["GET"] || !seen["POST"] || !seen["PATCH"] || !seen["DELETE"] {
		t.Errorf("requests recorded: %v", seen)
	}
}

// Tables are aligned: every row's columns start where the heading's do.
func TestCtlTableAligned(t *testing.T) {
	s := servertest.Start(t, servertest.Options{})
	ctl := ctlRunner(t, s)
	registerDevice(t, s, "short", "a")
	registerDevice(t, s, "a-much-longer-machine-id", "another-type")
	r := ctl(s.AdminToken, "", "devices", "list")
	lines := strings.Split(strings.TrimRight(r.stdout, "\n"), "\n")
	if r.code != 0 || len(lines) != 3 {
		t.Fatalf("devices list: %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	col := strings.Index(lines[0], "TYPE")
	for _, l := range lines[1:] {
		if len(l) <= col || l[col-1] != ' ' || l[col] == ' ' {
			t.Errorf("TYPE column not at %d in %q", col, l)
		}
	}
}

// The config file and the flags: a flag wins over the environment, which
// wins over the file; the token can come from a file of its own.
func TestCtlConfigSources(t *testing.T) {
	s := servertest.Start(t, servertest.Options{})
	dir := t.TempDir()
	ca := filepath.Join(dir, "cert.pem")
	tokenFile := filepath.Join(dir, "token")
	conf := filepath.Join(dir, "ctl.toml")
	os.WriteFile(ca, s.CACertPEM, 0o600)
	os.WriteFile(tokenFile, []byte(s.AdminToken+"\n"), 0o600)
	os.WriteFile(conf, []byte(fmt.Sprintf("server = %q\nca-cert = %q\napi-token = %q\noutput = \"json\"\n", s.URL, ca, s.AdminToken)), 0o600)
	runCtl := func(vars map[string]string, args ...string) ctlResult {
		var out, errb bytes.Buffer
		code := run(context.Background(), append([]string{"ctl"}, args...), testEnv(nil, &out, &errb, vars))
		return ctlResult{code, out.String(), errb.String()}
	}
	if r := runCtl(map[string]string{"DROVER_CONFIG": conf}, "users", "whoami"); r.code != 0 || !json.Valid([]byte(r.stdout)) {
		t.Fatalf("from the config file: %d %s %s", r.code, r.stdout, r.stderr)
	}
	// The environment's wrong token wins over the file's: 401.
	if r := runCtl(map[string]string{"DROVER_CONFIG": conf, "DROVER_API_TOKEN": "drv_wrong"}, "users", "whoami"); r.code != 4 {
		t.Fatalf("environment over file: exit %d %s", r.code, r.stderr)
	}
	// The token from a file of its own (out of the environment and the
	// process list).
	if r := runCtl(map[string]string{"DROVER_SERVER": s.URL, "DROVER_CA_CERT": ca, "DROVER_API_TOKEN_FILE": tokenFile}, "users", "whoami"); r.code != 0 || !strings.Contains(r.stdout, "admin") {
		t.Fatalf("token file: exit %d %s %s", r.code, r.stdout, r.stderr)
	}
	// A flag wins over the file: the table, not the file's json.
	if r := runCtl(map[string]string{"DROVER_CONFIG": conf}, "users", "whoami", "--output", "table"); r.code != 0 || json.Valid([]byte(r.stdout)) {
		t.Fatalf("flag over file: exit %d %s", r.code, r.stdout)
	}
	// A command's own flags come from its command line only: an agent's
	// DROVER_DEVICE_TYPE does not narrow a listing, and a file key of one
	// is refused.
	registerDevice(t, s, "cfg-1", "router")
	if r := runCtl(map[string]string{"DROVER_CONFIG": conf, "DROVER_DEVICE_TYPE": "switch", "DROVER_LIMIT": "x"}, "devices", "list"); r.code != 0 || !strings.Contains(r.stdout, "cfg-1") {
		t.Fatalf("DROVER_DEVICE_TYPE filtered devices list: exit %d %s %s", r.code, r.stdout, r.stderr)
	}
	os.WriteFile(filepath.Join(dir, "limit.toml"), []byte(fmt.Sprintf("server = %q\nlimit = 5\n", s.URL)), 0o600)
	if r := runCtl(map[string]string{"DROVER_CONFIG": filepath.Join(dir, "limit.toml")}, "devices", "list"); r.code != 2 || !strings.Contains(r.stderr, `unknown key "limit"`) {
		t.Fatalf("limit in the config file: exit %d %s", r.code, r.stderr)
	}
	// drover serve's file serves: its keys are not errors.
	os.WriteFile(filepath.Join(dir, "serve.toml"), []byte(fmt.Sprintf("server = %q\nca-cert = %q\napi-token = %q\npush-interval = 60\n", s.URL, ca, s.AdminToken)), 0o600)
	if r := runCtl(map[string]string{"DROVER_CONFIG": filepath.Join(dir, "serve.toml")}, "users", "whoami"); r.code != 0 {
		t.Fatalf("serve's keys in the file: exit %d %s", r.code, r.stderr)
	}
	// Without the CA the self-signed certificate is refused, never skipped.
	if r := runCtl(map[string]string{"DROVER_SERVER": s.URL, "DROVER_API_TOKEN": s.AdminToken}, "users", "whoami"); r.code != 1 || !strings.Contains(r.stderr, "certificate") {
		t.Fatalf("no CA: exit %d %s", r.code, r.stderr)
	}
	// --insecure is explicit, and says so.
	if r := runCtl(map[string]string{"DROVER_SERVER": s.URL, "DROVER_API_TOKEN": s.AdminToken}, "users", "whoami", "--insecure"); r.code != 0 || !strings.Contains(r.stderr, "not verified") {
		t.Fatalf("--insecure: exit %d %s", r.code, r.stderr)
	}
	// No token at all is a usage error naming where one goes.
	if r := runCtl(map[string]string{"DROVER_SERVER": s.URL}, "users", "whoami"); r.code != 2 || !strings.Contains(r.stderr, "DROVER_API_TOKEN") {
		t.Fatalf("no token: exit %d %s", r.code, r.stderr)
	}
	if r := runCtl(map[string]string{"DROVER_CONFIG": conf}, "users", "whoami", "--server", "ftp://x"); r.code != 2 {
		t.Fatalf("bad server URL: exit %d %s", r.code, r.stderr)
	}
}

// Shell completion comes from the command table: every group, command and
// flag; the bash script runs in bash and completes.
func TestCtlCompletion(t *testing.T) {
	for _, sh := range []string{"bash", "zsh", "fish"} {
		var out, errb bytes.Buffer
		if code := run(context.Background(), []string{"ctl", "completion", sh}, testEnv(nil, &out, &errb, nil)); code != 0 {
			t.Fatalf("completion %s: exit %d %s", sh, code, errb.String())
		}
		for _, g := range ctlGroups {
			if !strings.Contains(out.String(), g.name) {
				t.Errorf("%s completion lacks group %s", sh, g.name)
			}
		}
		for _, c := range ctlCommands {
			if !strings.Contains(out.String(), c.name) {
				t.Errorf("%s completion lacks %s %s", sh, c.group, c.name)
			}
		}
		for _, w := range []string{"wait-timeout", "api-token-file", "ca-cert", "sync-state", "serve"} {
			if !strings.Contains(out.String(), w) {
				t.Errorf("%s completion lacks %s", sh, w)
			}
		}
	}
	var errb bytes.Buffer
	if code := run(context.Background(), []string{"ctl", "completion", "tcsh"}, testEnv(nil, &bytes.Buffer{}, &errb, nil)); code != 2 {
		t.Errorf("completion tcsh: exit %d, want 2", code)
	}
	script := func(sh string) string {
		var out bytes.Buffer
		run(context.Background(), []string{"ctl", "completion", sh}, testEnv(nil, &out, &errb, nil))
		file := filepath.Join(t.TempDir(), "drover."+sh)
		os.WriteFile(file, out.Bytes(), 0o600)
		return file
	}
	quote := func(words []string) string {
		q := make([]string, len(words))
		for i, w := range words {
			q[i] = fmt.Sprintf("%q", w)
		}
		return strings.Join(q, " ")
	}
	// Each shell completes these (the cursor on the last word) to want.
	cases := []struct {
		words []string
		want  string
	}{
		{[]string{"drover", "c"}, "ctl"},
		{[]string{"drover", "ctl", "pro"}, "profiles"},
		{[]string{"drover", "ctl", "commands", "se"}, "send"},
		{[]string{"drover", "ctl", "commands", "send", "--wa"}, "--wait --wait-timeout"},
		{[]string{"drover", "ctl", "devices", "list", "--sync"}, "--sync-state"},
	}
	// zsh: the script's function with the completion system's functions
	// as stubs that print what they were offered.
	t.Run("zsh", func(t *testing.T) {
		zsh, err := exec.LookPath("zsh")
		if err != nil {
			t.Skip("no zsh")
		}
		file := script("zsh")
		for _, c := range cases {
			prog := fmt.Sprintf(`compdef() { :; }
_describe() { shift 3; local i; for i in ${(P)1}; do print -r -- ${i%%%%:*}; done; }
compadd() { shift; print -l -- "$@"; }
_files() { :; }
source %q; words=(%s); CURRENT=%d; _drover`, file, quote(c.words), len(c.words))
			out, err := exec.Command(zsh, "-f", "-c", prog).CombinedOutput()
			if err != nil {
				t.Fatalf("zsh: %v\n%s", err, out)
			}
			var got []string
			for _, l := range strings.Fields(string(out)) {
				if strings.HasPrefix(l, c.words[len(c.words)-1]) {
					got = append(got, l)
				}
			}
			if strings.Join(got, " ") != c.want {
				t.Errorf("zsh completing %q: %q, want %q", c.words, got, c.want)
			}
		}
	})
	t.Run("fish", func(t *testing.T) {
		fish, err := exec.LookPath("fish")
		if err != nil {
			t.Skip("no fish")
		}
		file := script("fish")
		for _, c := range cases {
			out, err := exec.Command(fish, "--no-config", "-c", fmt.Sprintf("source %q; complete -C %q", file, strings.Join(c.words, " "))).CombinedOutput()
			if err != nil {
				t.Fatalf("fish: %v\n%s", err, out)
			}
			var got []string
			for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
				got = append(got, strings.SplitN(l, "\t", 2)[0])
			}
			if strings.Join(got, " ") != c.want {
				t.Errorf("fish completing %q: %q, want %q", c.words, got, c.want)
			}
		}
	})
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("no bash")
	}
	file := script("bash")
	complete := func(words ...string) string {
		t.Helper()
		// COMP_WORDS as bash fills it, the cursor on the last word.
		prog := fmt.Sprintf(`source %q; COMP_WORDS=(%s); COMP_CWORD=%d; _drover; echo "${COMPREPLY[*]}"`, file, quote(words), len(words)-1)
		out, err := exec.Command(bash, "--norc", "-c", prog).CombinedOutput()
		if err != nil {
			t.Fatalf("bash: %v\n%s", err, out)
		}
		return strings.TrimSpace(string(out))
	}
	for _, c := range cases {
		if got := complete(c.words...); got != c.want {
			t.Errorf("bash completing %q: %q, want %q", c.words, got, c.want)
		}
	}
}
