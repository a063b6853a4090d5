package server

import (
	"errors"
	"fmt"
	"os"
	"strings"
)

// readSecretFiles fills the secrets given as files (--admin-token-file,
// --enrollment-secret-file, --metrics-token-file,
// --oidc-client-secret-file); New reads them at the start and Reload again
// on SIGHUP.
func (c *Config) readSecretFiles() error {
	for _, f := range []struct {
		flag, file string
		value      *string
	}{
		{"admin-token", c.AdminTokenFile, &c.AdminToken},
		{"enrollment-secret", c.EnrollmentSecretFile, &c.EnrollmentSecret},
		{"metrics-token", c.MetricsTokenFile, &c.MetricsToken},
		{"oidc-client-secret", c.OIDCClientSecretFile, &c.OIDCClientSecret},
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

// validateSecrets checks the secrets once their files are read.
func (c *Config) validateSecrets() error {
	if c.MetricsToken != "" && len(c.MetricsToken) < 16 {
		return errors.New("-metrics-token must be at least 16 characters")
	}
	if c.MetricsToken != "" && c.MetricsToken == c.AdminToken {
		return errors.New("-metrics-token must differ from -admin-token")
	}
	return nil
}

// readSMTPPassword reads --smtp-password-file ("": none): the file's
// content without its line end.
func readSMTPPassword(file string) (string, error) {
	if file == "" {
		return "", nil
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("smtp-password-file: %w", err)
	}
	p := strings.TrimRight(string(b), "\r\n")
	if p == "" {
		return "", fmt.Errorf("smtp-password-file %s is empty", file)
	}
	return p, nil
}
