package server

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestSecretFiles(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	c := Config{AdminTokenFile: write("admin", "  s3cret-admin-token\n"), EnrollmentSecretFile: write("enroll", "sesame\n")}
	if err := c.readSecretFiles(); err != nil || c.AdminToken != "s3cret-admin-token" || c.EnrollmentSecret != "sesame" {
		t.Fatalf("read: %v %q %q", err, c.AdminToken, c.EnrollmentSecret)
	}
	for name, c := range map[string]Config{
		"both":      {AdminToken: "x", AdminTokenFile: write("a2", "y")},
		"empty":     {EnrollmentSecretFile: write("e2", " \n")},
		"two lines": {MetricsTokenFile: write("m2", "a\nb\n")},
		"missing":   {AdminTokenFile: filepath.Join(dir, "none")},
	} {
		if err := c.readSecretFiles(); err == nil || !strings.Contains(err.Error(), "-file") {
			t.Errorf("%s: %v", name, err)
		}
	}
}
