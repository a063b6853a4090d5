package agent

import (
	"bytes"
	"crypto/tls"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/drover/drover/internal/protocol"
	"github.com/drover/drover/internal/server"
	"github.com/drover/drover/internal/server/servertest"
)

// Remote commands through the shell agent and a real server: the same
// contract as the Go agent's TestEndToEndCommands (argv, never a shell;
// the allow-list; timeouts; logs by name; reboot after its result).
func testShellAgentCommands(t *testing.T, sh shellEnv) {
	srv := startServer(t, "", "")
	dir := t.TempDir()
	logFile := filepath.Join(dir, "messages")
	os.WriteFile(logFile, []byte(strings.Repeat("old line\n", 2000)+"last\tline\x01\n"), 0o644)
	hook := filepath.Join(dir, "hook.sh")
	argsFile := filepath.Join(dir, "args")
	os.WriteFile(hook, []byte("#!/bin/sh\nfor a in \"$@\"; do echo \"[$a]\"; done > "+argsFile+"\ncat "+argsFile+
		"\necho \"id=$DROVER_DEVICE_ID\"\n[ \"$2\" = fail ] && exit 3\n[ \"$2\" = sleep ] && sleep 30\nexit 0\n"), 0o755)
	rebooted := filepath.Join(dir, "rebooted")
	a := startShellAgent(t, sh, filepath.Join(dir, "state"), "--server", srv.s.URL, "--enroll-secret", srv.s.EnrollmentSecret,
		"--ca-cert", srv.caFile, "--root", "testdata/root", "--min-backoff", "1", "--max-backoff", "2", "--timeout", "5",
		"--commands", "reboot,read-log,set-config,hook", "--command-hook", hook, "--logs", "boot=/nonexistent,messages="+logFile,
		"--reboot-command", "touch "+rebooted, "--log-level", "debug")
	var id string
	waitFor(t, 30*time.Second, "registration", func() bool {
		id = a.state()["DEVICE_ID"]
		return id != ""
	})
	send, wait := commandAPI(t, srv, id)
	r := wait(send(map[string]any{"kind": "set-config", "args": []string{"wan.mtu", "1400; touch /tmp/pwned $(id) <é>"}}))
	if r.State != "succeeded" || strings.Join(r.Output, "|") != "[set-config]|[wan.mtu]|[1400; touch /tmp/pwned $(id) <>]|id="+id {
		t.Fatalf("set-config: %+v", r)
	}
	r = wait(send(map[string]any{"kind": "hook", "args": []string{"fail", "two words"}}))
	if r.State != "failed" || r.ExitCode != 3 || r.Output[1] != "[fail]" || r.Output[2] != "[two words]" {
		t.Fatalf("hook failing: %+v", r)
	}
	r = wait(send(map[string]any{"kind": "hook", "args": []string{"sleep"}, "timeout": 1}))
	if r.State != "failed" || r.Error != "timed out after 1s" {
		t.Fatalf("hook timing out: %+v", r)
	}
	r = wait(send(map[string]any{"kind": "read-log", "args": []string{"messages"}}))
	total := 0
	for _, l := range r.Output {
		total += len(l)
	}
	if r.State != "succeeded" || r.Output[len(r.Output)-1] != "last line" || total > protocol.MaxResultOutputBytes || len(r.Output) != protocol.MaxResultOutputLines {
		t.Fatalf("read-log: %s %d lines, %d bytes, last %q", r.State, len(r.Output), total, r.Output[len(r.Output)-1])
	}
	r = wait(send(map[string]any{"kind": "read-log", "args": []string{"shadow"}}))
	if r.State != "failed" || !strings.Contains(r.Error, "no log named shadow") {
		t.Fatalf("read-log of an unconfigured log: %+v", r)
	}
	r = wait(send(map[string]any{"kind": "ping", "args": []string{"192.0.2.1"}}))
	if r.State != "failed" || !strings.Contains(r.Error, "ping is not allowed") {
		t.Fatalf("ping not in --commands: %+v", r)
	}
	// Several commands in one answer: each runs once, results in order.
	var jobs []string
	for i := range 6 {
		jobs = append(jobs, send(map[string]any{"kind": "hook", "args": []string{fmt.Sprint("n", i)}}))
	}
	for i, j := range jobs {
		if r := wait(j); r.State != "succeeded" || r.Output[1] != fmt.Sprintf("[n%d]", i) {
			t.Fatalf("command %d of 6: %+v", i, r)
		}
	}
	if n := strings.Count(a.logText(), "command ran:"); n != 12 {
		t.Errorf("%d commands ran, want 12 (each once)", n)
	}
	r = wait(send(map[string]any{"kind": "reboot"}))
	if r.State != "succeeded" || r.Output[0] != "rebooting after this result is sent" {
		t.Fatalf("reboot: %+v", r)
	}
	waitFor(t, 10*time.Second, "the reboot command", func() bool {
		_, err := os.Stat(rebooted)
		return err == nil
	})
	if ents, _ := os.ReadDir(filepath.Join(a.stateDir, "results")); len(ents) != 0 {
		t.Errorf("results left queued after the server took them: %v", ents)
	}
}

