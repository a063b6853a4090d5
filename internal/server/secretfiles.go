package server

import (
	"fmt"
	"os"
	"strings"
)

// readSecretFiles fills the secrets given as files (--admin-token-file,
// --enrollment-secret-file, --metrics-token-file).
func (c *Config) readSecretFiles() error {
	for _, f := range []struct {
		flag, file string
		value      *string
	}{
		{"admin-token", c.AdminTokenFile, &c.AdminToken},
		{"enrollment-secret", c.EnrollmentSecretFile, &c.EnrollmentSecret},
		{"metrics-token", c.MetricsTokenFile, &c.MetricsToken},
	} {
		if f.file == "" {
			continue
		}
		if *f.value != "" {
			return fmt.Errorf("-%s and -%s-file are both set: give one", f.flag, f.flag)
		}
		b, err := os.ReadFile(f.file)
		if err != nil {
			return fmt.Errorf("-%s-file: %w", f.flag, err)
		}
		v := strings.TrimSpace(string(b))
		if v == "" || strings.ContainsAny(v, "\r\n") {
			return fmt.Errorf("-%s-file %s: want the secret on one line", f.flag, f.file)
		}
		*f.value = v
	}
	return nil
}
