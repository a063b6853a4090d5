package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/internal/server/servertest"
)

// Device and group values over the profile through the API: the
// effective configuration with each member's source, refused values
// (unknown variables, a schema) changing nothing, history, diff,
// rollback, audit rows, and the push answer following the effective
// version.
func TestConfigLayersAPI(t *testing.T) {
	s := servertest.Start(t, servertest.Options{})
	c := &client{t: t, s: s, url: s.URL}
	id, token := c.register("m-1")
	c.register("m-2")
	view, op := userToken(c, "vera", "viewer"), userToken(c, "otto", "operator")
	if st, _, out := c.do("PATCH", "/api/v1/profiles/1", op, `{"config":{"apn":"iot","log":{"level":"info"}}}`); st != 200 {
		t.Fatalf("profile: %d %v", st, out)
	}
	dev := "/api/v1/devices/" + id + "/config"
	if st, _, out := c.do("GET", dev, view, nil); st != 404 {
		t.Fatalf("no values yet: %d %v", st, out)
	}
	if st, _, out := c.do("PUT", dev, view, `{"values":{"a":1}}`); st != 403 {
		t.Fatalf("viewer writes: %d %v", st, out)
	}
	st, _, out := c.do("PUT", dev, op, `{"values":{"a":"${device.nope}"}}`)
	if e, _ := out["error"].(map[string]any); st != 400 || e["code"] != "invalid_field" || !strings.Contains(fmt.Sprint(e["message"]), "unknown variable ${device.nope}") {
		t.Fatalf("unknown variable: %d %v", st, out)
	}
	if st, _, out := c.do("PUT", dev, op, `{"values":{"log":{"level":"debug"},"name":"${device.machine_id}"}}`); st != 200 || out["rev"] != 1.0 {
		t.Fatalf("device values: %d %v", st, out)
	}
	if st, _, out := c.do("POST", "/api/v1/labels/assign", op, `{"label":"site=north","filter":{}}`); st != 200 {
		t.Fatalf("assign: %d %v", st, out)
	}
	if st, _, out := c.do("PUT", "/api/v1/labels/site=north/config", op, `{"values":{"apn":"${label.site}.iot"},"priority":5}`); st != 200 {
		t.Fatalf("label values: %d %v", st, out)
	}
	if st, _, out := c.do("PUT", "/api/v1/labels/nobody/config", op, `{"values":{}}`); st != 404 {
		t.Fatalf("unknown label: %d %v", st, out)
	}
	st, _, eff := c.do("GET", dev+"/effective", view, nil)
	cfg, _ := json.Marshal(eff["config"])
	want := `{"apn":"north.iot","log":{"level":"debug"},"name":"m-1"}`
	src, _ := eff["sources"].(map[string]any)
	if st != 200 || string(cfg) != want || src["/apn"] != "label site=north" || src["/log/level"] != "device" || eff["sync_state"] != "arriving" {
		t.Fatalf("effective: %d %v", st, eff)
	}
	version := eff["version"].(float64)

	// A device type's schema refuses values breaking it, with its reason.
	if st, _, out := c.do("PUT", "/api/v1/device-types/ICR-3241/schema", op,
		`{"values":{"type":"object","properties":{"log":{"properties":{"level":{"enum":["debug","info","warn"]}}}}}}`); st != 200 {
		t.Fatalf("schema: %d %v", st, out)
	}
	st, _, out = c.do("PUT", dev, op, `{"values":{"log":{"level":"loud"}}}`)
	if e, _ := out["error"].(map[string]any); st != 422 || e["code"] != "schema_violation" || !strings.Contains(fmt.Sprint(e["message"]), "/log/level") {
		t.Fatalf("against the schema: %d %v", st, out)
	}
	if _, _, out := c.do("GET", dev, view, nil); out["rev"] != 1.0 {
		t.Fatalf("refused values changed the layer: %v", out)
	}

	// The push answer carries the effective configuration; applying it
	// puts the device in sync.
	st, _, ans := c.do("POST", "/api/v1/push", token, fmt.Sprintf(state, 1, 0))
	conf, _ := ans["config"].(map[string]any)
	data, _ := json.Marshal(conf["data"])
	if st != 200 || conf["version"] != version || string(data) != want {
		t.Fatalf("push answer: %d %v", st, ans)
	}
	c.do("POST", "/api/v1/push", token, fmt.Sprintf(state, 2, int64(version)))
	if _, _, d := c.do("GET", "/api/v1/devices/"+id, view, nil); d["sync_state"] != "synchronized" || d["desired_version"] != version {
		t.Fatalf("after applying: %v", d)
	}

	// History, diff, rollback.
	if st, _, out := c.do("PUT", dev, op, `{"values":{"log":{"level":"warn"}}}`); st != 200 || out["rev"] != 2.0 {
		t.Fatalf("second values: %d %v", st, out)
	}
	if st, _, out := c.do("GET", dev+"/history", view, nil); st != 200 || len(out["revisions"].([]any)) != 2 {
		t.Fatalf("history: %d %v", st, out)
	}
	st, _, diff := c.do("GET", dev+"/diff?from=1&to=2", view, nil)
	if ch, _ := diff["changes"].([]any); st != 200 || len(ch) != 2 {
		t.Fatalf("diff: %d %v", st, diff)
	}
	if st, _, out := c.do("POST", dev+"/rollback", op, `{"rev":1}`); st != 200 || out["rev"] != 3.0 || out["note"] != "rollback to revision 1" {
		t.Fatalf("rollback: %d %v", st, out)
	}
	if _, _, eff := c.do("GET", dev+"/effective", view, nil); eff["version"] == version {
		t.Fatal("rollback kept the effective version: the device is not sent it again")
	}
	if st, _, out := c.do("DELETE", "/api/v1/labels/site=north/config", op, nil); st != 200 {
		t.Fatalf("delete label values: %d %v", st, out)
	}
	if st, _, out := c.do("GET", "/api/v1/labels/site=north/config", view, nil); st != 404 {
		t.Fatalf("deleted label values: %d %v", st, out)
	}

	// Every change left an audit row.
	st, _, audit := c.do("GET", "/api/v1/audit?object=/api/v1/devices/"+id+"/config", s.AdminToken, nil)
	if es, _ := audit["entries"].([]any); st != 200 || len(es) != 2 {
		t.Fatalf("audit of the device values: %d %v", st, audit)
	}
	st, _, audit = c.do("GET", "/api/v1/audit?object=/api/v1/labels/site=north/config", s.AdminToken, nil)
	if es, _ := audit["entries"].([]any); st != 200 || len(es) != 2 {
		t.Fatalf("audit of the label values: %d %v", st, audit)
	}
}

