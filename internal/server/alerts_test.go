package server_test

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/drover/drover/internal/server/servertest"
)

func TestAlertAndLabelAPI(t *testing.T) {
	dir := t.TempDir()
	s := servertest.Start(t, servertest.Options{DataDir: dir})
	c := &client{t: t, s: s, url: s.URL}
	tok := s.AdminToken

	st, _, out := c.do("POST", "/api/v1/alerts/rules", tok, map[string]any{"name": "hot", "kind": "cpu_above", "threshold": 150, "pushes": 2})
	if st != 400 || out["error"].(map[string]any)["code"] != "invalid_field" {
		t.Fatalf("invalid rule: %d %v", st, out)
	}
	st, _, out = c.do("POST", "/api/v1/alerts/rules", tok, `{"name":"hot","kind":"temperature_above","threshold":80,"bogus":1}`)
	if st != 400 {
		t.Fatalf("unknown field: %d %v", st, out)
	}
	st, _, out = c.do("POST", "/api/v1/alerts/rules", tok, map[string]any{"name": "hot", "kind": "temperature_above", "threshold": 80, "label": "north"})
	if st != 201 || out["id"] != "1" || out["severity"] != "warning" {
		t.Fatalf("create rule: %d %v", st, out)
	}
	if st, _, out := c.do("POST", "/api/v1/alerts/rules", tok, map[string]any{"name": "hot", "kind": "offline"}); st != 409 {
		t.Fatalf("duplicate: %d %v", st, out)
	}
	if st, _, _ := c.do("GET", "/api/v1/alerts/rules", "", nil); st != 401 {
		t.Fatalf("rules without token: %d", st)
	}

	var tokens []string
	for i := range 12 {
		_, dt := c.register(fmt.Sprintf("m-%02d", i))
		tokens = append(tokens, dt)
	}
	st, _, out = c.do("POST", "/api/v1/labels/assign", tok, map[string]any{"label": "north", "filter": map[string]any{"q": "m-0"}})
	if st != 200 || out["changed"] != float64(10) {
		t.Fatalf("assign: %d %v", st, out)
	}
	if st, _, out := c.do("POST", "/api/v1/labels/assign", tok, map[string]any{"label": "north", "filter": map[string]any{"liveness": "bogus"}}); st != 400 {
		t.Fatalf("bad filter: %d %v", st, out)
	}
	if _, _, out := c.do("GET", "/api/v1/devices?label=north", tok, nil); len(out["devices"].([]any)) != 10 {
		t.Fatalf("devices by label: %v", out)
	}
	if _, _, out := c.do("GET", "/api/v1/labels", tok, nil); fmt.Sprint(out["labels"]) != "[map[devices:10 id:1 name:north]]" {
		t.Fatalf("labels: %v", out)
	}

	hot := `{"seq":%d,"config_version":0,"state":{"temperature":%g}}`
	for i, dt := range tokens[:11] { // m-10 (82 °C) has no label
		if st, _, out := c.do("POST", "/api/v1/push", dt, fmt.Sprintf(hot, 1, 72+float64(i))); st != 200 {
			t.Fatalf("push: %d %v", st, out)
		}
	}
	_, _, out = c.do("GET", "/api/v1/alerts?state=active", tok, nil)
	if out["active"] != float64(1) || len(out["alerts"].([]any)) != 1 {
		t.Fatalf("active alerts: %v", out)
	}
	ev := out["alerts"].([]any)[0].(map[string]any)
	if ev["device_id"] != "10" || ev["rule"] != "hot" || ev["state"] != "raised" || ev["value"] != float64(81) {
		t.Fatalf("alert %v", ev)
	}
	if v := s.Metric("drover_alerts_active", map[string]string{"rule": "hot"}); v != 1 {
		t.Fatalf("drover_alerts_active %v", v)
	}
	if st, _, out := c.do("GET", "/api/v1/alerts?state=bogus", tok, nil); st != 400 {
		t.Fatalf("bad state: %d %v", st, out)
	}

	st, _, out = c.do("PUT", "/api/v1/alerts/smtp", tok, map[string]any{"addr": "mail.example:587", "from": "drover@example.com", "username": "u", "password": "secret"})
	if st != 200 || out["password"] != nil || out["password_set"] != true {
		t.Fatalf("smtp: %d %v", st, out)
	}

	// Everything survives a restart.
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	s = servertest.Start(t, servertest.Options{DataDir: dir})
	c = &client{t: t, s: s, url: s.URL}
	_, _, out = c.do("GET", "/api/v1/alerts?state=active", tok, nil)
	if out["active"] != float64(1) {
		t.Fatalf("after restart: %v", out)
	}
	if _, _, out := c.do("GET", "/api/v1/devices?label=north", tok, nil); len(out["devices"].([]any)) != 10 {
		t.Fatalf("labels after restart: %v", out)
	}
	if _, _, out := c.do("GET", "/api/v1/alerts/smtp", tok, nil); out["addr"] != "mail.example:587" || out["password_set"] != true {
		t.Fatalf("smtp after restart: %v", out)
	}
	// The device cools down: the alert clears.
	if st, _, _ := c.do("POST", "/api/v1/push", tokens[9], fmt.Sprintf(hot, 2, 20.0)); st != 200 {
		t.Fatal("push after restart")
	}
	_, _, out = c.do("GET", "/api/v1/alerts", tok, nil)
	if out["active"] != float64(0) || out["alerts"].([]any)[0].(map[string]any)["state"] != "cleared" {
		t.Fatalf("after cooling: %v", out)
	}
	st, _, out = c.do("PUT", "/api/v1/alerts/rules/1", tok, map[string]any{"name": "hot", "kind": "cpu_above", "threshold": 90})
	if st != 200 || out["kind"] != "cpu_above" {
		t.Fatalf("update: %d %v", st, out)
	}
	if st, _, _ := c.do("DELETE", "/api/v1/alerts/rules/1", tok, nil); st != 200 {
		t.Fatalf("delete: %d", st)
	}
	if st, _, _ := c.do("GET", "/api/v1/alerts/rules/1", tok, nil); st != 404 {
		t.Fatalf("deleted rule: %d", st)
	}
	if st, _, _ := c.do("DELETE", "/api/v1/labels/north", tok, nil); st != 200 {
		t.Fatalf("delete label: %d", st)
	}

	// The dashboard is mounted.
	noFollow := *s.Client()
	noFollow.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	for path, want := range map[string]string{"/": "/ui/", "/ui/": "/ui/login?next=%2Fui%2F"} {
		resp, err := noFollow.Get(s.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if loc := resp.Header.Get("Location"); loc != want {
			t.Fatalf("GET %s: %d %q", path, resp.StatusCode, loc)
		}
	}
}
