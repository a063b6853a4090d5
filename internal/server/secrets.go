package server

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/drover/drover/internal/fsutil"
)

// Secrets are the credentials in force. Those the configuration does not
// give (flag, environment, config file or secret file) are generated once
// and kept in data-dir/secrets.json (mode 0600); given ones are never
// written there.
type Secrets struct {
	EnrollmentSecret string `json:"enrollment_secret,omitempty"`
	AdminToken       string `json:"admin_token,omitempty"`
	// SettingsKey (32 bytes, base64) seals secrets the store keeps, such as
	// the SMTP password (docs/operations.md, Secrets at rest). Added to an
	// older file at the next start.
	SettingsKey string `json:"settings_key,omitempty"`
}

// Generated is what a start generated and wrote to secrets.json: the
// only credentials Drover prints (once, at that start).
type Generated struct {
	FirstStart       bool   // secrets.json was created
	EnrollmentSecret string // "": given, or generated at an earlier start
	AdminToken       string
}

// Notice is what `drover serve` prints about the credentials this start
// generated, or "" when it generated none. Secrets the configuration gives
// are never in it.
func (g Generated) Notice(dataDir string) string {
	if g.EnrollmentSecret == "" && g.AdminToken == "" {
		return ""
	}
	var b strings.Builder
	if g.FirstStart {
		b.WriteString("Drover first start: ")
	} else {
		b.WriteString("Drover: ")
	}
	fmt.Fprintf(&b, "generated credentials, kept in %s\n", filepath.Join(dataDir, "secrets.json"))
	if g.EnrollmentSecret != "" {
		fmt.Fprintf(&b, "  enrollment secret: %s\n", g.EnrollmentSecret)
	}
	if g.AdminToken != "" {
		fmt.Fprintf(&b, "  admin token:       %s\n", g.AdminToken)
	}
	return b.String()
}

// settingsKey decodes SettingsKey.
func (s Secrets) settingsKey() []byte {
	k, err := base64.RawURLEncoding.DecodeString(s.SettingsKey)
	if err != nil || len(k) != 32 {
		return nil
	}
	return k
}

func randomString(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

// loadSecrets returns the secrets in force: those given (non-empty fields
// of given) and the others from data-dir/secrets.json. It generates and
// writes there what the file lacks: the settings key always, the
// enrollment secret and the admin token only when not given. Given
// secrets are never written.
func loadSecrets(dir string, given Secrets) (Secrets, Generated, error) {
	path := filepath.Join(dir, "secrets.json")
	var s Secrets
	var gen Generated
	b, err := os.ReadFile(path)
	switch {
	case err == nil:
		if err := json.Unmarshal(b, &s); err != nil || (s.SettingsKey != "" && s.settingsKey() == nil) {
			return s, gen, fmt.Errorf("%s is damaged: remove it to generate new secrets", path)
		}
	case errors.Is(err, os.ErrNotExist):
		gen.FirstStart = true
	default:
		return s, gen, err
	}
	write := gen.FirstStart
	if s.EnrollmentSecret == "" && given.EnrollmentSecret == "" {
		s.EnrollmentSecret = randomString(18)
		gen.EnrollmentSecret, write = s.EnrollmentSecret, true
	}
	if s.AdminToken == "" && given.AdminToken == "" {
		s.AdminToken = randomString(24)
		gen.AdminToken, write = s.AdminToken, true
	}
	if s.SettingsKey == "" {
		s.SettingsKey, write = randomString(32), true
	}
	if write {
		b, _ = json.MarshalIndent(s, "", "  ")
		if err := fsutil.WriteFileAtomic(path, append(b, '\n'), 0o600); err != nil {
			return s, Generated{}, err
		}
	}
	if given.EnrollmentSecret != "" {
		s.EnrollmentSecret = given.EnrollmentSecret
	}
	if given.AdminToken != "" {
		s.AdminToken = given.AdminToken
	}
	return s, gen, nil
}
