package server_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/drover/drover/internal/server/servertest"
)

// TestCommandAPI: an operator sends commands to a device and to a label;
// they ride on push answers, results on pushes; jobs show progress, can be
// paused and cancelled, need the admin token, and survive a restart.
func TestCommandAPI(t *testing.T) {
	dir := t.TempDir()
	s := servertest.Start(t, servertest.Options{DataDir: dir})
	c := &client{t: t, s: s, url: s.URL}
	tok := s.AdminToken
	var ids, tokens []string
	for i := range 4 {
		id, dt := c.register(fmt.Sprintf("m-%d", i))
		ids, tokens = append(ids, id), append(tokens, dt)
	}
	if st, _, _ := c.do("POST", "/api/v1/commands", "", map[string]any{"kind": "reboot", "device_id": ids[0]}); st != 401 {
		t.Fatalf("without the admin token: %d", st)
	}
	if st, _, _ := c.do("POST", "/api/v1/commands", tokens[0], map[string]any{"kind": "reboot", "device_id": ids[0]}); st != 401 {
		t.Fatalf("with a device token: %d", st)
	}
	for _, bad := range []map[string]any{
		{"kind": "shell", "args": []string{"rm -rf /"}, "device_id": ids[0]},
		{"kind": "ping", "args": []string{"-f"}, "device_id": ids[0]},
		{"kind": "reboot"},
		{"kind": "reboot", "device_id": ids[0], "label": "x"},
		{"kind": "reboot", "filter": map[string]any{"liveness": "bogus"}},
		{"kind": "reboot", "device_id": ids[0], "expires_in": -1},
		{"kind": "reboot", "device_id": ids[0], "timeout": 99999},
	} {
		if st, _, out := c.do("POST", "/api/v1/commands", tok, bad); st != 400 {
			t.Fatalf("%v: %d %v", bad, st, out)
		}
	}
	if st, _, _ := c.do("POST", "/api/v1/commands", tok, map[string]any{"kind": "reboot", "device_id": "999"}); st != 404 {
		t.Fatalf("unknown device: %d", st)
	}
	st, _, one := c.do("POST", "/api/v1/commands", tok, map[string]any{"kind": "ping", "args": []string{"192.0.2.1"}, "timeout": 10, "device_id": ids[0]})
	if st != 201 || one["total"] != float64(1) || one["state"] != "active" {
		t.Fatalf("send: %d %v", st, one)
	}
	c.do("POST", "/api/v1/labels/assign", tok, map[string]any{"label": "north", "filter": map[string]any{"q": "m-"}})
	st, _, bulk := c.do("POST", "/api/v1/commands", tok, map[string]any{"kind": "read-log", "args": []string{"messages"}, "label": "north"})
	if st != 201 || bulk["total"] != float64(4) {
		t.Fatalf("bulk: %d %v", st, bulk)
	}
	s.Srv.Fleet().WaitCommands()
	st, _, out := c.do("POST", "/api/v1/push", tokens[0], `{"seq":1,"state":{}}`)
	cmds, _ := out["commands"].([]any)
	if st != 200 || len(cmds) != 2 {
		t.Fatalf("push: %d %v", st, out)
	}
	first := cmds[0].(map[string]any)
	if first["kind"] != "ping" || first["timeout"] != float64(10) || fmt.Sprint(first["args"]) != "[192.0.2.1]" {
		t.Fatalf("command %v", first)
	}
	if _, _, out := c.do("POST", "/api/v1/commands/"+bulk["id"].(string)+"/pause", tok, nil); out["state"] != "paused" {
		t.Fatalf("pause: %v", out)
	}
	if _, _, out := c.do("POST", "/api/v1/push", tokens[1], `{"seq":1,"state":{}}`); out["commands"] != nil {
		t.Fatalf("paused job delivered: %v", out)
	}
	push := fmt.Sprintf(`{"seq":2,"state":{},"results":[{"id":%s,"exit_code":0,"output":["64 bytes from 192.0.2.1"],"started_at":1,"finished_at":2}]}`, one["id"])
	if st, _, out := c.do("POST", "/api/v1/push", tokens[0], push); st != 200 {
		t.Fatalf("push with result: %d %v", st, out)
	}
	if st, _, _ := c.do("POST", "/api/v1/push", tokens[0], `{"seq":3,"state":{},"results":[{"id":1,"output":["a\nb"]}]}`); st != 400 {
		t.Fatalf("control characters in output: %d", st)
	}

	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	s = servertest.Start(t, servertest.Options{DataDir: dir})
	c = &client{t: t, s: s, url: s.URL}
	_, _, out = c.do("GET", "/api/v1/commands/"+one["id"].(string), tok, nil)
	if counts := out["counts"].(map[string]any); counts["succeeded"] != float64(1) {
		t.Fatalf("after restart: %v", out)
	}
	_, _, out = c.do("GET", "/api/v1/devices/"+ids[0]+"/commands", tok, nil)
	list := out["commands"].([]any)
	if len(list) != 2 || list[1].(map[string]any)["state"] != "succeeded" || fmt.Sprint(list[1].(map[string]any)["output"]) != "[64 bytes from 192.0.2.1]" {
		t.Fatalf("device's commands: %v", out)
	}
	if _, _, out := c.do("POST", "/api/v1/commands/"+bulk["id"].(string)+"/resume", tok, nil); out["state"] != "active" {
		t.Fatalf("resume: %v", out)
	}
	if _, _, out := c.do("POST", "/api/v1/push", tokens[1], `{"seq":2,"state":{}}`); len(out["commands"].([]any)) != 1 {
		t.Fatalf("resumed job not delivered: %v", out)
	}
	st, _, out = c.do("POST", "/api/v1/commands/"+bulk["id"].(string)+"/cancel", tok, nil)
	if counts := out["counts"].(map[string]any); st != 200 || out["state"] != "cancelled" || counts["cancelled"] != float64(2) || counts["delivered"] != float64(2) {
		t.Fatalf("cancel: %d %v", st, out)
	}
	if st, _, _ := c.do("POST", "/api/v1/commands/"+bulk["id"].(string)+"/pause", tok, nil); st != 409 {
		t.Fatalf("pause a cancelled job: %d", st)
	}
	_, _, out = c.do("GET", "/api/v1/commands/"+bulk["id"].(string)+"/devices?state=cancelled&limit=1", tok, nil)
	if len(out["commands"].([]any)) != 1 || out["next_after"] == nil {
		t.Fatalf("page: %v", out)
	}
	if st, _, _ := c.do("GET", "/api/v1/commands/"+bulk["id"].(string)+"/devices?state=bogus", tok, nil); st != 400 {
		t.Fatal("bad state accepted")
	}
	if _, _, out := c.do("GET", "/api/v1/commands", tok, nil); len(out["jobs"].([]any)) != 2 {
		t.Fatalf("jobs: %v", out)
	}
}

