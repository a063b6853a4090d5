package server_test

import (
	"log/slog"
	"strings"
	"testing"

	"github.com/drover/drover/internal/server"
	"github.com/drover/drover/internal/server/servertest"
)

func TestAdmissionAPI(t *testing.T) {
	logs := &syncBuf{}
	s := servertest.Start(t, servertest.Options{Logger: slog.New(slog.NewTextHandler(logs, nil)),
		Configure: func(c *server.Config) { c.Admission = "approve" }})
	c := &client{t: t, s: s, url: s.URL}
	st, h, p := c.do("POST", "/api/v1/register", "", regBody(s, "m-1", nil))
	if st != 202 || h.Get("Retry-After") == "" || p["device_key"] == nil || p["new"] != true {
		t.Fatalf("approve policy: %d %v", st, p)
	}
	key := p["device_key"].(string)
	withKey := regBody(s, "m-1", map[string]string{"device_key": key})
	if st, _, _ := c.do("POST", "/api/v1/register", "", withKey); st != 202 {
		t.Fatalf("poll before approval: %d", st)
	}
	if st, _, l := c.do("GET", "/api/v1/devices?admission=pending", s.AdminToken, nil); st != 200 || len(l["devices"].([]any)) != 1 {
		t.Fatalf("pending list: %d %v", st, l)
	}
	if st, _, out := c.do("GET", "/api/v1/devices?admission=nope", s.AdminToken, nil); st != 400 || errCode(out) != "invalid_field" {
		t.Fatalf("bad filter: %d %v", st, out)
	}
	if st, _, _ := c.do("POST", "/api/v1/devices/1/approve", "", nil); st != 401 {
		t.Fatalf("approve without the admin token: %d", st)
	}
	if st, _, d := c.do("POST", "/api/v1/devices/1/approve", s.AdminToken, nil); st != 200 || d["admission"] != "active" {
		t.Fatalf("approve: %d %v", st, d)
	}
	if st, _, out := c.do("POST", "/api/v1/devices/1/approve", s.AdminToken, nil); st != 409 || errCode(out) != "nothing_to_do" {
		t.Fatalf("approve again: %d %v", st, out)
	}
	st, _, ok := c.do("POST", "/api/v1/register", "", withKey)
	if st != 200 || ok["token"] == nil {
		t.Fatalf("after approval: %d %v", st, ok)
	}
	token := ok["token"].(string)
	pushOK(t, c, token, 1)

	// Block: pushes and registrations get 403 device_blocked, nothing stored.
	if st, _, d := c.do("POST", "/api/v1/devices/1/block", s.AdminToken, nil); st != 200 || d["admission"] != "blocked" {
		t.Fatalf("block: %d %v", st, d)
	}
	if st, _, out := c.do("POST", "/api/v1/push", token, `{"seq":2,"config_version":0,"state":{}}`); st != 403 || errCode(out) != "device_blocked" {
		t.Fatalf("push when blocked: %d %v", st, out)
	}
	if st, _, out := c.do("POST", "/api/v1/register", "", withKey); st != 403 || errCode(out) != "device_blocked" {
		t.Fatalf("register when blocked: %d %v", st, out)
	}
	if _, _, d := c.do("GET", "/api/v1/devices/1", s.AdminToken, nil); d["seq"].(float64) != 1 {
		t.Fatalf("a blocked device's push was stored: %v", d)
	}
	if st, _, d := c.do("POST", "/api/v1/devices/1/decommission", s.AdminToken, nil); st != 200 || d["admission"] != "decommissioned" {
		t.Fatalf("decommission: %d %v", st, d)
	}
	if st, _, out := c.do("POST", "/api/v1/push", token, `{"seq":2,"config_version":0,"state":{}}`); st != 403 || errCode(out) != "device_decommissioned" {
		t.Fatalf("push when decommissioned: %d %v", st, out)
	}
	if st, _, out := c.do("DELETE", "/api/v1/devices/1", s.AdminToken, nil); st != 200 || out["deleted"] != true {
		t.Fatalf("delete: %d %v", st, out)
	}
	if st, _, _ := c.do("GET", "/api/v1/devices/1", s.AdminToken, nil); st != 404 {
		t.Fatalf("deleted device: %d", st)
	}
	if st, _, _ := c.do("POST", "/api/v1/devices/1/block", s.AdminToken, nil); st != 404 {
		t.Fatalf("block a deleted device: %d", st)
	}
	for _, action := range []string{"approve", "block", "decommission", "delete"} {
		if !strings.Contains(logs.String(), "action="+action+" device_id=1") {
			t.Errorf("action %s not logged", action)
		}
	}

	// Enrollment tokens: shown once, single use, revocable.
	st, _, et := c.do("POST", "/api/v1/enrollment-tokens", s.AdminToken, `{"machine_id":"m-2","ttl":"1h","note":"rack 4"}`)
	if st != 201 || et["token"] == nil || et["machine_id"] != "m-2" {
		t.Fatalf("create token: %d %v", st, et)
	}
	if st, _, l := c.do("GET", "/api/v1/enrollment-tokens", s.AdminToken, nil); st != 200 || len(l["tokens"].([]any)) != 1 ||
		l["tokens"].([]any)[0].(map[string]any)["token"] != nil {
		t.Fatalf("list tokens (the token itself is never listed): %d %v", st, l)
	}
	withToken := regBody(s, "m-2", map[string]string{"enrollment_secret": "", "enrollment_token": et["token"].(string)})
	if st, _, out := c.do("POST", "/api/v1/register", "", withToken); st != 200 || out["token"] == nil {
		t.Fatalf("register with an enrollment token under the approve policy: %d %v", st, out)
	}
	if st, _, out := c.do("POST", "/api/v1/register", "", withToken); st != 403 || errCode(out) != "invalid_enrollment_token" {
		t.Fatalf("second use: %d %v", st, out)
	}
	if st, _, out := c.do("POST", "/api/v1/enrollment-tokens", s.AdminToken, `{"ttl":"1s"}`); st != 400 || errCode(out) != "invalid_field" {
		t.Fatalf("bad ttl: %d %v", st, out)
	}
	if st, _, out := c.do("DELETE", "/api/v1/enrollment-tokens/1", s.AdminToken, nil); st != 200 || out["revoked"] != true {
		t.Fatalf("revoke: %d %v", st, out)
	}
	if st, _, _ := c.do("DELETE", "/api/v1/enrollment-tokens/99", s.AdminToken, nil); st != 404 {
		t.Fatalf("revoke unknown: %d", st)
	}

	// Preauthorized machine IDs.
	if st, _, out := c.do("POST", "/api/v1/preauthorized", s.AdminToken, `{"machine_ids":["m-7","m-8"]}`); st != 200 || out["added"].(float64) != 2 {
		t.Fatalf("preauthorize: %d %v", st, out)
	}
	if st, _, out := c.do("POST", "/api/v1/preauthorized", s.AdminToken, `{"machine_ids":["bad\u0001"]}`); st != 400 {
		t.Fatalf("preauthorize a bad ID: %d %v", st, out)
	}
	if st, _, l := c.do("GET", "/api/v1/preauthorized", s.AdminToken, nil); st != 200 || len(l["machine_ids"].([]any)) != 2 {
		t.Fatalf("list preauthorized: %d %v", st, l)
	}
	if st, _, _ := c.do("DELETE", "/api/v1/preauthorized/m-7", s.AdminToken, nil); st != 200 {
		t.Fatalf("remove: %d", st)
	}
	if st, _, _ := c.do("DELETE", "/api/v1/preauthorized/m-7", s.AdminToken, nil); st != 404 {
		t.Fatalf("remove again: %d", st)
	}
}

func TestPreauthorizedPolicy(t *testing.T) {
	s := servertest.Start(t, servertest.Options{Configure: func(c *server.Config) { c.Admission = "preauthorized" }})
	c := &client{t: t, s: s, url: s.URL}
	if st, _, out := c.do("POST", "/api/v1/register", "", regBody(s, "m-1", nil)); st != 403 || errCode(out) != "not_preauthorized" {
		t.Fatalf("unlisted: %d %v", st, out)
	}
	if _, _, l := c.do("GET", "/api/v1/devices", s.AdminToken, nil); len(l["devices"].([]any)) != 0 {
		t.Fatalf("an unlisted device was stored: %v", l)
	}
	c.do("POST", "/api/v1/preauthorized", s.AdminToken, `{"machine_ids":["m-1"]}`)
	if st, _, out := c.do("POST", "/api/v1/register", "", regBody(s, "m-1", nil)); st != 200 || out["token"] == nil {
		t.Fatalf("listed: %d %v", st, out)
	}
}