// cutProxy stands between agent and server and cuts the first firmware
// file answer after half of the bytes; it records the Range headers.
type cutProxy struct {
	mu     sync.Mutex
	ranges []string
	cut    bool
}

type cutBody struct {
	io.ReadCloser
	left int64
}

func (c *cutBody) Read(p []byte) (int, error) {
	if c.left <= 0 {
		return 0, io.ErrUnexpectedEOF
	}
	if int64(len(p)) > c.left {
		p = p[:c.left]
	}
	n, err := c.ReadCloser.Read(p)
	c.left -= int64(n)
	return n, err
}

func startCutProxy(t *testing.T, s *servertest.Server) (*cutProxy, string, string) {
	t.Helper()
	target, _ := url.Parse(s.URL)
	cp := &cutProxy{}
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.Transport = s.Client().Transport
	rp.ErrorLog = log.New(io.Discard, "", 0) // the cut is on purpose
	rp.ModifyResponse = func(resp *http.Response) error {
		if !strings.HasSuffix(resp.Request.URL.Path, "/file") {
			return nil
		}
		cp.mu.Lock()
		defer cp.mu.Unlock()
		cp.ranges = append(cp.ranges, resp.Request.Header.Get("Range"))
		if !cp.cut && resp.StatusCode == 200 {
			cp.cut = true
			resp.Body = &cutBody{ReadCloser: resp.Body, left: resp.ContentLength / 2}
		}
		return nil
	}
	hs := httptest.NewUnstartedServer(rp)
	hs.TLS = &tls.Config{}
	hs.StartTLS()
	t.Cleanup(hs.Close)
	ca := filepath.Join(t.TempDir(), "proxy-ca.pem")
	os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: hs.Certificate().Raw}), 0o644)
	return cp, hs.URL, ca
}

// A firmware update through the shell agent and a real server: upload,
// rollout, a download cut halfway and resumed with Range, SHA-256 and
// (under dash, with openssl) the ed25519 signature, the install hook,
// verification by the firmware reported afterwards. Busybox has no
// openssl: there the device has no key and signatures are not checked.
func testShellAgentFirmware(t *testing.T, sh shellEnv) {
	s := servertest.Start(t, servertest.Options{Configure: func(c *server.Config) {
		c.PushInterval, c.RolloutInterval = 1, 100*time.Millisecond
	}})
	proxy, proxyURL, proxyCA := startCutProxy(t, s)
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "fw.pub")
	img, sum, sig := signedImage(t, keyFile)
	root := copyTree(t, "testdata/root")
	flashed := filepath.Join(dir, "flashed.bin")
	args := []string{"--server", proxyURL, "--enroll-secret", s.EnrollmentSecret, "--ca-cert", proxyCA, "--root", root,
		"--device-type", "ICR-3241", "--min-backoff", "1", "--max-backoff", "2", "--timeout", "5", "--log-level", "debug",
		"--firmware-hook", fmt.Sprintf(`cp "$DROVER_FIRMWARE_FILE" %s && sed -i "s/^DISTRIB_DESCRIPTION=.*/DISTRIB_DESCRIPTION='$DROVER_FIRMWARE_VERSION'/" %s/etc/openwrt_release`,
			flashed, root)}
	withKey := sh.name == "dash"
	if withKey {
		need(t, "openssl")
		args = append(args, "--firmware-key", keyFile)
	}
	a := startShellAgent(t, sh, filepath.Join(dir, "state"), args...)
	api := adminAPI(t, s)
	waitFor(t, 30*time.Second, "the device's first push", func() bool {
		var out struct{ Devices []deviceView }
		api("GET", "/api/v1/devices?liveness=online", nil, &out)
		return len(out.Devices) == 1
	})
	if st := api("POST", "/api/v1/firmware?device_type=ICR-3241&version=7.0.0&signature="+url.QueryEscape(sig), img, nil); st != 201 {
		t.Fatalf("upload: %d", st)
	}
	if st := api("POST", "/api/v1/rollouts", []byte(`{"firmware_id":1,"waves":["1"]}`), nil); st != 201 {
		t.Fatalf("rollout: %d", st)
	}
	var ro struct {
		State  string
		Counts map[string]int
	}
	var devs struct{ Devices []map[string]any }
	waitFor(t, 60*time.Second, "the device verified", func() bool {
		api("GET", "/api/v1/rollouts/1", nil, &ro)
		return ro.Counts["verified"] == 1 || ro.Counts["failed"] == 1
	})
	api("GET", "/api/v1/rollouts/1/devices", nil, &devs)
	if ro.Counts["verified"] != 1 {
		t.Fatalf("rollout %+v, devices %v", ro, devs.Devices)
	}
	if got, _ := os.ReadFile(flashed); !bytes.Equal(got, img) {
		t.Fatalf("the hook was given %d bytes, want the %d-byte image", len(got), len(img))
	}
	if _, err := os.Stat(filepath.Join(a.stateDir, "firmware", sum+".part")); !os.IsNotExist(err) {
		t.Errorf("downloaded file left behind: %v", err)
	}
	proxy.mu.Lock()
	ranges := proxy.ranges
	proxy.mu.Unlock()
	if len(ranges) != 2 || ranges[0] != "" || !strings.HasPrefix(ranges[1], "bytes=") || ranges[1] == "bytes=0-" {
		t.Errorf("firmware requests' Range headers %q, want none, then the rest after the cut", ranges)
	}
	if st := a.state(); st["FW_ROLLOUT"] != "" {
		t.Errorf("update still in the state file: %v", st)
	}
	checked := strings.Contains(a.logText(), "firmware downloaded and checked")
	if !checked {
		t.Errorf("no check logged")
	}
	t.Logf("%s: ranges %q, signature checked: %v", sh.name, ranges, withKey)
	if !withKey {
		return
	}
	// A wrong signature: refused, reported failed with the reason.
	img2 := append(img, "v2"...)
	badSig := url.QueryEscape(sig) // the first image's
	if st := api("POST", "/api/v1/firmware?device_type=ICR-3241&version=7.0.1&signature="+badSig, img2, nil); st != 201 {
		t.Fatalf("upload: %d", st)
	}
	if st := api("POST", "/api/v1/rollouts", []byte(`{"firmware_id":2,"waves":["1"]}`), nil); st != 201 {
		t.Fatalf("rollout: %d", st)
	}
	waitFor(t, 60*time.Second, "the device failed", func() bool {
		api("GET", "/api/v1/rollouts/2/devices", nil, &devs)
		return len(devs.Devices) == 1 && devs.Devices[0]["state"] == "failed"
	})
	if r, _ := devs.Devices[0]["reason"].(string); !strings.Contains(r, "signature does not verify") {
		t.Fatalf("wrong signature: %v", devs.Devices[0])
	}
}

