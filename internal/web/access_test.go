package web_test

import (
	"bytes"
	"context"
	"io"
	"mime/multipart"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/drover/drover/internal/access"
)

// audited is one change Options.Audit was told of.
type audited struct {
	who                    access.Actor
	action, object, create string
}

var auditMu sync.Mutex

func (s *site) recordAudit(r *http.Request, who access.Actor, action, object string) func(string, any) {
	return func(created string, after any) {
		auditMu.Lock()
		s.audit = append(s.audit, audited{who, action, object, created})
		auditMu.Unlock()
	}
}

// loginAs logs a user in and returns the session's CSRF token.
func (s *site) loginAs(user, password string) string {
	s.t.Helper()
	_, _, body := s.get("/ui/login")
	st, hdr, b := s.post("/ui/login", url.Values{"csrf": {csrfOf(s.t, body)}, "username": {user}, "password": {password}}, nil)
	if st != http.StatusSeeOther {
		s.t.Fatalf("login as %s: %d %v %s", user, st, hdr, b)
	}
	_, _, body = s.get("/ui/")
	return csrfOf(s.t, body)
}

// The dashboard enforces the role on every page: a viewer sees no forms
// that change anything and gets 403 on every POST; an operator changes the
// fleet (recorded) but not users; an admin manages users and tokens; a
// deleted user's session ends.
func TestDashboardRoles(t *testing.T) {
	s := newSite(t, 3)
	ctx := context.Background()
	for _, u := range []struct {
		name string
		role access.Role
	}{{"vera", access.Viewer}, {"otto", access.Operator}} {
		if _, err := s.acc.AddUser(ctx, u.name, u.role, u.name+"-password"); err != nil {
			t.Fatal(err)
		}
	}
	if st, _, b := s.post("/ui/login", url.Values{"csrf": {"x"}, "username": {"vera"}, "password": {"wrong-password"}}, nil); st == http.StatusSeeOther {
		t.Fatalf("wrong password logs in: %d %s", st, b)
	}
	csrf := s.loginAs("vera", "vera-password")
	dev := "/ui/devices/1"
	for _, p := range []string{"/ui/", "/ui/devices", dev, "/ui/profiles", "/ui/profiles/1", "/ui/labels", "/ui/commands", "/ui/firmware", "/ui/alerts", "/ui/alerts/rules"} {
		st, _, body := s.get(p)
		if st != 200 {
			t.Fatalf("viewer GET %s: %d", p, st)
		}
		// The logout form, and forms that show data (a profile's
		// configuration) with every field disabled and no button.
		if n := strings.Count(body, `method="post"`) - strings.Count(body, `<fieldset class="plain" disabled>`); n != 1 || strings.Contains(body, `id="save"`) {
			t.Errorf("viewer sees %d POST forms on %s, want only the logout form", n-1, p)
		}
		if strings.Contains(body, `href="/ui/users"`) || !strings.Contains(body, "vera (viewer)") {
			t.Errorf("%s: viewer's navigation wrong", p)
		}
	}
	for _, p := range []string{"/ui/users", "/ui/audit", "/ui/settings"} {
		if st, _, _ := s.get(p); st != http.StatusForbidden {
			t.Errorf("viewer GET %s: %d, want 403", p, st)
		}
	}
	posts := []string{"/ui/devices/label", dev + "/admission", dev + "/quota", "/ui/profiles/1", "/ui/profiles/policy", "/ui/profiles/approve",
		"/ui/profiles/cleanup", "/ui/profiles/1/rollback", "/ui/firmware/1/delete", "/ui/rollouts", "/ui/rollouts/1/pause",
		"/ui/labels", "/ui/labels/delete", "/ui/commands", "/ui/commands/1/cancel", "/ui/alerts/rules", "/ui/alerts/rules/1",
		"/ui/alerts/rules/1/delete", "/ui/settings", "/ui/users", "/ui/users/vera", "/ui/users/vera/delete", "/ui/users/vera/tokens", "/ui/tokens/x/revoke"}
	for _, p := range posts {
		if st, _, _ := s.post(p, url.Values{"csrf": {csrf}, "name": {"north"}, "kind": {"reboot"}, "label": {"north"}, "role": {"admin"}}, nil); st != http.StatusForbidden {
			t.Errorf("viewer POST %s: %d, want 403", p, st)
		}
	}
	if st, _, _ := s.postMultipart("/ui/firmware", csrf); st != http.StatusForbidden {
		t.Errorf("viewer firmware upload: %d, want 403", st)
	}
	if len(s.fleet.Labels()) != 0 || len(s.audit) != 0 {
		t.Fatalf("a viewer changed something: labels %v, audit %v", s.fleet.Labels(), s.audit)
	}
	if u, _ := s.acc.User(ctx, "vera"); u.Role != access.Viewer {
		t.Fatalf("a viewer changed its role: %v", u.Role)
	}

	s.post("/ui/logout", url.Values{"csrf": {csrf}}, nil)
	csrf = s.loginAs("otto", "otto-password")
	if st, _, _ := s.post("/ui/labels", url.Values{"csrf": {csrf}, "name": {"north"}}, nil); st != http.StatusSeeOther || len(s.fleet.Labels()) != 1 {
		t.Fatalf("operator creates a label: %d %v", st, s.fleet.Labels())
	}
	if len(s.audit) != 1 || s.audit[0].who.Name != "otto" || s.audit[0].action != "POST /ui/labels" || s.audit[0].object != "/api/v1/labels" {
		t.Fatalf("audit of the label: %+v", s.audit)
	}
	for _, p := range []string{"/ui/users", "/ui/users/vera/delete", "/ui/settings"} {
		if st, _, _ := s.post(p, url.Values{"csrf": {csrf}, "name": {"mallory"}, "role": {"admin"}, "password": {"mallory-password"}}, nil); st != http.StatusForbidden {
			t.Errorf("operator POST %s: %d, want 403", p, st)
		}
	}
	if _, err := s.acc.User(ctx, "mallory"); err == nil {
		t.Fatal("an operator made a user")
	}

	s.post("/ui/logout", url.Values{"csrf": {csrf}}, nil)
	csrf = s.login() // the admin token
	if st, _, body := s.get("/ui/users"); st != 200 || !strings.Contains(body, "otto") {
		t.Fatalf("admin users page: %d", st)
	}
	if st, _, _ := s.post("/ui/users", url.Values{"csrf": {csrf}, "name": {"ada"}, "role": {"admin"}, "password": {"ada-password"}}, nil); st != http.StatusSeeOther {
		t.Fatalf("add user: %d", st)
	}
	s.post("/ui/users/otto/tokens", url.Values{"csrf": {csrf}, "token_name": {"ci"}}, nil)
	if _, _, body := s.get("/ui/users"); !strings.Contains(body, "drv_") {
		t.Fatal("the new token is not shown once")
	}
	if _, _, body := s.get("/ui/users"); strings.Contains(body, "drv_") {
		t.Fatal("the token is shown twice")
	}
	if ts, _ := s.acc.Tokens(ctx, "otto"); len(ts) != 1 || ts[0].Name != "ci" {
		t.Fatalf("tokens %+v", ts)
	}
	if st, _, _ := s.post("/ui/users/vera/delete", url.Values{"csrf": {csrf}}, nil); st != http.StatusSeeOther {
		t.Fatalf("delete vera: %d", st)
	}
	var actions []string
	for _, a := range s.audit {
		actions = append(actions, a.who.Name+" "+a.action+" "+a.object+a.create)
	}
	tokenPath := "/api/v1/tokens/"
	if len(s.audit) == 4 && strings.HasPrefix(s.audit[2].create, tokenPath) {
		tokenPath = s.audit[2].create
	}
	want := []string{"otto POST /ui/labels /api/v1/labels", "admin-token POST /ui/users /api/v1/users/ada",
		"admin-token POST /ui/users/{name}/tokens " + tokenPath, "admin-token POST /ui/users/{name}/delete /api/v1/users/vera"}
	if strings.Join(actions, "|") != strings.Join(want, "|") || tokenPath == "/api/v1/tokens/" {
		t.Fatalf("audit:\n%s\nwant\n%s", strings.Join(actions, "\n"), strings.Join(want, "\n"))
	}
}

// postMultipart posts a firmware upload form with only its CSRF field.
func (s *site) postMultipart(path, csrf string) (int, http.Header, string) {
	s.t.Helper()
	var b bytes.Buffer
	mw := multipart.NewWriter(&b)
	mw.WriteField("csrf", csrf)
	fw, _ := mw.CreateFormFile("file", "fw.bin")
	fw.Write([]byte("firmware"))
	mw.Close()
	req, _ := http.NewRequest("POST", s.srv.URL+path, &b)
	req.Header.Set("Content-Type", mw.FormDataContentType())
	resp, err := s.c.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(body)
}
