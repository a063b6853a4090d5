package command

import (
	"bytes"
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestSecretFiles(t *testing.T) {
	dir := t.TempDir()
	good, twoLines := filepath.Join(dir, "s"), filepath.Join(dir, "two")
	os.WriteFile(good, []byte("s3cret\n"), 0o600)
	os.WriteFile(twoLines, []byte("a\nb\n"), 0o600)
	env := Env{Stdout: io.Discard, Stderr: io.Discard, Getenv: func(k string) string {
		if k == "DROVER_TOKEN_FILE" {
			return good
		}
		return ""
	}}
	for _, tc := range []struct {
		args   []string
		want   string
		errHas string
		usage  bool
	}{
		{args: []string{"--secret-file", good}, want: "s3cret"},
		{args: []string{"--secret", "s3cret", "--secret-file", good}, want: "s3cret"}, // the same value twice: a child process
		{args: []string{"--secret", "other", "--secret-file", good}, errHas: "give one", usage: true},
		{args: []string{"--secret-file", twoLines}, errHas: "one line", usage: true},
		{args: []string{"--secret-file", filepath.Join(dir, "missing")}, errHas: "--secret-file"},
		{args: []string{"--secret", "plain"}, want: "plain"},
	} {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		secret := fs.String("secret", "", "")
		fs.String("token", "", "")
		sf := DefineSecretFiles(fs, "secret", "token")
		err := Load(fs, tc.args, env) // reads the files
		if err == nil {
			err = sf.Read() // again: changes nothing
		}
		if tc.errHas != "" {
			if err == nil || !strings.Contains(err.Error(), tc.errHas) || (ExitCode("t", err, io.Discard) == 2) != tc.usage {
				t.Errorf("%q: err %v (exit %d), want %q usage=%v", tc.args, err, ExitCode("t", err, io.Discard), tc.errHas, tc.usage)
			}
			continue
		}
		if err != nil || *secret != tc.want || fs.Lookup("token").Value.String() != "s3cret" {
			t.Errorf("%q: %v, secret %q token %q, want %q and the token from $DROVER_TOKEN_FILE", tc.args, err, *secret, fs.Lookup("token").Value.String(), tc.want)
		}
	}
}

// A secret's default (here from the environment, as emulate's --secret
// takes $DROVER_ENROLLMENT_SECRET) is never shown by --help.
func TestSecretDefaultsNotInHelp(t *testing.T) {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.String("secret", "from-the-environment", "the secret")
	fs.String("name", "shown-default", "not a secret")
	DefineSecretFiles(fs, "secret")
	var out bytes.Buffer
	err := Load(fs, []string{"--help"}, Env{Stdout: &out, Stderr: io.Discard, Getenv: func(string) string { return "" }})
	if !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("--help: %v", err)
	}
	if strings.Contains(out.String(), "from-the-environment") || !strings.Contains(out.String(), "shown-default") || !strings.Contains(out.String(), "-secret-file") {
		t.Errorf("--help:\n%s", out.String())
	}
	if v := fs.Lookup("secret").Value.String(); v != "from-the-environment" {
		t.Errorf("the secret's value %q, want its default kept", v)
	}
}
