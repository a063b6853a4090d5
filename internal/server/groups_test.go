package server_test

import (
	"fmt"
	"net/url"
	"slices"
	"testing"

	"github.com/drover/drover/internal/server/servertest"
)

// Live labels and filters on reported fields over HTTP: the where
// parameter of the devices list, PUT /api/v1/labels/{name}, membership
// following pushes, and the uses of labels (the list's label filter,
// commands to a label).
func TestHTTPLiveLabelsAndWhere(t *testing.T) {
	s := servertest.Start(t, servertest.Options{})
	c := &client{t: t, s: s, url: s.URL}
	tok := s.AdminToken
	tokens := map[string]string{}
	for _, m := range []string{"m-1", "m-2", "m-3"} {
		_, tokens[m] = c.register(m)
	}
	seq := 0
	push := func(m, site string, temp float64) {
		t.Helper()
		seq++
		body := fmt.Sprintf(`{"seq":%d,"state":{"temperature":%g,"extra":{"site":%q},"modem":{"bands":[3,20]}}}`, seq, temp, site)
		if st, _, out := c.do("POST", "/api/v1/push", tokens[m], body); st != 200 {
			t.Fatalf("push: %d %v", st, out)
		}
	}
	machines := func(path string) []string {
		t.Helper()
		st, _, out := c.do("GET", path, tok, nil)
		if st != 200 {
			t.Fatalf("%s: %d %v", path, st, out)
		}
		var got []string
		for _, d := range out["devices"].([]any) {
			got = append(got, d.(map[string]any)["machine_id"].(string))
		}
		slices.Sort(got)
		return got
	}
	push("m-1", "north", 71)
	push("m-2", "north", 40)
	push("m-3", "south", 90)

	where := func(expr string) string { return "/api/v1/devices?" + url.Values{"where": {expr}}.Encode() }
	if got := machines(where(`state.extra.site = north and state.temperature > 50`)); !slices.Equal(got, []string{"m-1"}) {
		t.Fatalf("where: %v", got)
	}
	if got := machines(where(`state.modem.bands.1 = 20`) + "&sort=machine_id"); len(got) != 3 {
		t.Fatalf("where on an array element: %v", got)
	}
	if got := machines(where(`state.extra.site prefix "no"`) + "&" + url.Values{"where": {"state.temperature < 50"}}.Encode()); !slices.Equal(got, []string{"m-2"}) {
		t.Fatalf("two where parameters: %v", got)
	}
	for _, bad := range []string{`state.temperature >`, `temperature > 5`, `state.x = "open`} {
		st, _, out := c.do("GET", where(bad), tok, nil)
		if e, _ := out["error"].(map[string]any); st != 400 || e["code"] == nil {
			t.Fatalf("where %q: %d %v", bad, st, out)
		}
	}

	// A live label.
	st, _, out := c.do("PUT", "/api/v1/labels/hot", tok, map[string]any{"filter": "state.temperature >= 70"})
	if st != 200 || out["filter"] != "state.temperature >= 70" || out["devices"] != float64(2) {
		t.Fatalf("define: %d %v", st, out)
	}
	if got := machines("/api/v1/devices?label=hot"); !slices.Equal(got, []string{"m-1", "m-3"}) {
		t.Fatalf("label=hot: %v", got)
	}
	push("m-1", "north", 60) // leaves
	push("m-2", "north", 75) // joins
	if got := machines("/api/v1/devices?label=hot"); !slices.Equal(got, []string{"m-2", "m-3"}) {
		t.Fatalf("label=hot after pushes: %v", got)
	}
	if st, _, out := c.do("GET", "/api/v1/labels/hot", tok, nil); st != 200 || out["devices"] != float64(2) {
		t.Fatalf("get label: %d %v", st, out)
	}
	if st, _, out := c.do("GET", "/api/v1/labels", tok, nil); st != 200 || fmt.Sprint(out["labels"]) != "[map[devices:2 filter:state.temperature >= 70 id:1 name:hot]]" {
		t.Fatalf("labels: %d %v", st, out)
	}
	// Where works in JSON filters, too, and in a live label's filter.
	if st, _, out := c.do("POST", "/api/v1/labels/assign", tok, map[string]any{"label": "north", "filter": map[string]any{"where": "state.extra.site = north"}}); st != 200 || out["changed"] != float64(2) {
		t.Fatalf("assign by where: %d %v", st, out)
	}
	if st, _, out := c.do("PUT", "/api/v1/labels/hot-north", tok, map[string]any{"filter": "label = hot and label = north"}); st != 200 || out["devices"] != float64(1) {
		t.Fatalf("define hot-north: %d %v", st, out)
	}
	// Commands to a live label reach its devices.
	if st, _, out := c.do("POST", "/api/v1/commands", tok, map[string]any{"kind": "reboot", "label": "hot"}); st != 201 || out["total"] != float64(2) {
		t.Fatalf("command to a live label: %d %v", st, out)
	}
	// Refusals.
	for _, c2 := range []struct {
		method, path string
		body         any
		status       int
	}{
		{"PUT", "/api/v1/labels/hot", map[string]any{"filter": ""}, 400},
		{"PUT", "/api/v1/labels/hot", map[string]any{"filter": "state.x >"}, 400},
		{"PUT", "/api/v1/labels/hot", map[string]any{"filter": "x", "other": 1}, 400},
		{"PUT", "/api/v1/labels/bad,name", map[string]any{"filter": "state.x exists"}, 400},
		{"PUT", "/api/v1/labels/north", map[string]any{"filter": "state.x exists"}, 409},
		{"POST", "/api/v1/labels/assign", map[string]any{"label": "hot", "filter": map[string]any{}}, 409},
		{"DELETE", "/api/v1/labels/north", nil, 409},
		{"GET", "/api/v1/labels/nope", nil, 404},
	} {
		if st, _, out := c.do(c2.method, c2.path, tok, c2.body); st != c2.status {
			t.Errorf("%s %s %v: %d %v; want %d", c2.method, c2.path, c2.body, st, out, c2.status)
		}
	}
	if st, _, _ := c.do("DELETE", "/api/v1/labels/hot-north", tok, nil); st != 200 {
		t.Fatalf("delete hot-north: %d", st)
	}
	if st, _, _ := c.do("DELETE", "/api/v1/labels/hot", tok, nil); st != 200 {
		t.Fatalf("delete hot: %d", st)
	}
	if got := machines("/api/v1/devices?label=hot"); len(got) != 0 {
		t.Fatalf("deleted live label: %v", got)
	}
}
