package server_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/internal/server/servertest"
)

// A token is refused once revoked, once expired and once its user is
// deleted; a role change applies to the user's tokens at once.
func TestTokenLifecycle(t *testing.T) {
	s := servertest.Start(t, servertest.Options{})
	c := &client{t: t, s: s, url: s.URL}
	c.register("m-1")
	tok := userToken(c, "ann", "operator")
	st, _, list := c.do("GET", "/api/v1/tokens?user=ann", s.AdminToken, nil)
	ts, _ := list["tokens"].([]any)
	if st != 200 || len(ts) != 1 {
		t.Fatalf("tokens: %d %v", st, list)
	}
	id := ts[0].(map[string]any)["id"].(string)
	if b, _ := json.Marshal(list); strings.Contains(string(b), tok) || strings.Contains(string(b), "hash") {
		t.Fatalf("the token list shows the secret or its hash: %s", b)
	}
	if st, _, _ := c.do("PATCH", "/api/v1/profiles/1", tok, `{"push_interval":300}`); st != 200 {
		t.Fatalf("operator token: %d", st)
	}
	if st, _, out := c.do("PATCH", "/api/v1/users/ann", s.AdminToken, `{"role":"viewer"}`); st != 200 || out["role"] != "viewer" {
		t.Fatalf("demote: %d %v", st, out)
	}
	if st, _, _ := c.do("PATCH", "/api/v1/profiles/1", tok, `{"push_interval":300}`); st != 403 {
		t.Fatalf("demoted token still changes profiles: %d", st)
	}
	if st, _, out := c.do("DELETE", "/api/v1/tokens/"+id, s.AdminToken, nil); st != 200 || out["revoked_at"] == nil {
		t.Fatalf("revoke: %d %v", st, out)
	}
	if st, _, _ := c.do("GET", "/api/v1/profiles/1", tok, nil); st != 401 {
		t.Fatalf("revoked token: %d", st)
	}
	exp := userToken(c, "bea", "viewer")
	if st, _, _ := c.do("GET", "/api/v1/profiles/1", exp, nil); st != 200 {
		t.Fatalf("new token: %d", st)
	}
	if st, _, _ := c.do("DELETE", "/api/v1/users/bea", s.AdminToken, nil); st != 200 {
		t.Fatalf("delete user: %d", st)
	}
	if st, _, _ := c.do("GET", "/api/v1/profiles/1", exp, nil); st != 401 {
		t.Fatalf("a deleted user's token: %d", st)
	}
	if st, _, out := c.do("POST", "/api/v1/users", s.AdminToken, map[string]any{"name": "cy", "role": "viewer"}); st != 201 {
		t.Fatalf("user: %d %v", st, out)
	}
	st, _, out := c.do("POST", "/api/v1/tokens", s.AdminToken, map[string]any{"user": "cy", "name": "short", "expires_at": time.Now().Add(1500 * time.Millisecond)})
	short, _ := out["token"].(string)
	if st != 201 {
		t.Fatalf("token with expiry: %d %v", st, out)
	}
	if st, _, _ := c.do("GET", "/api/v1/profiles/1", short, nil); st != 200 {
		t.Fatalf("token before expiry: %d", st)
	}
	time.Sleep(1600 * time.Millisecond) // lets the token's expiry pass: the thing under test
	if st, _, _ := c.do("GET", "/api/v1/profiles/1", short, nil); st != 401 {
		t.Fatalf("expired token: %d", st)
	}
	for _, bad := range []any{
		map[string]any{"name": "x", "role": "root"},
		map[string]any{"name": "", "role": "viewer"},
		map[string]any{"name": "x", "role": "viewer", "password": "short"},
		`{"name":"x","role":"viewer","extra":1}`,
	} {
		if st, _, out := c.do("POST", "/api/v1/users", s.AdminToken, bad); st != 400 {
			t.Errorf("%v: %d %v, want 400", bad, st, out)
		}
	}
	if st, _, _ := c.do("POST", "/api/v1/users", s.AdminToken, map[string]any{"name": "cy", "role": "viewer"}); st != 409 {
		t.Errorf("duplicate user: %d, want 409", st)
	}
}