// TestCommandDoneAtLastResult: a job is done as its last copy's result
// arrives; cancelling it then answers 409 with the JSON error body and
// changes nothing (no relabelling as cancelled).
func TestCommandDoneAtLastResult(t *testing.T) {
	s := servertest.Start(t, servertest.Options{})
	c := &client{t: t, s: s, url: s.URL}
	tok := s.AdminToken
	id, dt := c.register("m-done")
	st, _, job := c.do("POST", "/api/v1/commands", tok, map[string]any{"kind": "ping", "args": []string{"192.0.2.1"}, "device_id": id})
	if st != 201 {
		t.Fatalf("send: %d %v", st, job)
	}
	if st, _, out := c.do("POST", "/api/v1/push", dt, `{"seq":1,"state":{}}`); st != 200 || len(out["commands"].([]any)) != 1 {
		t.Fatalf("push: %d %v", st, out)
	}
	push := fmt.Sprintf(`{"seq":2,"state":{},"results":[{"id":%s,"exit_code":0,"output":["pong"],"started_at":1700000000,"finished_at":1700000003}]}`, job["id"])
	if st, _, out := c.do("POST", "/api/v1/push", dt, push); st != 200 {
		t.Fatalf("push with result: %d %v", st, out)
	}
	path := "/api/v1/commands/" + job["id"].(string)
	if _, _, out := c.do("GET", path, tok, nil); out["state"] != "done" || out["counts"].(map[string]any)["succeeded"] != float64(1) {
		t.Fatalf("after the last result: %v", out)
	}
	st, _, out := c.do("POST", path+"/cancel", tok, nil)
	e, _ := out["error"].(map[string]any)
	if st != 409 || e["code"] != "conflict" || !strings.Contains(fmt.Sprint(e["message"]), "done") {
		t.Fatalf("cancel of a done job: %d %v", st, out)
	}
	_, _, out = c.do("GET", path, tok, nil)
	if counts := out["counts"].(map[string]any); out["state"] != "done" || counts["cancelled"] != float64(0) || counts["succeeded"] != float64(1) {
		t.Fatalf("after the refused cancel: %v", out)
	}
	_, _, out = c.do("GET", path+"/devices", tok, nil)
	dc := out["commands"].([]any)[0].(map[string]any)
	if dc["state"] != "succeeded" || dc["finished_at"] == nil || dc["started_on"] != float64(1700000000) || dc["finished_on"] != float64(1700000003) {
		t.Fatalf("the device's copy: %v", dc)
	}
}
