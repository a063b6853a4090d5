package agentcmd

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/pem"
	"errors"
	"flag"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/drover/drover/cmd/internal/command"
	"github.com/drover/drover/internal/agent"
	"github.com/drover/drover/internal/protocol"
)

func run(args []string, stdout, stderr io.Writer) error {
	return Run(context.Background(), "drover agent", args, command.Env{Stdout: stdout, Stderr: stderr, Getenv: func(string) string { return "" }})
}

func TestMainHelpListsEveryFlag(t *testing.T) {
	var out, errOut bytes.Buffer
	err := run([]string{"--help"}, &out, &errOut)
	if !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("--help: %v", err)
	}
	if errOut.Len() != 0 {
		t.Errorf("requested help went to stderr: %q", errOut.String())
	}
	for _, f := range []string{"server", "enroll-secret", "enroll-secret-file", "state-dir", "ca-cert", "pin-pubkey", "allow-http",
		"hook", "hook-timeout", "hook-retry", "collector", "collector-timeout", "device-type", "model", "serial", "firmware",
		"machine-id", "root", "disk-path", "interfaces", "max-backoff", "enroll-retry", "timeout", "once", "log-format",
		"log-level", "print-pin", "config", "identity-script", "print-machine-id"} {
		if !strings.Contains(out.String(), "\n  -"+f+" ") && !strings.Contains(out.String(), "\n  -"+f+"\n") {
			t.Errorf("--help does not list -%s", f)
		}
	}
}

func TestMainRejectsBadInvocations(t *testing.T) {
	secret := filepath.Join(t.TempDir(), "secret")
	os.WriteFile(secret, []byte("s\n"), 0o600)
	for _, c := range []struct {
		args  []string
		want  string
		usage bool
	}{
		{[]string{"--bogus"}, "flag provided but not defined", true},
		{[]string{"--hook-timeout", "soon"}, "invalid value", true},
		{[]string{"--server", "https://x", "extra"}, "unexpected argument", true},
		{[]string{}, "--server is required", true},
		{[]string{"--server", "https://127.0.0.1:1", "--log-level", "loud"}, "--log-level", true},
		{[]string{"--server", "https://127.0.0.1:1", "--log-format", "xml"}, "--log-format", true},
		{[]string{"--server", "https://127.0.0.1:1", "--enroll-secret", "a", "--enroll-secret-file", secret}, "exclude each other", true},
		{[]string{"--server", "https://127.0.0.1:1", "--enroll-secret-file", "/nonexistent"}, "--enroll-secret-file", false},
		{[]string{"--print-pin", secret}, "no PEM certificate", false},
		{[]string{"--print-machine-id", "--state-dir", t.TempDir(), "--identity-script", "echo modem down >&2; exit 3"}, "identity script exited with status 3: modem down", false},
		{[]string{"--server", "https://127.0.0.1:1", "--state-dir", t.TempDir(), "--identity-script", "true"}, "identity script printed nothing", false},
	} {
		var out, errOut bytes.Buffer
		err := run(c.args, &out, &errOut)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: err = %v, want %q", c.args, err, c.want)
		}
		if code, want := command.ExitCode("drover agent", err, io.Discard), map[bool]int{true: 2, false: 1}[c.usage]; code != want {
			t.Errorf("%q: exit code %d, want %d", c.args, code, want)
		}
	}
}

// fake is the least of a server the agent's --once run needs.
type fake struct {
	srv    *httptest.Server
	caFile string
	mu     sync.Mutex
	regs   []protocol.RegisterRequest
	pushes []protocol.PushRequest
}

