package deploy

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestHAProxyConfig: HAProxy accepts deploy/haproxy/drover.cfg, docs/cluster.md
// shows it as it is, and it keeps the shape internal/clustertest relies on (one bind :8443, servers
// node1… in both backends, the /readyz check, the fallback backend).
func TestHAProxyConfig(t *testing.T) {
	b, err := os.ReadFile("haproxy/drover.cfg")
	if err != nil {
		t.Fatal(err)
	}
	cfg := string(b)
	for _, want := range []string{"bind :8443", "mode tcp", "balance roundrobin", "GET /readyz", "option redispatch", "nbsrv(drover) eq 0"} {
		if !strings.Contains(cfg, want) {
			t.Errorf("drover.cfg lacks %q", want)
		}
	}
	if n := strings.Count(cfg, "server node1 "); n != 2 {
		t.Errorf("%d `server node1` lines, want one per backend (2)", n)
	}
	// docs/cluster.md shows the file as it is.
	doc, err := os.ReadFile("../docs/cluster.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(doc), strings.ReplaceAll(strings.TrimSpace(cfg), "\n", "\n   ")) {
		t.Error("docs/cluster.md does not show deploy/haproxy/drover.cfg as it is (indented by 3 spaces under Deploy)")
	}
	haproxy, err := exec.LookPath("haproxy")
	if err != nil {
		if _, serr := os.Stat("/usr/sbin/haproxy"); serr != nil {
			t.Skip("no haproxy (Debian: apt-get install haproxy); scripts/test.sh installs it")
		}
		haproxy = "/usr/sbin/haproxy"
	}
	if out, err := exec.Command(haproxy, "-c", "-f", "haproxy/drover.cfg").CombinedOutput(); err != nil {
		t.Fatalf("haproxy -c: %v\n%s", err, out)
	}
}
