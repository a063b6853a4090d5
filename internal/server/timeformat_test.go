package server_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/internal/server/servertest"
)

// Every time in every JSON answer of the API's GET routes is RFC 3339 in
// UTC ("…Z"), whichever route gives it: one time format for clients. (The
// process's zone is not changed here: time.Local is read by running
// servers, a data race; TZ=Europe/Berlin go test … runs it in another.)
func TestAPITimesAreRFC3339UTC(t *testing.T) {
	looksLikeTime := regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d`)
	times := 0
	for path, out := range everyGETAnswer(t) {
		walkJSON(path, "", out, func(where, _ string, v any) {
			if x, ok := v.(string); ok && looksLikeTime.MatchString(x) {
				times++
				if _, err := time.Parse(time.RFC3339Nano, x); err != nil || !strings.HasSuffix(x, "Z") {
					t.Errorf("%s = %q: not RFC 3339 in UTC", where, x)
				}
			}
		})
	}
	t.Logf("%d times checked", times)
	if times < 5 {
		t.Fatalf("only %d times seen in the answers", times)
	}
}

// everyGETAnswer is the 200 answer of every GET route of openapi.json
// (but /metrics, files and the device connection), by "GET path", from a
// server with a device that pushed, was blocked and approved, carries a
// label and got a command, an enrollment token, and a rollout.
func everyGETAnswer(t *testing.T) map[string]any {
	s := servertest.Start(t, servertest.Options{})
	c := &client{t: t, s: s, url: s.URL}
	id, tok := c.register("m-1")
	for seq := 1; seq <= 2; seq++ {
		c.do("POST", "/api/v1/push", tok, fmt.Sprintf(state, seq, 0))
	}
	c.do("POST", "/api/v1/devices/"+id+"/block", s.AdminToken, nil) // an audit entry
	c.do("POST", "/api/v1/devices/"+id+"/approve", s.AdminToken, nil)
	c.do("POST", "/api/v1/enrollment-tokens", s.AdminToken, map[string]any{"machine_id": "m-9", "ttl": "1h"})
	if st, _, out := c.do("POST", "/api/v1/labels/assign", s.AdminToken, map[string]any{"label": "lab", "filter": map[string]any{}}); st != 200 {
		t.Fatalf("label: %d %v", st, out)
	}
	c.do("POST", "/api/v1/commands", s.AdminToken, map[string]any{"device_id": id, "command": "reboot"})
	for _, p := range []string{"/api/v1/devices/" + id + "/config", "/api/v1/labels/lab/config", "/api/v1/device-types/ICR-3241/schema"} {
		if st, _, out := c.do("PUT", p, s.AdminToken, `{"values":{"type":"object"}}`); st != 200 {
			t.Fatalf("layer %s: %d %v", p, st, out)
		}
	}
	// Firmware and a rollout of it, created with the ID the upload gave.
	resp, b := c.raw("POST", "/api/v1/firmware?device_type=ICR-3241&version=7.0.0", s.AdminToken, bytes.Repeat([]byte("fw"), 1000), nil)
	var fw struct{ ID string }
	if resp.StatusCode != 201 || json.Unmarshal(b, &fw) != nil || fw.ID == "" {
		t.Fatalf("firmware upload: %d %s", resp.StatusCode, b)
	}
	if st, _, out := c.do("POST", "/api/v1/rollouts", s.AdminToken, map[string]any{"firmware_id": fw.ID, "waves": []string{"100%"}}); st != 201 {
		t.Fatalf("rollout of firmware %s: %d %v", fw.ID, st, out)
	}
	_, body := c.raw("GET", "/api/v1/openapi.json", "", nil, nil)
	var doc struct {
		Paths map[string]map[string]json.RawMessage `json:"paths"`
	}
	if err := json.Unmarshal(body, &doc); err != nil {
		t.Fatal(err)
	}
	answers := map[string]any{}
	fill := strings.NewReplacer("{id}", id, "{name}", "lab", "{machine_id}", "m-1", "{type}", "ICR-3241")
	for path, ops := range doc.Paths {
		if _, ok := ops["get"]; !ok || path == "/metrics" || strings.HasSuffix(path, "/file") || path == "/api/v1/connect" {
			continue
		}
		if st, _, out := c.do("GET", fill.Replace(path), s.AdminToken, nil); st == 200 {
			answers["GET "+path] = out
		}
	}
	return answers
}

// walkJSON calls fn for every value of a decoded JSON tree, with its
// place and the key it stands under (that of its array for elements).
func walkJSON(where, key string, v any, fn func(where, key string, v any)) {
	fn(where, key, v)
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			walkJSON(where+"."+k, k, e, fn)
		}
	case []any:
		for _, e := range x {
			walkJSON(where+"[]", key, e, fn)
		}
	}
}
