package agent

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestMainHelpListsEveryFlag(t *testing.T) {
	var out, errOut bytes.Buffer
	err := Main(context.Background(), []string{"--help"}, &out, &errOut)
	if !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("--help: %v", err)
	}
	for _, f := range []string{"server", "enroll-secret", "enroll-secret-file", "state-dir", "ca-cert", "pin-pubkey", "allow-http",
		"hook", "hook-timeout", "hook-retry", "collector", "collector-timeout", "device-type", "model", "serial", "firmware",
		"machine-id", "root", "disk-path", "interfaces", "max-backoff", "enroll-retry", "timeout", "once", "log-format",
		"log-level", "print-pin"} {
		if !strings.Contains(errOut.String(), "\n  -"+f+" ") && !strings.Contains(errOut.String(), "\n  -"+f+"\n") {
			t.Errorf("--help does not list -%s", f)
		}
	}
}

func TestMainRejectsBadInvocations(t *testing.T) {
	secret := filepath.Join(t.TempDir(), "secret")
	os.WriteFile(secret, []byte("s\n"), 0o600)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--bogus"}, "flag provided but not defined"},
		{[]string{"--hook-timeout", "soon"}, "invalid value"},
		{[]string{"--server", "https://x", "extra"}, "unexpected argument"},
		{[]string{}, "--server is required"},
		{[]string{"--server", "https://127.0.0.1:1", "--log-level", "loud"}, "--log-level"},
		{[]string{"--server", "https://127.0.0.1:1", "--log-format", "xml"}, "--log-format"},
		{[]string{"--server", "https://127.0.0.1:1", "--enroll-secret", "a", "--enroll-secret-file", secret}, "exclude each other"},
		{[]string{"--server", "https://127.0.0.1:1", "--enroll-secret-file", "/nonexistent"}, "--enroll-secret-file"},
		{[]string{"--print-pin", secret}, "no PEM certificate"},
	} {
		var out, errOut bytes.Buffer
		err := Main(context.Background(), c.args, &out, &errOut)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: err = %v, want %q", c.args, err, c.want)
		}
	}
}

func TestMainOnceAgainstFakeServer(t *testing.T) {
	f := newFakeServer(t)
	dir := t.TempDir()
	secret := filepath.Join(dir, "secret")
	os.WriteFile(secret, []byte("s3cret\n"), 0o600)
	var out, errOut bytes.Buffer
	err := Main(context.Background(), []string{"--server", f.srv.URL, "--ca-cert", f.caFile, "--enroll-secret-file", secret,
		"--state-dir", filepath.Join(dir, "state"), "--root", "testdata/root", "--interfaces", "eth*, wwan*", "--device-type", "ICR-3241",
		"--once", "--log-format", "json"}, &out, &errOut)
	if err != nil {
		t.Fatalf("%v\n%s", err, errOut.String())
	}
	regs, pushes := f.snapshot()
	if len(regs) != 1 || regs[0].EnrollmentSecret != "s3cret" || regs[0].DeviceType != "ICR-3241" || len(pushes) != 1 {
		t.Fatalf("registrations %+v, %d pushes", regs, len(pushes))
	}
	if n := len(pushes[0].req.State.Interfaces); n != 2 {
		t.Fatalf("--interfaces eth*,wwan*: %d interfaces", n)
	}
	if !strings.Contains(errOut.String(), `"msg":"registered"`) {
		t.Fatalf("JSON log: %s", errOut.String())
	}

	out.Reset()
	if err := Main(context.Background(), []string{"--print-pin", f.caFile}, &out, &errOut); err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(out.String()); got != pinOf(t, f.caFile) || !strings.HasPrefix(got, "sha256//") {
		t.Fatalf("--print-pin printed %q", got)
	}
}
