package server_test

import (
	"os"
	"runtime"
	"testing"

	"github.com/drover/drover/internal/server/servertest"
)

// GET /api/v1/server describes the machine, the process and the store to
// a viewer (the role check of every route is in authz_test.go).
func TestServerInfo(t *testing.T) {
	s := servertest.Start(t, servertest.Options{})
	c := &client{t: t, s: s, url: s.URL}
	view := userToken(c, "vera", "viewer")
	st, _, out := c.do("GET", "/api/v1/server", view, nil)
	if st != 200 {
		t.Fatalf("viewer: %d %v", st, out)
	}
	host, _ := os.Hostname()
	if out["host"] != host || out["threads"].(float64) < 1 || out["memory_bytes"].(float64) <= 0 || out["go_version"] != runtime.Version() {
		t.Errorf("machine: %v", out)
	}
	if out["pid"] != float64(os.Getpid()) || out["rss_bytes"].(float64) < 1<<20 || out["gomaxprocs"] != float64(runtime.GOMAXPROCS(0)) {
		t.Errorf("process: %v", out)
	}
	if out["backend"] != "sqlite" || out["persistence"] != "write-through" || out["drover_version"] == "" {
		t.Errorf("store: %v", out)
	}
	cg, _ := out["cgroup"].(map[string]any)
	if cg == nil {
		t.Errorf("no cgroup object: %v", out)
	}
	if st, _, _ := c.do("GET", "/api/v1/server", "", nil); st != 401 {
		t.Errorf("no credential: %d", st)
	}
}
