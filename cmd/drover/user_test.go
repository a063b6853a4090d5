package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/drover/drover/internal/server/servertest"
)

// drover user makes the first admin without a server; the server then
// takes its token on the API, and the audit log shows who changed users. While the server runs, drover user refuses
// (the instance lock) and points to the API.
func TestUserCommandBootstrapsAnAdmin(t *testing.T) {
	dir := t.TempDir()
	user := func(stdin string, args ...string) (int, string, string) {
		var out, errOut bytes.Buffer
		code := run(context.Background(), append([]string{"user", "--data-dir", dir}, args...), testEnv(strings.NewReader(stdin), &out, &errOut, nil))
		return code, out.String(), errOut.String()
	}
	if code, out, errOut := user("", "--password-stdin", "add", "ada", "admin"); code == 0 {
		t.Fatalf("no password on stdin: exit 0 %q %q", out, errOut)
	}
	if code, _, errOut := user("", "add", "ada", "root"); code != 2 || !strings.Contains(errOut, "role") {
		t.Fatalf("bad role: %d %q", code, errOut)
	}
	code, out, errOut := user("", "add", "ada", "admin")
	pw := regexp.MustCompile(`password: (\S+)`).FindStringSubmatch(out)
	if code != 0 || pw == nil {
		t.Fatalf("add: %d %q %q", code, out, errOut)
	}
	if code, out, _ := user("opensesame-123\n", "--password-stdin", "add", "otto", "operator"); code != 0 || strings.Contains(out, "password:") {
		t.Fatalf("add with stdin: %d %q", code, out)
	}
	code, out, _ = user("", "token", "ada", "ci")
	tok := regexp.MustCompile(`(drv_\S+)`).FindStringSubmatch(out)
	if code != 0 || tok == nil {
		t.Fatalf("token: %d %q", code, out)
	}
	if code, out, _ := user("", "list"); code != 0 || !strings.Contains(out, "ada   admin     set       ci") || !strings.Contains(out, "otto  operator") {
		t.Fatalf("list: %d\n%s", code, out)
	}
	if code, _, _ := user("", "role", "otto", "viewer"); code != 0 {
		t.Fatalf("role: %d", code)
	}

	s := servertest.Start(t, servertest.Options{DataDir: dir})
	if code, _, errOut := user("", "list"); code == 0 || !strings.Contains(errOut, "the server is running") {
		t.Fatalf("user while the server runs: %d %q", code, errOut)
	}
	get := func(path, token string) (int, map[string]any) {
		req, _ := http.NewRequest("GET", s.URL+path, nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := s.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var m map[string]any
		json.Unmarshal(b, &m)
		return resp.StatusCode, m
	}
	if st, out := get("/api/v1/users", tok[1]); st != 200 || len(out["users"].([]any)) != 2 {
		t.Fatalf("ada's token on the API: %d %v", st, out)
	}
	st, out2 := get("/api/v1/audit?object=/api/v1/users/otto", tok[1])
	es, _ := out2["entries"].([]any)
	if st != 200 || len(es) != 2 || !strings.HasPrefix(es[0].(map[string]any)["actor"].(string), "cli") ||
		es[0].(map[string]any)["action"] != "drover user role" {
		t.Fatalf("audit of drover user: %d %v", st, out2)
	}
}
