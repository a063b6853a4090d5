package server_test

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"testing"

	"github.com/drover/drover/internal/server/servertest"
)

// Every ID in every JSON answer of the API's GET routes is a decimal
// string ("id", "…_id", "…_ids"), whichever route gives it: one ID form
// for clients (openapi.json's description says so).
func TestAPIIDsAreStrings(t *testing.T) {
	s := servertest.Start(t, servertest.Options{})
	c := &client{t: t, s: s, url: s.URL}
	id, tok := c.register("m-1")
	for seq := 1; seq <= 2; seq++ {
		c.do("POST", "/api/v1/push", tok, fmt.Sprintf(state, seq, 0))
	}
	c.do("POST", "/api/v1/devices/"+id+"/block", s.AdminToken, nil)
	c.do("POST", "/api/v1/devices/"+id+"/approve", s.AdminToken, nil)
	c.do("POST", "/api/v1/labels", s.AdminToken, map[string]any{"name": "lab", "devices": []string{id}})
	c.do("POST", "/api/v1/commands", s.AdminToken, map[string]any{"device_id": id, "command": "reboot"})
	_, body := c.raw("GET", "/api/v1/openapi.json", "", nil, nil)
	var doc struct {
		Paths map[string]map[string]json.RawMessage `json:"paths"`
	}
	if err := json.Unmarshal(body, &doc); err != nil {
		t.Fatal(err)
	}
	bad := map[string]bool{}
	ids := 0
	var walk func(where, key string, v any)
	walk = func(where, key string, v any) {
		isID := key == "id" || strings.HasSuffix(key, "_id") || strings.HasSuffix(key, "_ids")
		switch x := v.(type) {
		case map[string]any:
			for k, e := range x {
				walk(where+"."+k, k, e)
			}
		case []any:
			for _, e := range x {
				walk(where+"[]", key, e)
			}
		case float64:
			if isID {
				bad[where] = true
			}
		case string:
			if isID {
				ids++
			}
		}
	}
	fill := strings.NewReplacer("{id}", id, "{name}", "lab", "{machine_id}", "m-1")
	for path, ops := range doc.Paths {
		if _, ok := ops["get"]; !ok || path == "/metrics" || strings.HasSuffix(path, "/file") || path == "/api/v1/connect" {
			continue
		}
		st, _, out := c.do("GET", fill.Replace(path), s.AdminToken, nil)
		if st == 200 {
			walk("GET "+path, "", out)
		}
	}
	var list []string
	for k := range bad {
		list = append(list, k)
	}
	sort.Strings(list)
	for _, k := range list {
		t.Errorf("%s is a number, want a decimal string", k)
	}
	t.Logf("%d string IDs checked", ids)
	if ids < 5 {
		t.Fatalf("only %d IDs seen in the answers", ids)
	}
}