// The shell agent checks commands itself, as protocol.Command.Validate
// does, runs each ID once, decodes JSON escapes into argv and sends at
// most 4 results per push.
func testShellAgentCommandChecks(t *testing.T, sh shellEnv) {
	f := newFakeServer(t)
	cmds := json.RawMessage(`[{"id":1,"kind":"ping","args":["-x"],"timeout":5},
		{"id":2,"kind":"hook","args":["a\nb"],"timeout":5},
		{"id":3,"kind":"hook","args":["x"],"timeout":9999},
		{"id":4,"kind":"rm","args":[],"timeout":5},
		{"args":["a\u0026b\u003cc\u003e \"q\" \\","$(id)"],"timeout":5,"kind":"hook","id":5},
		{"id":0,"kind":"hook","timeout":5}]`)
	f.onPush = func(n int, p protocol.PushRequest) *answer {
		body := map[string]any{"push_interval": 1}
		if n <= 2 { // the second answer repeats them: none runs twice
			body["commands"] = cmds
		}
		return &answer{status: 200, body: body}
	}
	dir := t.TempDir()
	hook := filepath.Join(dir, "hook.sh")
	os.WriteFile(hook, []byte("#!/bin/sh\nfor a in \"$@\"; do echo \"[$a]\"; done\n"), 0o755)
	a := startShellAgent(t, sh, filepath.Join(dir, "state"), "--server", f.srv.URL, "--enroll-secret", "s", "--ca-cert", f.caFile,
		"--root", "testdata/root", "--command-hook", hook, "--min-backoff", "1", "--max-backoff", "2")
	var results []protocol.CommandResult
	waitFor(t, 30*time.Second, "six pushes", func() bool {
		_, pushes := f.snapshot()
		return len(pushes) >= 6
	})
	a.stop()
	_, pushes := f.snapshot()
	for i, p := range pushes {
		if len(p.req.Results) > protocol.MaxResultsPerPush {
			t.Fatalf("push %d carries %d results", i, len(p.req.Results))
		}
		results = append(results, p.req.Results...)
	}
	byID := map[uint64]protocol.CommandResult{}
	for _, r := range results {
		if _, dup := byID[r.ID]; dup {
			t.Fatalf("result of command %d sent twice", r.ID)
		}
		byID[r.ID] = r
	}
	if len(byID) != 5 || len(pushes[1].req.Results) != 4 {
		t.Fatalf("results %+v (second push: %d)", results, len(pushes[1].req.Results))
	}
	for id, want := range map[uint64]string{1: "ping: the host must be", 2: "args[0] contains control characters",
		3: "timeout must be within", 4: "kind must be one of"} {
		if r := byID[id]; r.ExitCode != -1 || !strings.HasPrefix(r.Error, "invalid command: "+want) {
			t.Errorf("command %d: %+v", id, r)
		}
	}
	if r := byID[5]; r.ExitCode != 0 || r.Error != "" || strings.Join(r.Output, "|") != `[hook]|[a&b<c> "q" \]|[$(id)]` {
		t.Errorf("command 5: %+v", r)
	}
	if n := strings.Count(a.logText(), "command ran: id=5 "); n != 1 {
		t.Errorf("command 5 ran %d times", n)
	}
}
