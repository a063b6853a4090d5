package server_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/drover/drover/internal/server"
	"github.com/drover/drover/internal/server/servertest"
)

// userToken makes a user of a role through the API and returns an API
// token of it.
func userToken(c *client, name, role string) string {
	c.t.Helper()
	if st, _, out := c.do("POST", "/api/v1/users", c.s.AdminToken, map[string]any{"name": name, "role": role, "password": "correct horse " + name}); st != 201 {
		c.t.Fatalf("create user %s: %d %v", name, st, out)
	}
	st, _, out := c.do("POST", "/api/v1/tokens", c.s.AdminToken, map[string]any{"user": name, "name": "test"})
	tok, _ := out["token"].(string)
	if st != 201 || !strings.HasPrefix(tok, "drv_") {
		c.t.Fatalf("create token for %s: %d %v", name, st, out)
	}
	return tok
}

// Every route of the table is checked in one place: without a credential
// 401, a viewer gets 403 on every change, an operator 403 on every admin
// route (users, tokens, credentials, settings, audit); each with the JSON
// error body. Reads need at least a viewer.
func TestEveryRouteChecksItsRole(t *testing.T) {
	s := servertest.Start(t, servertest.Options{})
	c := &client{t: t, s: s, url: s.URL}
	c.register("m-1")
	view, op := userToken(c, "vera", "viewer"), userToken(c, "otto", "operator")
	fill := strings.NewReplacer("{id}", "1", "{name}", "x", "{machine_id}", "m", "{$}", "")
	checked := 0
	for _, rt := range server.RouteNeeds() {
		if rt.Need == "public" || rt.Need == "metrics" {
			continue
		}
		if rt.Method == "" {
			t.Errorf("%s: a route that needs a role must name its method", rt.Path)
			continue
		}
		path := fill.Replace(rt.Path)
		expect := func(who, token string, want int) {
			t.Helper()
			st, _, out := c.do(rt.Method, path, token, "{}")
			e, _ := out["error"].(map[string]any)
			if st != want || e == nil {
				t.Errorf("%s %s as %s: %d %v, want %d with the JSON error body", rt.Method, rt.Path, who, st, out, want)
			}
		}
		expect("nobody", "", 401)
		expect("a wrong token", "drv_0123456789", 401)
		if rt.Method != "GET" {
			expect("viewer", view, 403)
			if rt.Need == "viewer" {
				t.Errorf("%s %s changes something but a viewer may call it", rt.Method, rt.Path)
			}
		} else if rt.Need == "operator" { // a read for operators only (tunnels)
			expect("viewer", view, 403)
		}
		if rt.Need == "admin" {
			expect("operator", op, 403)
		}
		checked++
	}
	if checked < 70 {
		t.Fatalf("only %d routes checked", checked)
	}
	// And the roles that may, may: a viewer reads, an operator changes a
	// profile, only an admin manages users.
	if st, _, out := c.do("GET", "/api/v1/profiles/1", view, nil); st != 200 {
		t.Fatalf("viewer reads a profile: %d %v", st, out)
	}
	if st, _, out := c.do("PATCH", "/api/v1/profiles/1", op, `{"push_interval":300}`); st != 200 {
		t.Fatalf("operator changes a profile: %d %v", st, out)
	}
	if st, _, out := c.do("POST", "/api/v1/users", op, map[string]any{"name": "mallory", "role": "admin"}); st != 403 {
		t.Fatalf("operator makes an admin: %d %v", st, out)
	}
	if st, _, out := c.do("GET", "/api/v1/whoami", op, nil); st != 200 || out["name"] != "otto" || out["role"] != "operator" || out["credential"] != "token:test" {
		t.Fatalf("whoami: %d %v", st, out)
	}
}