func newFake(t *testing.T) *fake {
	f := &fake{}
	f.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		f.mu.Lock()
		defer f.mu.Unlock()
		switch r.URL.Path {
		case protocol.PathRegister:
			req, err := protocol.DecodeRegister(body)
			if err != nil {
				t.Errorf("bad registration: %v", err)
				w.WriteHeader(400)
				return
			}
			f.regs = append(f.regs, req)
			json.NewEncoder(w).Encode(protocol.RegisterResponse{DeviceID: "1", Token: "tok", New: true})
		case protocol.PathPush:
			req, err := protocol.DecodePush(body)
			if err != nil || r.Header.Get("Authorization") != "Bearer tok" {
				t.Errorf("bad push: %v", err)
				w.WriteHeader(400)
				return
			}
			f.pushes = append(f.pushes, req)
			json.NewEncoder(w).Encode(protocol.PushResponse{})
		default:
			w.WriteHeader(404)
		}
	}))
	f.srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	f.srv.StartTLS()
	t.Cleanup(f.srv.Close)
	f.caFile = filepath.Join(t.TempDir(), "ca.pem")
	os.WriteFile(f.caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: f.srv.Certificate().Raw}), 0o644)
	return f
}

func TestMainOnceAgainstFakeServer(t *testing.T) {
	f := newFake(t)
	dir := t.TempDir()
	secret := filepath.Join(dir, "secret")
	os.WriteFile(secret, []byte("s3cret\n"), 0o600)
	var out, errOut bytes.Buffer
	err := run([]string{"--server", f.srv.URL, "--ca-cert", f.caFile, "--enroll-secret-file", secret,
		"--state-dir", filepath.Join(dir, "state"), "--root", "../../../internal/agent/testdata/root", "--interfaces", "eth*, wwan*", "--device-type", "ICR-3241",
		"--once", "--log-format", "json"}, &out, &errOut)
	if err != nil {
		t.Fatalf("%v\n%s", err, errOut.String())
	}
	f.mu.Lock()
	regs, pushes := f.regs, f.pushes
	f.mu.Unlock()
	if len(regs) != 1 || regs[0].EnrollmentSecret != "s3cret" || regs[0].DeviceType != "ICR-3241" || len(pushes) != 1 {
		t.Fatalf("registrations %+v, %d pushes", regs, len(pushes))
	}
	if n := len(pushes[0].State.Interfaces); n != 2 {
		t.Fatalf("--interfaces eth*,wwan*: %d interfaces", n)
	}
	if !strings.Contains(errOut.String(), `"msg":"registered"`) {
		t.Fatalf("JSON log: %s", errOut.String())
	}

	out.Reset()
	if err := run([]string{"--print-pin", f.caFile}, &out, &errOut); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(f.caFile)
	want, err := agent.PinOf(b)
	if got := strings.TrimSpace(out.String()); err != nil || got != want || !strings.HasPrefix(got, "sha256//") {
		t.Fatalf("--print-pin printed %q", got)
	}
}

// The same settings come from the environment and from a config file.
func TestMainEnvAndConfigFile(t *testing.T) {
	f := newFake(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "agent.toml")
	os.WriteFile(file, []byte("server = \""+f.srv.URL+"\"\nca-cert = \""+f.caFile+"\"\nonce = true\nroot = \"../../../internal/agent/testdata/root\"\n"+
		"state-dir = \""+filepath.Join(dir, "state")+"\"\ninterfaces = [\"eth*\", \"wwan*\"]\n"), 0o600)
	env := map[string]string{"DROVER_CONFIG": file, "DROVER_ENROLL_SECRET": "from-env"}
	var out, errOut bytes.Buffer
	err := Run(context.Background(), "drover-agent", nil, command.Env{Stdout: &out, Stderr: &errOut, Getenv: func(k string) string { return env[k] }})
	if err != nil {
		t.Fatalf("%v\n%s", err, errOut.String())
	}
	if len(f.regs) != 1 || f.regs[0].EnrollmentSecret != "from-env" || len(f.pushes) != 1 || len(f.pushes[0].State.Interfaces) != 2 {
		t.Fatalf("registrations %+v, pushes %+v", f.regs, f.pushes)
	}
	os.WriteFile(file, []byte("hook-timeout = 30\n"), 0o600)
	err = Run(context.Background(), "drover-agent", nil, command.Env{Stdout: &out, Stderr: &errOut, Getenv: func(k string) string { return env[k] }})
	if err == nil || !strings.Contains(err.Error(), `key "hook-timeout"`) || !strings.Contains(err.Error(), "not a duration") {
		t.Fatalf("a duration without unit in the config file: %v", err)
	}
}
