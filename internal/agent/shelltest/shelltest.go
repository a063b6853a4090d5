// Package shelltest helps tests run the shell agent (agent/drover-agent.sh)
// as on a router: under busybox with only its applets and curl on PATH.
package shelltest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// BusyboxEnv is the environment with PATH holding busybox's applets (links
// to bb) and curl, nothing else.
func BusyboxEnv(t testing.TB, bb, curl string) []string {
	t.Helper()
	out, err := exec.Command(bb, "--list").Output()
	if err != nil {
		t.Fatal(err)
	}
	bin := t.TempDir()
	for _, applet := range strings.Fields(string(out)) {
		if strings.Contains(applet, "/") {
			continue
		}
		if err := os.Symlink(bb, filepath.Join(bin, applet)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(curl, filepath.Join(bin, "curl")); err != nil {
		t.Fatal(err)
	}
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PATH=") {
			env = append(env, kv)
		}
	}
	return append(env, "PATH="+bin)
}