// A profile change and a command each leave an audit row with who, from
// where, what, and before and after; a token's secret never reaches the
// log; the log filters and pages.
func TestAuditOfChanges(t *testing.T) {
	s := servertest.Start(t, servertest.Options{})
	c := &client{t: t, s: s, url: s.URL}
	id, _ := c.register("m-1")
	op := userToken(c, "otto", "operator")
	if st, _, out := c.do("PATCH", "/api/v1/profiles/1", op, `{"push_interval":321}`); st != 200 {
		t.Fatalf("profile: %d %v", st, out)
	}
	st, _, cmd := c.do("POST", "/api/v1/commands", s.AdminToken, map[string]any{"kind": "reboot", "device_id": id})
	if st != 201 {
		t.Fatalf("command: %d %v", st, cmd)
	}
	cmdID := fmt.Sprint(cmd["id"])
	if st, _, out := c.do("POST", "/api/v1/commands/"+cmdID+"/cancel", op, nil); st != 200 {
		t.Fatalf("cancel: %d %v", st, out)
	}
	type entry struct {
		ID                                        uint64 `json:",string"`
		Actor, Credential, Remote, Action, Object string
		Before, After                             map[string]any
	}
	get := func(q string) ([]entry, string) {
		t.Helper()
		st, _, out := c.do("GET", "/api/v1/audit"+q, s.AdminToken, nil)
		if st != 200 {
			t.Fatalf("audit%s: %d %v", q, st, out)
		}
		b, _ := json.Marshal(out["entries"])
		var es []entry
		if err := json.Unmarshal(b, &es); err != nil {
			t.Fatal(err)
		}
		next, _ := out["next_cursor"].(string)
		return es, next
	}
	prof, _ := get("?object=/api/v1/profiles/1")
	if len(prof) != 1 {
		t.Fatalf("profile rows: %+v", prof)
	}
	p := prof[0]
	if p.Actor != "otto" || p.Credential != "token:test" || p.Remote != "127.0.0.1" || p.Action != "PATCH /api/v1/profiles/{id}" ||
		p.Before["push_interval"] != 200.0 || p.After["push_interval"] != 321.0 {
		t.Fatalf("profile row: %+v", p)
	}
	cmds, _ := get("?object=/api/v1/commands/")
	if len(cmds) != 2 {
		t.Fatalf("command rows: %+v", cmds)
	}
	sent, cancel := cmds[1], cmds[0]
	if sent.Actor != "admin-token" || sent.Action != "POST /api/v1/commands" || sent.Object != "/api/v1/commands/"+cmdID ||
		sent.Before != nil || sent.After["kind"] != "reboot" || sent.After["state"] != "active" {
		t.Fatalf("send row: %+v", sent)
	}
	if cancel.Actor != "otto" || cancel.Action != "POST /api/v1/commands/{id}/cancel" || cancel.Object != "/api/v1/commands/"+cmdID ||
		cancel.Before["state"] != "active" || cancel.After["state"] != "cancelled" {
		t.Fatalf("cancel row: %+v", cancel)
	}
	st, _, et := c.do("POST", "/api/v1/enrollment-tokens", s.AdminToken, map[string]any{"machine_id": "m-9"})
	if st != 201 || et["token"] == nil {
		t.Fatalf("enrollment token: %d %v", st, et)
	}
	all, _ := get("")
	if b, _ := json.Marshal(all); strings.Contains(string(b), et["token"].(string)) {
		t.Fatalf("an enrollment token's secret is in the audit log: %s", b)
	}
	for _, e := range all {
		if e.Action == "POST /api/v1/tokens" {
			if _, ok := e.After["token"]; ok || e.After["user"] == nil {
				t.Fatalf("token row keeps the secret or lacks the token: %+v", e)
			}
		}
		if strings.HasPrefix(e.Action, "GET") {
			t.Fatalf("a read in the audit log: %+v", e)
		}
	}
	page1, next := get("?limit=2")
	page2, _ := get("?limit=2&cursor=" + next)
	if len(page1) != 2 || len(page2) != 2 || page2[0].ID >= page1[1].ID || page1[0].ID != all[0].ID {
		t.Fatalf("pages %+v / %+v", page1, page2)
	}
	if rows, _ := get("?actor=otto&action=" + "PATCH%20/api/v1/profiles/%7Bid%7D"); len(rows) != 1 {
		t.Fatalf("actor and action filter: %+v", rows)
	}
	if st, _, _ := c.do("GET", "/api/v1/audit?since=yesterday", s.AdminToken, nil); st != http.StatusBadRequest {
		t.Fatalf("bad since: %d", st)
	}
	if st, _, _ := c.do("GET", "/api/v1/audit", op, nil); st != 403 {
		t.Fatalf("operator reads the audit log: %d", st)
	}
}

