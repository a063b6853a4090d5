package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/creack/pty"
	"github.com/drover/drover/internal/testwait"
	"github.com/drover/drover/internal/tunnel"
	"golang.org/x/term"
)

// The remote terminal and file transfer through the real binaries: drover
// serve with a label gate and terminal recording, drover agent --connect
// with --remote-shell and --files-allow, drover terminal and drover files.
// A device without the gate's label is refused; with it, a command runs
// and its status comes back, an interactive shell runs on a real terminal
// driven through a pty (and this one is restored), a file goes up and
// comes back unchanged; a viewer, paths outside the allowed directory,
// files over the size limit and sessions over the limit are refused with
// clear messages and non-zero exits; the audit log holds every session
// with its bytes, and the recording is an asciinema file.
func TestSeamRemoteTerminalAndFiles(t *testing.T) {
	files := t.TempDir()
	r := startRemoteRig(t, []string{"--remote-shell", "/bin/sh", "--files-allow", files, "--files-max-size", "1048576"},
		"--remote-access-labels", "remote-ok", "--terminal-record", "--tunnel-max-per-device", "1")
	api := func(method, path, body string, into any) int {
		t.Helper()
		return call(t, r.client, r.base+path, r.admin, body, into)
	}
	conn := []string{"--server", r.base, "--ca-cert", r.caFile}
	drover := func(tok string, stdin io.Reader, args ...string) (string, error) {
		t.Helper()
		sub, rest := args[0], args[1:]
		if sub == "files" {
			sub, rest = "files "+rest[0], rest[1:]
		}
		cmd := exec.Command(droverBin, append(append(strings.Fields(sub), append(conn, "--token", tok)...), rest...)...)
		cmd.Stdin = stdin
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	refusedWith := func(what, out string, err error, want string) {
		t.Helper()
		if err == nil || !strings.Contains(out, want) {
			t.Errorf("%s: %v %q, want a failure saying %q", what, err, out, want)
		}
	}

	// The server's gate: the device lacks the label.
	out, err := drover(r.operator, nil, "terminal", r.dev, "--", "true")
	refusedWith("terminal to a device without the label", out, err, "remote access is not enabled for device "+r.dev)
	refusedWith("terminal to a device without the label", out, err, "(remote_access_disabled)")
	if st := api("POST", "/api/v1/labels/assign", `{"label":"remote-ok","filter":{}}`, &map[string]any{}); st != 200 {
		t.Fatalf("label: %d", st)
	}

	// A command and its status.
	if out, err := drover(r.operator, nil, "terminal", r.dev, "--", "echo", "hello-$((6*7))"); err != nil || !strings.Contains(out, "hello-42") {
		t.Fatalf("drover terminal -- echo: %v %q\n%s", err, out, r.agentLog.String())
	}
	out, err = drover(r.operator, nil, "terminal", r.dev, "--", "exit 3")
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 3 || !strings.Contains(out, "exited with status 3") {
		t.Errorf("drover terminal -- exit 3: %v %q, want exit status 3", err, out)
	}

	// An interactive shell on a terminal, this side a real one too.
	interactive(t, r, conn)

	// Files: up and back, unchanged.
	local := t.TempDir()
	payload := make([]byte, 300<<10)
	rand.Read(payload)
	src := filepath.Join(local, "payload.bin")
	os.WriteFile(src, payload, 0o600)
	want := fmt.Sprintf("%x", sha256.Sum256(payload))
	remote := filepath.Join(files, "sub-payload.bin")
	if out, err := drover(r.operator, nil, "files", "put", r.dev, src, remote); err != nil || !strings.Contains(out, want) {
		t.Fatalf("drover files put: %v %q\n%s", err, out, r.agentLog.String())
	}
	if b, err := os.ReadFile(remote); err != nil || !bytes.Equal(b, payload) {
		t.Fatalf("the device's file: %v, %d bytes", err, len(b))
	}
	back := filepath.Join(local, "back.bin")
	if out, err := drover(r.operator, nil, "files", "get", r.dev, remote, back); err != nil || !strings.Contains(out, want) {
		t.Fatalf("drover files get: %v %q", err, out)
	}
	if b, _ := os.ReadFile(back); fmt.Sprintf("%x", sha256.Sum256(b)) != want {
		t.Fatalf("the file came back changed: %d bytes", len(b))
	}

	// Refusals.
	big := filepath.Join(local, "big.bin")
	os.WriteFile(big, make([]byte, 1048577), 0o600)
	os.WriteFile(filepath.Join(files, "big-on-device.bin"), make([]byte, 1048577), 0o600)
	outside := t.TempDir()
	os.WriteFile(filepath.Join(outside, "secret"), []byte("no"), 0o600)
	os.Symlink(outside, filepath.Join(files, "link"))
	for _, tc := range []struct {
		what string
		tok  string
		args []string
		want string
	}{
		{"a viewer's terminal", r.viewer, []string{"terminal", r.dev, "--", "true"}, "your role may not do this (forbidden)"},
		{"a viewer's download", r.viewer, []string{"files", "get", r.dev, remote, filepath.Join(local, "v")}, "your role may not do this (forbidden)"},
		{"an upload outside the directory", r.operator, []string{"files", "put", r.dev, src, filepath.Join(outside, "x")}, "not under a directory of this device's --files-allow (" + files + ") (path_not_allowed)"},
		{"a download through a link out of it", r.operator, []string{"files", "get", r.dev, filepath.Join(files, "link", "secret"), filepath.Join(local, "s")}, "(path_not_allowed)"},
		{"a download with ..", r.operator, []string{"files", "get", r.dev, files + "/../" + filepath.Base(outside) + "/secret", filepath.Join(local, "s")}, "(path_not_allowed)"},
		{"an upload over the size limit", r.operator, []string{"files", "put", r.dev, big, filepath.Join(files, "big.bin")}, "over this device's --files-max-size of 1048576 bytes (file_too_large)"},
		{"a download over the size limit", r.operator, []string{"files", "get", r.dev, filepath.Join(files, "big-on-device.bin"), filepath.Join(local, "b")}, "(file_too_large)"},
		{"a download of a missing file", r.operator, []string{"files", "get", r.dev, filepath.Join(files, "nope"), filepath.Join(local, "n")}, "(file_not_found)"},
	} {
		out, err := drover(tc.tok, nil, tc.args...)
		refusedWith(tc.what, out, err, tc.want)
	}
	if _, err := os.Stat(filepath.Join(files, "big.bin")); !os.IsNotExist(err) {
		t.Errorf("a refused upload left a file: %v", err)
	}
	if _, err := os.Stat(filepath.Join(local, "v")); !os.IsNotExist(err) {
		t.Errorf("a refused download left a file: %v", err)
	}

	// Over the session limit (1 per device): one terminal held open.
	pool := x509.NewCertPool()
	pem, _ := os.ReadFile(r.caFile)
	pool.AppendCertsFromPEM(pem)
	c := &tunnel.Client{Server: r.base, Token: r.operator, TLS: &tls.Config{RootCAs: pool}}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var held *websocket.Conn
	testwait.For(t, 10*time.Second, "a terminal once the last session's slot is free", func() bool {
		held, err = c.Terminal(ctx, r.dev, tunnel.TerminalOptions{Cols: 80, Rows: 24})
		return err == nil
	})
	out, err = drover(r.operator, nil, "files", "put", r.dev, src, filepath.Join(files, "third.bin"))
	refusedWith("an upload over the session limit", out, err, "(tunnel_limit)")
	held.CloseNow()

	// The audit log: each session's kind, bytes and end.
	var audit struct {
		Entries []struct {
			Actor, Action, Object string
			After                 map[string]any
		}
	}
	testwait.For(t, 10*time.Second, "the sessions' ends in the audit log", func() bool {
		audit.Entries = nil
		api("GET", "/api/v1/audit?action=shell+end", "", &audit)
		return len(audit.Entries) >= 4
	})
	for _, e := range audit.Entries {
		if e.Actor != "olga" || e.Object != "/api/v1/devices/"+r.dev || e.After["kind"] != "shell" || e.After["end_reason"] != "closed" ||
			e.After["bytes_from_device"] == nil || e.After["recording"] == nil {
			t.Errorf("shell end row %+v", e)
		}
	}
	testwait.For(t, 10*time.Second, "the transfers' ends in the audit log", func() bool {
		audit.Entries = nil
		api("GET", "/api/v1/audit?action=file+end", "", &audit)
		return len(audit.Entries) >= 2
	})
	if len(audit.Entries) != 2 {
		t.Fatalf("file end rows: %+v", audit.Entries)
	}
	for _, e := range audit.Entries {
		n := e.After["bytes_to_device"].(float64) + e.After["bytes_from_device"].(float64)
		if e.After["kind"] != "file" || e.After["path"] != remote || n != float64(len(payload)) || e.After["end_reason"] != "closed" {
			t.Errorf("file end row %+v", e)
		}
	}
	audit.Entries = nil
	api("GET", "/api/v1/audit?action=file+refused", "", &audit)
	codes := map[string]bool{}
	for _, e := range audit.Entries {
		codes[fmt.Sprint(e.After["end_reason"])] = true
	}
	for _, c := range []string{"refused: path_not_allowed", "refused: file_too_large", "refused: tunnel_limit"} {
		if !codes[c] {
			t.Errorf("no file refused row with %q: %v", c, codes)
		}
	}

	// The recordings: asciinema v2, the command's output in one of them.
	casts, _ := filepath.Glob(filepath.Join(r.data, "recordings", "*.cast"))
	found := false
	for _, f := range casts {
		b, _ := os.ReadFile(f)
		if !strings.HasPrefix(string(b), `{"env":{"TERM":"xterm-256color"},"height":`) || !strings.Contains(string(b), `"version":2`) {
			t.Errorf("%s: not an asciinema v2 file: %.200s", f, b)
		}
		found = found || strings.Contains(string(b), `"o","hello-42`)
	}
	if len(casts) < 4 || !found {
		t.Errorf("recordings %v: want one per terminal, one with the command's output", casts)
	}
}

// interactive drives drover terminal on a pty: the shell's own terminal
// answers, a command's output comes back, exit ends it, and the local
// terminal's mode is what it was.
func interactive(t *testing.T, r *tunnelRig, conn []string) {
	ptmx, tty, err := pty.Open()
	if err != nil {
		t.Skipf("no pty here: %v", err)
	}
	defer ptmx.Close()
	defer tty.Close()
	pty.Setsize(ptmx, &pty.Winsize{Cols: 100, Rows: 30})
	before, err := term.GetState(int(tty.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(droverBin, append(append([]string{"terminal"}, conn...), "--token", r.operator, r.dev)...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = tty, tty, tty
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var seen testwait.Buffer
	go io.Copy(&seen, ptmx)
	// The device's shell sees a terminal of this one's size.
	ptmx.Write([]byte("echo size=$(stty size) tty=$(tty)\r"))
	testwait.For(t, 20*time.Second, "the remote shell's answer", func() bool {
		return strings.Contains(seen.String(), "size=30 100 tty=/dev/")
	})
	ptmx.Write([]byte("exit 0\r"))
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("drover terminal: %v\n%s", err, seen.String())
		}
	case <-time.After(20 * time.Second):
		cmd.Process.Kill()
		t.Fatalf("drover terminal did not end after exit:\n%s", seen.String())
	}
	after, err := term.GetState(int(tty.Fd()))
	if err != nil || !reflect.DeepEqual(before, after) {
		t.Errorf("the terminal's mode was not restored: %v", err)
	}
}