// A device holding its connection is told to push when its own values,
// its label's values, or a label with values assigned to it change;
// another device's values tell it nothing.
func TestConfigLayersNudgeConnections(t *testing.T) {
	s := servertest.Start(t, servertest.Options{})
	c := &client{t: t, s: s, url: s.URL}
	id, token := c.register("m-conn")
	other, _ := c.register("m-other")
	ws := dialConnect(t, s, token)
	waitMetric(t, s, "drover_device_connections", 1)
	msgs := make(chan string, 8)
	go func() {
		for {
			_, m, err := ws.Read(context.Background())
			if err != nil {
				return
			}
			msgs <- string(m)
		}
	}()
	nudged := func(what string) {
		t.Helper()
		select {
		case m := <-msgs:
			if m != `{"type":"push"}` {
				t.Fatalf("%s: message %q", what, m)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: no nudge within 5 s", what)
		}
	}
	must := func(method, path, body string) {
		t.Helper()
		if st, _, out := c.do(method, path, s.AdminToken, body); st != 200 {
			t.Fatalf("%s %s: %d %v", method, path, st, out)
		}
	}
	must("PUT", "/api/v1/devices/"+other+"/config", `{"values":{"a":1}}`)
	must("PUT", "/api/v1/devices/"+id+"/config", `{"values":{"a":1}}`)
	nudged("own values")
	select {
	case m := <-msgs:
		t.Fatalf("another device's values nudged this one: %q", m)
	default:
	}
	must("POST", "/api/v1/labels/assign", `{"label":"g","filter":{"q":"m-other"}}`)
	must("PUT", "/api/v1/labels/g/config", `{"values":{"b":1}}`)
	must("POST", "/api/v1/labels/assign", `{"label":"g","filter":{"q":"m-conn"}}`)
	nudged("label with values assigned")
	must("PUT", "/api/v1/labels/g/config", `{"values":{"b":2}}`)
	nudged("label values changed")
}