// A change on the dashboard is recorded like one through the API: the
// user, its address, the page's action, the object's API path and its
// state before and after; a command sent there names the new command.
func TestAuditOfDashboardChanges(t *testing.T) {
	s := servertest.Start(t, servertest.Options{})
	c := &client{t: t, s: s, url: s.URL}
	id, _ := c.register("m-1")
	userToken(c, "otto", "operator")
	jar, _ := cookiejar.New(nil)
	hc := &http.Client{Transport: s.Client().Transport, Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	csrfRE := regexp.MustCompile(`name="csrf" value="([^"]+)"`)
	page := func(path string) string {
		t.Helper()
		resp, err := hc.Get(s.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		m := csrfRE.FindStringSubmatch(string(b))
		if m == nil {
			t.Fatalf("%s: %d, no CSRF field", path, resp.StatusCode)
		}
		return m[1]
	}
	post := func(path string, form url.Values) {
		t.Helper()
		resp, err := hc.PostForm(s.URL+path, form)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusSeeOther {
			t.Fatalf("POST %s: %d", path, resp.StatusCode)
		}
	}
	post("/ui/login", url.Values{"csrf": {page("/ui/login")}, "username": {"otto"}, "password": {"correct horse otto"}})
	csrf := page("/ui/")
	post("/ui/profiles/1", url.Values{"csrf": {csrf}, "config": {`{"apn":"iot"}`}, "push_interval": {"250"}})
	post("/ui/profiles/1", url.Values{"csrf": {csrf}, "config": {`{"apn":"iot"}`}, "push_interval": {"250"}}) // no change: no row
	post("/ui/commands", url.Values{"csrf": {csrf}, "kind": {"reboot"}, "device_id": {id}})
	st, _, out := c.do("GET", "/api/v1/audit", s.AdminToken, nil)
	es, _ := out["entries"].([]any)
	if st != 200 || len(es) < 2 {
		t.Fatalf("audit: %d %v", st, out)
	}
	cmd, prof := es[0].(map[string]any), es[1].(map[string]any)
	before, _ := prof["before"].(map[string]any)
	after, _ := prof["after"].(map[string]any)
	if prof["actor"] != "otto" || prof["credential"] != "password" || prof["remote"] != "127.0.0.1" || prof["action"] != "POST /ui/profiles/{id}" ||
		prof["object"] != "/api/v1/profiles/1" || before["push_interval"] != 200.0 || after["push_interval"] != 250.0 ||
		fmt.Sprint(after["config"]) != "map[apn:iot]" || after["by"] != nil && after["by"] != "dashboard:otto" {
		t.Fatalf("profile row: %v", prof)
	}
	cafter, _ := cmd["after"].(map[string]any)
	if cmd["actor"] != "otto" || cmd["action"] != "POST /ui/commands" || !strings.HasPrefix(cmd["object"].(string), "/api/v1/commands/") ||
		cmd["before"] != nil || cafter["kind"] != "reboot" {
		t.Fatalf("command row: %v", cmd)
	}
	if len(es) != 4 {
		var acts []string
		for _, e := range es {
			acts = append(acts, e.(map[string]any)["action"].(string))
		}
		t.Fatalf("rows: %v, want the command, one profile change, the user and the token", acts)
	}
}

// Single sign-on settings are checked at start: an issuer needs a client,
// a redirect URL and a role mapping.
func TestOIDCConfigChecked(t *testing.T) {
	for _, tc := range []struct {
		client, redirect, roles string
		ok                      bool
	}{
		{"", "https://d/ui/oidc/callback", "g=admin", false},
		{"drover", "", "g=admin", false},
		{"drover", "https://d/ui/oidc/callback", "", false},
		{"drover", "https://d/ui/oidc/callback", "g=root", false},
		{"drover", "https://d/ui/oidc/callback", "admin", false},
		{"drover", "https://d/ui/oidc/callback", "drover-admins=admin, staff=viewer", true},
	} {
		cfg := server.DefaultConfig()
		cfg.OIDCIssuer, cfg.OIDCClientID, cfg.OIDCRedirectURL, cfg.OIDCRoles = "https://idp.example", tc.client, tc.redirect, tc.roles
		if err := cfg.Validate(); (err == nil) != tc.ok {
			t.Errorf("%+v: %v", tc, err)
		}
	}
}
