package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The real binary, built from this checkout, names its version (a tag or a
// pseudo-version, never "devel") and its commit.
func TestVersionFromBuildInfo(t *testing.T) {
	want := regexp.MustCompile(`^drover v\d+\.\d+\.\d+\S* \(commit [0-9a-f]{40}(-dirty)?, \d{4}-\d\d-\d\dT\S+, go\d\S*\)\n$`)
	for _, args := range [][]string{{"version"}, {"--version"}} {
		out, err := exec.Command(droverBin, args...).Output()
		if err != nil || !want.Match(out) {
			t.Errorf("drover %v: %v %q, want %s", args, err, out, want)
		}
	}
}

// drover backup copies a running server's data directory; drover
// healthcheck says whether it answers.
func TestBackupAndHealthcheckCommands(t *testing.T) {
	t.Parallel()
	data := t.TempDir()
	p := startServe(t, data)
	if out, err := exec.Command(droverBin, "healthcheck", "--listen", p.addr).CombinedOutput(); err != nil {
		t.Fatalf("healthcheck of a live server: %v %s", err, out)
	}
	if out, err := exec.Command(droverBin, "healthcheck", "--listen", p.addr, "--ready").CombinedOutput(); err != nil {
		t.Fatalf("healthcheck --ready of a live server: %v %s", err, out)
	}
	dir := filepath.Join(t.TempDir(), "b")
	cmd := exec.Command(droverBin, "backup", dir)
	cmd.Env = append(os.Environ(), "DROVER_DATA_DIR="+data)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "drover.db, drover-history.db") || !strings.Contains(string(out), "secrets.json") {
		t.Fatalf("drover backup: %v %s", err, out)
	}
	for _, f := range []string{"drover.db", "drover-history.db", "secrets.json", "tls/cert.pem", "tls/key.pem"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Error(err)
		}
	}
	for _, args := range [][]string{{"backup"}, {"backup", dir}} { // no directory; an existing one
		c := exec.Command(droverBin, args...)
		c.Env = append(os.Environ(), "DROVER_DATA_DIR="+data)
		if out, err := c.CombinedOutput(); err == nil {
			t.Errorf("drover %v succeeded: %s", args, out)
		}
	}
	p.stop(t)
	if out, err := exec.Command(droverBin, "healthcheck", "--listen", p.addr).CombinedOutput(); err == nil {
		t.Errorf("healthcheck of a stopped server succeeded: %s", out)
	}
}
