package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/drover/drover/internal/fleet"
	"github.com/drover/drover/internal/protocol"
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
	c := Config{AdminTokenFile: write("admin", "  s3cret-admin-token\n"), EnrollmentSecretFile: write("enroll", "sesame\n"),
		OIDCClientSecretFile: write("oidc", "client-s3cret\n")}
	if err := c.readSecretFiles(); err != nil || c.AdminToken != "s3cret-admin-token" || c.EnrollmentSecret != "sesame" || c.OIDCClientSecret != "client-s3cret" {
		t.Fatalf("read: %v %q %q %q", err, c.AdminToken, c.EnrollmentSecret, c.OIDCClientSecret)
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

// Secrets the configuration gives are never written to secrets.json nor
// in the notice `drover serve` prints; those generated are, once.
func TestGivenSecretsNeverStored(t *testing.T) {
	read := func(dir string) map[string]string {
		t.Helper()
		var m map[string]string
		b, err := os.ReadFile(filepath.Join(dir, "secrets.json"))
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	const enroll, admin = "given-enrollment-secret", "given-admin-token"

	// Both given: secrets.json has the settings key alone; nothing to print.
	dir := t.TempDir()
	s, gen, err := loadSecrets(dir, Secrets{EnrollmentSecret: enroll, AdminToken: admin})
	if err != nil || s.EnrollmentSecret != enroll || s.AdminToken != admin || s.settingsKey() == nil {
		t.Fatalf("both given: %v %+v", err, s)
	}
	if m := read(dir); len(m) != 1 || m["settings_key"] == "" {
		t.Errorf("both given: secrets.json holds %v, want the settings key alone", m)
	}
	if n := gen.Notice(dir); n != "" {
		t.Errorf("both given: notice %q, want none", n)
	}

	// One given: only the generated one is stored and printed, once.
	dir = t.TempDir()
	s, gen, err = loadSecrets(dir, Secrets{AdminToken: admin})
	if err != nil || s.AdminToken != admin || s.EnrollmentSecret == "" || gen.EnrollmentSecret != s.EnrollmentSecret || gen.AdminToken != "" {
		t.Fatalf("admin token given: %v %+v %+v", err, s, gen)
	}
	if m := read(dir); m["admin_token"] != "" || m["enrollment_secret"] != s.EnrollmentSecret {
		t.Errorf("admin token given: secrets.json holds %v", m)
	}
	n := gen.Notice(dir)
	if !strings.HasPrefix(n, "Drover first start: generated credentials") || !strings.Contains(n, "enrollment secret: "+s.EnrollmentSecret) ||
		strings.Contains(n, admin) || strings.Contains(n, "admin token") {
		t.Errorf("admin token given: notice %q", n)
	}
	again, gen, err := loadSecrets(dir, Secrets{AdminToken: admin})
	if err != nil || again.EnrollmentSecret != s.EnrollmentSecret || gen.Notice(dir) != "" {
		t.Errorf("second start: %v %+v, notice %q", err, again, gen.Notice(dir))
	}

	// Given no more: generated then, stored and printed (not a first start).
	again, gen, err = loadSecrets(dir, Secrets{})
	if err != nil || again.AdminToken == "" || again.AdminToken == admin || gen.AdminToken != again.AdminToken || gen.EnrollmentSecret != "" {
		t.Fatalf("admin token no more given: %v %+v %+v", err, again, gen)
	}
	if n := gen.Notice(dir); !strings.HasPrefix(n, "Drover: generated credentials") || !strings.Contains(n, "admin token:       "+again.AdminToken) || strings.Contains(n, "enrollment secret") {
		t.Errorf("admin token no more given: notice %q", n)
	}
	if m := read(dir); m["admin_token"] != again.AdminToken || m["enrollment_secret"] != s.EnrollmentSecret {
		t.Errorf("admin token no more given: secrets.json holds %v", m)
	}

	// Nothing given, nothing stored: both generated, as ever.
	dir = t.TempDir()
	s, gen, err = loadSecrets(dir, Secrets{})
	if err != nil || !gen.FirstStart || gen.EnrollmentSecret != s.EnrollmentSecret || gen.AdminToken != s.AdminToken || s.AdminToken == "" {
		t.Fatalf("nothing given: %v %+v %+v", err, s, gen)
	}
	if m := read(dir); m["admin_token"] != s.AdminToken || m["enrollment_secret"] != s.EnrollmentSecret {
		t.Errorf("nothing given: secrets.json holds %v", m)
	}
}

// Reload reads the secret files again: unchanged, nothing is logged as
// needing a restart; rotated, the new secrets are in force and the old
// ones refused, without a restart.
func TestReloadRotatesSecretFiles(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	files := func(prefix string) Config {
		c := DefaultConfig()
		c.DataDir, c.Listen = filepath.Join(dir, "data"), "127.0.0.1:0"
		c.EnrollmentSecretFile = write("enroll", prefix+"-enrollment-secret")
		c.AdminTokenFile = write("admin", prefix+"-admin-token")
		c.MetricsTokenFile = write("metrics", prefix+"-metrics-token-0123456789")
		c.SMTPPasswordFile = write("smtp", prefix+"-smtp-password")
		return c
	}
	var logged bytes.Buffer
	s, err := New(context.Background(), files("old"), slog.New(slog.NewTextHandler(&logged, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer s.closeAll()
	if n := s.Generated.Notice(s.cfg.DataDir); n != "" {
		t.Errorf("all secrets given, yet the notice is %q", n)
	}
	machines := 0
	registers := func(secret string) bool {
		machines++
		_, err := s.fleet.RegisterWith(context.Background(), protocol.RegisterRequest{MachineID: fmt.Sprintf("m-%d", machines), DeviceType: "t", Firmware: "1", EnrollmentSecret: secret}, fleet.Proof{})
		if err != nil && !errors.Is(err, fleet.ErrEnrollment) {
			t.Fatal(err)
		}
		return err == nil
	}
	readsMetrics := func(token string) bool {
		r := httptest.NewRequest("GET", "/metrics", nil)
		r.Header.Set("Authorization", "Bearer "+token)
		return s.api.isMetricsReader(r)
	}
	check := func(when, cur, prev string) {
		t.Helper()
		if !registers(cur+"-enrollment-secret") || !s.acc.IsAdminToken(cur+"-admin-token") || !readsMetrics(cur+"-metrics-token-0123456789") ||
			s.alerts.SMTP().Password != cur+"-smtp-password" {
			t.Errorf("%s: the %s secrets are not all in force", when, cur)
		}
		if prev != "" && (registers(prev+"-enrollment-secret") || s.acc.IsAdminToken(prev+"-admin-token") || readsMetrics(prev+"-metrics-token-0123456789")) {
			t.Errorf("%s: a %s secret is still accepted", when, prev)
		}
	}
	check("start", "old", "")

	logged.Reset()
	if err := s.Reload(files("old")); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(logged.String(), "restart") || strings.Contains(logged.String(), "replaced") {
		t.Errorf("reload with the files unchanged logged:\n%s", logged.String())
	}
	check("reload, unchanged", "old", "")

	logged.Reset()
	if err := s.Reload(files("new")); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(logged.String(), "restart") || strings.Contains(logged.String(), "new-") {
		t.Errorf("reload with rotated files logged:\n%s", logged.String())
	}
	for _, what := range []string{"enrollment secret", "admin token", "metrics token", "SMTP password"} {
		if !strings.Contains(logged.String(), "reload: "+what+" replaced") {
			t.Errorf("reload did not say the %s was replaced:\n%s", what, logged.String())
		}
	}
	check("reload, rotated", "new", "old")

	// A secret file gone: the reload fails and the secrets stay.
	broken := files("newer")
	os.Remove(broken.AdminTokenFile)
	if err := s.Reload(broken); err == nil || !strings.Contains(err.Error(), "admin-token-file") {
		t.Errorf("reload with a secret file gone: %v", err)
	}
	check("failed reload", "new", "")

	// Given no more (the generated one would take over): a restart is
	// needed, and the secret in force stays.
	logged.Reset()
	next := files("new")
	next.AdminTokenFile = ""
	if err := s.Reload(next); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logged.String(), "take effect only after a restart") || !strings.Contains(logged.String(), "fields=AdminToken") {
		t.Errorf("reload without the admin token did not ask for a restart:\n%s", logged.String())
	}
	check("admin token no more given", "new", "")
}

// The OIDC client secret from a file: unchanged, a reload says nothing;
// changed, it needs a restart and the reload says so (never the secret).
func TestReloadOIDCClientSecretFile(t *testing.T) {
	dir := t.TempDir()
	secretFile := filepath.Join(dir, "oidc")
	cfg := func(secret string) Config {
		if err := os.WriteFile(secretFile, []byte(secret+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		c := DefaultConfig()
		c.DataDir, c.Listen = filepath.Join(dir, "data"), "127.0.0.1:0"
		c.OIDCIssuer, c.OIDCClientID, c.OIDCRedirectURL, c.OIDCRoles = "https://idp.invalid", "drover", "https://drover.invalid/ui/oidc/callback", "admins=admin"
		c.OIDCClientSecretFile = secretFile
		return c
	}
	var logged bytes.Buffer
	s, err := New(context.Background(), cfg("client-secret-1"), slog.New(slog.NewTextHandler(&logged, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer s.closeAll()
	if s.cfg.OIDCClientSecret != "client-secret-1" {
		t.Fatalf("client secret %q, want the file's", s.cfg.OIDCClientSecret)
	}
	logged.Reset()
	if err := s.Reload(cfg("client-secret-1")); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(logged.String(), "restart") {
		t.Errorf("reload with the file unchanged logged:\n%s", logged.String())
	}
	logged.Reset()
	if err := s.Reload(cfg("client-secret-2")); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logged.String(), "fields=OIDCClientSecret") || strings.Contains(logged.String(), "client-secret-") {
		t.Errorf("reload with the file changed logged:\n%s", logged.String())
	}
}

// A database password given in --db never reaches the log.
func TestRedactDSN(t *testing.T) {
	for in, want := range map[string]string{
		"sqlite:/var/lib/drover/drover.db":                      "sqlite:/var/lib/drover/drover.db",
		"postgres://drover:s3cret@db:5432/drover":               "postgres://drover:***@db:5432/drover",
		"postgres://drover@db/drover?sslmode=verify-full":       "postgres://drover@db/drover?sslmode=verify-full",
		"postgres://drover@db/drover?password=s3cret&sslmode=x": "postgres://drover@db/drover?password=***&sslmode=x",
		"mysql://drover:s3cret@tcp(db:3306)/drover?parseTime=1": "mysql://drover:***@tcp(db:3306)/drover?parseTime=1",
	} {
		if got := redactDSN(in); got != want || strings.Contains(got, "s3cret") {
			t.Errorf("redactDSN(%q) = %q, want %q", in, got, want)
		}
	}
}
