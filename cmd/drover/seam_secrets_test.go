package main

import (
	"bytes"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// secretServe is a `drover serve` whose stdout and log the test reads.
type secretServe struct {
	cmd    *exec.Cmd
	stdout *bytes.Buffer
	log    *logWatch
	seen   int // log lines already looked at
	base   string
	exited chan error
}

// startSecretServe runs `drover serve` on a free port with args and the
// extra environment env, and waits until it listens.
func startSecretServe(t *testing.T, data string, env []string, args ...string) *secretServe {
	t.Helper()
	cmd := exec.Command(droverBin, append([]string{"serve", "--data-dir", data, "--listen", "127.0.0.1:0", "--log-level", "debug"}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	p := &secretServe{cmd: cmd, stdout: &bytes.Buffer{}, exited: make(chan error, 1)}
	cmd.Stdout = p.stdout
	var started func()
	p.log, started = watchStderr(t, cmd)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	started()
	go func() { p.exited <- cmd.Wait() }()
	t.Cleanup(func() { cmd.Process.Kill() })
	var line string
	line, p.seen = p.log.wait(t, 0, "msg=listening", "proto=https")
	p.base = "https://" + listening.FindStringSubmatch(line)[1]
	return p
}

// reload sends SIGHUP and returns the log lines of that reload, up to the
// certificate's, which Reload logs last.
func (p *secretServe) reload(t *testing.T) []string {
	t.Helper()
	from := p.seen
	p.cmd.Process.Signal(syscall.SIGHUP)
	_, p.seen = p.log.wait(t, from, "reload: TLS certificate")
	p.log.mu.Lock()
	defer p.log.mu.Unlock()
	return append([]string(nil), p.log.lines[from:p.seen]...)
}

// stop ends the server with SIGTERM and returns its whole stdout and log.
func (p *secretServe) stop(t *testing.T) string {
	t.Helper()
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-p.exited:
		if err != nil {
			t.Fatalf("exit after SIGTERM: %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("no exit within 60 s of SIGTERM")
	}
	p.log.wait(t, p.seen, "msg=stopped")
	p.log.mu.Lock()
	defer p.log.mu.Unlock()
	return p.stdout.String() + "\n" + strings.Join(p.log.lines, "\n")
}

var insecureClient = &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}

// status is the status of a request with a bearer token (none: "").
func status(t *testing.T, method, url, token, body string) int {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := insecureClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

func register(t *testing.T, base, machineID, secret string) int {
	t.Helper()
	return status(t, "POST", base+"/api/v1/register", "",
		fmt.Sprintf(`{"machine_id":%q,"device_type":"t","firmware":"1","enrollment_secret":%q}`, machineID, secret))
}

// leaks names the files under dir holding any of secrets.
func leaks(t *testing.T, dir string, secrets ...string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, s := range secrets {
			if bytes.Contains(b, []byte(s)) {
				out = append(out, fmt.Sprintf("%s holds %q", path, s))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// Secrets from files × first start, reload and logs, through the real
// binary: a first start with every secret in a file prints none of them,
// logs none and writes none under the data directory; SIGHUP with the
// files unchanged asks for no restart; secrets rotated in their files are
// in force after SIGHUP, the old ones refused.
func TestSeamFileSecretsFirstStartReloadLogs(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	names := []string{"enrollment-secret", "admin-token", "metrics-token", "smtp-password"}
	old, next := map[string]string{}, map[string]string{}
	var args, all []string
	writeSecrets := func(values map[string]string) {
		for _, n := range names {
			f := filepath.Join(dir, n)
			// Written beside and renamed, as rotation tooling would.
			if err := os.WriteFile(f+".tmp", []byte(values[n]+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(f+".tmp", f); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, n := range names {
		old[n], next[n] = "old-"+n+"-0123456789abcdef", "new-"+n+"-0123456789abcdef"
		all = append(all, old[n], next[n])
		args = append(args, "--"+n+"-file", filepath.Join(dir, n))
	}
	writeSecrets(old)
	p := startSecretServe(t, data, nil, args...)

	if st := register(t, p.base, "seam-1", old["enrollment-secret"]); st != 200 {
		t.Errorf("register with the file's enrollment secret: %d, want 200", st)
	}
	if st := status(t, "GET", p.base+"/api/v1/devices", old["admin-token"], ""); st != 200 {
		t.Errorf("devices with the file's admin token: %d, want 200", st)
	}
	if st := status(t, "GET", p.base+"/metrics", old["metrics-token"], ""); st != 200 {
		t.Errorf("/metrics with the file's metrics token: %d, want 200", st)
	}

	// Nothing changed: nothing needs a restart.
	for _, l := range p.reload(t) {
		if strings.Contains(l, "restart") || strings.Contains(l, "level=WARN") || strings.Contains(l, "level=ERROR") {
			t.Errorf("SIGHUP with unchanged secret files logged %q", l)
		}
	}

	// Rotated in their files: in force after SIGHUP, without a restart.
	writeSecrets(next)
	for _, l := range p.reload(t) {
		if strings.Contains(l, "restart") || strings.Contains(l, "level=WARN") || strings.Contains(l, "level=ERROR") {
			t.Errorf("SIGHUP with rotated secret files logged %q", l)
		}
	}
	for _, c := range []struct {
		what string
		got  int
		want int
	}{
		{"register with the old enrollment secret", register(t, p.base, "seam-2", old["enrollment-secret"]), 403},
		{"register with the new enrollment secret", register(t, p.base, "seam-3", next["enrollment-secret"]), 200},
		{"devices with the old admin token", status(t, "GET", p.base+"/api/v1/devices", old["admin-token"], ""), 401},
		{"devices with the new admin token", status(t, "GET", p.base+"/api/v1/devices", next["admin-token"], ""), 200},
		{"/metrics with the old metrics token", status(t, "GET", p.base+"/metrics", old["metrics-token"], ""), 401},
		{"/metrics with the new metrics token", status(t, "GET", p.base+"/metrics", next["metrics-token"], ""), 200},
	} {
		if c.got != c.want {
			t.Errorf("after rotation and SIGHUP: %s: %d, want %d", c.what, c.got, c.want)
		}
	}

	out := p.stop(t)
	for _, s := range all {
		if strings.Contains(out, s) {
			t.Errorf("stdout or log holds the secret %q:\n%s", s, out)
		}
	}
	if strings.Contains(out, "generated credentials") {
		t.Errorf("nothing was generated, yet the start said so:\n%s", out)
	}
	for _, l := range leaks(t, data, all...) {
		t.Errorf("copied to disk: %s", l)
	}
	var stored map[string]string
	raw, err := os.ReadFile(filepath.Join(data, "secrets.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &stored); err != nil || stored["settings_key"] == "" || stored["enrollment_secret"] != "" || stored["admin_token"] != "" {
		t.Errorf("secrets.json %s (%v): want the settings key alone", raw, err)
	}
}

// One secret given (the admin token, by environment), the other
// generated: only the generated one is printed and kept in secrets.json.
func TestSeamFileSecretsMixedFirstStart(t *testing.T) {
	t.Parallel()
	data := t.TempDir()
	const admin = "given-admin-token-0123456789"
	p := startSecretServe(t, data, []string{"DROVER_ADMIN_TOKEN=" + admin})
	if st := status(t, "GET", p.base+"/api/v1/devices", admin, ""); st != 200 {
		t.Errorf("devices with the given admin token: %d, want 200", st)
	}
	out := p.stop(t)
	var stored map[string]string
	raw, err := os.ReadFile(filepath.Join(data, "secrets.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &stored); err != nil || stored["enrollment_secret"] == "" || stored["admin_token"] != "" {
		t.Fatalf("secrets.json %s (%v): want the generated enrollment secret and no admin token", raw, err)
	}
	if !strings.Contains(p.stdout.String(), "enrollment secret: "+stored["enrollment_secret"]) {
		t.Errorf("the generated enrollment secret was not printed: %q", p.stdout.String())
	}
	if strings.Contains(out, admin) || strings.Contains(out, "admin token:") {
		t.Errorf("stdout or log holds the given admin token:\n%s", out)
	}
	for _, l := range leaks(t, data, admin) {
		t.Errorf("copied to disk: %s", l)
	}

	// The next start generates nothing and prints nothing.
	p = startSecretServe(t, data, []string{"DROVER_ADMIN_TOKEN=" + admin})
	if st := status(t, "GET", p.base+"/api/v1/devices", admin, ""); st != 200 {
		t.Errorf("second start: devices with the given admin token: %d, want 200", st)
	}
	p.stop(t)
	if p.stdout.Len() != 0 {
		t.Errorf("second start printed %q", p.stdout.String())
	}
}
