package alert_test

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/drover/drover/internal/alert"
)

// The SMTP password is stored sealed under the secret key, never plain; the
// same key reads it back after a restart, another key does not; a password
// from a file is never stored; a plain one stored by an older version is
// sealed at start.
func TestSMTPPasswordSealed(t *testing.T) {
	ctx := context.Background()
	key := bytes.Repeat([]byte{7}, 32)
	store := alert.NewMemStore()
	e := newEnv(t, store, alert.Options{SecretKey: key})
	const pw = "s3cret-pässword"
	if _, err := e.eng.SetSMTP(ctx, alert.SMTPSettings{Addr: "mail.example:587", From: "d@example.com", Username: "u", Password: pw}); err != nil {
		t.Fatal(err)
	}
	stored, _ := store.Setting(ctx, "smtp")
	if strings.Contains(stored, pw) || !strings.Contains(stored, `"password_sealed":"v1:`) {
		t.Fatalf("stored settings: %s", stored)
	}
	if got := newEnv(t, store, alert.Options{SecretKey: key}).eng.SMTP(); got.Password != pw || got.Username != "u" {
		t.Fatalf("after restart: %+v", got)
	}
	if got := newEnv(t, store, alert.Options{SecretKey: bytes.Repeat([]byte{8}, 32)}).eng.SMTP(); got.Password != "" || got.Addr != "mail.example:587" {
		t.Fatalf("with another key: %+v", got)
	}

	// From a file: used, never stored.
	f := newEnv(t, store, alert.Options{SecretKey: key, SMTPPassword: "from-file"})
	if got := f.eng.SMTP(); got.Password != "from-file" {
		t.Fatalf("file password: %+v", got)
	}
	if _, err := f.eng.SetSMTP(ctx, alert.SMTPSettings{Addr: "mail.example:587", From: "d@example.com", Username: "u", Password: "typed"}); err != nil {
		t.Fatal(err)
	}
	stored, _ = store.Setting(ctx, "smtp")
	if strings.Contains(stored, "from-file") || strings.Contains(stored, "typed") || strings.Contains(stored, "password") {
		t.Fatalf("stored with a password file: %s", stored)
	}

	// Plain, as stored before sealing: read, then sealed in place.
	old := alert.NewMemStore()
	old.PutSetting(ctx, "smtp", `{"addr":"mail.example:587","from":"d@example.com","username":"u","password":"legacy-pw"}`)
	if got := newEnv(t, old, alert.Options{SecretKey: key}).eng.SMTP(); got.Password != "legacy-pw" {
		t.Fatalf("legacy password: %+v", got)
	}
	if stored, _ := old.Setting(ctx, "smtp"); strings.Contains(stored, "legacy-pw") || !strings.Contains(stored, "password_sealed") {
		t.Fatalf("legacy password not sealed: %s", stored)
	}
}
