package web_test

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/input"
	"github.com/chromedp/chromedp"

	"github.com/drover/drover/internal/agent"
	"github.com/drover/drover/internal/server"
	"github.com/drover/drover/internal/server/servertest"
	"github.com/drover/drover/internal/testwait"
	"github.com/drover/drover/internal/tunnel"
)

// The device page's terminal in headless chromium: an agent with
// --remote-shell connected, an operator logs in, opens the terminal,
// types a command and sees its output; exit ends the session, which the
// audit log holds. The page's file forms download a file and upload one
// chosen in the picker, and show the refusals' reasons. The page keeps the dashboard's Content-Security-Policy
// without a single violation.
func TestBrowserTerminal(t *testing.T) {
	chrome := findChromium(t)
	srv := servertest.Start(t, servertest.Options{Configure: func(c *server.Config) { c.TerminalRecord = true }})
	dir := t.TempDir()
	ca := filepath.Join(dir, "ca.pem")
	os.WriteFile(ca, srv.CACertPEM, 0o600)
	cfg := agent.DefaultConfig()
	var err error
	var a *agent.Agent
	cfg.Server, cfg.EnrollSecret, cfg.TLS.CACert = srv.URL, srv.EnrollmentSecret, ca
	cfg.StateDir, cfg.MachineID, cfg.Root = filepath.Join(dir, "state"), "browser-terminal", "../agent/testdata/root"
	cfg.Connect, cfg.RemoteShell, cfg.FilesMaxSize = true, "/bin/sh", 2<<20
	files := t.TempDir()
	os.WriteFile(filepath.Join(files, "network"), []byte("config interface 'lan'\n"), 0o600)
	if cfg.FilesAllow, err = tunnel.ParseFileRoots(files); err != nil {
		t.Fatal(err)
	}
	a, err = agent.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	actx, stop := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { a.Run(actx); close(ran) }()
	t.Cleanup(func() { stop(); <-ran; a.Close() })

	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(srv.CACertPEM)
	hc := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	get := func(path string, into any) int {
		req, _ := http.NewRequest("GET", srv.URL+path, nil)
		req.Header.Set("Authorization", "Bearer "+srv.AdminToken)
		resp, err := hc.Do(req)
		if err != nil {
			return 0
		}
		defer resp.Body.Close()
		json.NewDecoder(resp.Body).Decode(into)
		return resp.StatusCode
	}
	testwait.For(t, 30*time.Second, "the agent's persistent connection", func() bool {
		return get("/api/v1/devices/1/terminal", &map[string]any{}) == 200
	})

	ctx, problems := startBrowser(t, chrome, 60*time.Second)
	do := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(ctx, steps...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	screen := func() string {
		v, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`(document.querySelector("#terminal .xterm-rows") || {}).textContent || ""`))
		return v
	}
	status := func() string {
		v, _ := chromedp.Run(ctx, chromedp.Text(chromedp.ID("terminal-status")))
		return v
	}
	do("log in", chromedp.Navigate(srv.URL+"/ui/login"), chromedp.WaitVisible(chromedp.ID("password")),
		chromedp.SendKeys(chromedp.ID("password"), srv.AdminToken), chromedp.Submit(chromedp.ID("login")), chromedp.WaitVisible(chromedp.ID("status")))
	do("device page", chromedp.Navigate(srv.URL+"/ui/devices/1"), chromedp.WaitVisible(chromedp.ID("terminal-open")))
	do("open the terminal", chromedp.Click(chromedp.ID("terminal-open")))
	testwait.For(t, 20*time.Second, "the terminal connected", func() bool { return strings.HasPrefix(status(), "Connected") })
	// Typed text arrives as an input event (as from a keyboard's input
	// method), Enter as a key: chromium's synthetic key events for
	// printable keys reach xterm.js twice.
	typeLine := func(line string) chromedp.Action[chromedp.Void] {
		return chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
			if _, err := cdp.Call(ctx, t, input.InsertText, input.InsertTextParams{Text: line}); err != nil {
				return err
			}
			_, err := chromedp.KeyEvent("\r")(ctx, t)
			return err
		})
	}
	do("type a command", chromedp.Focus(chromedp.CSS("#terminal .xterm-helper-textarea")), typeLine("echo from-the-browser-$((40+2))"))
	if !testwait.Until(20*time.Second, func() bool { return strings.Contains(screen(), "from-the-browser-42") }) {
		t.Fatalf("the command's output is not on the terminal; it shows %q (%s)", screen(), status())
	}
	do("exit", typeLine("exit 0"))
	testwait.For(t, 20*time.Second, "the session's end on the page", func() bool { return strings.Contains(status(), "exited with status 0") })

	var audit struct {
		Entries []struct {
			Action string
			After  map[string]any
		}
	}
	testwait.For(t, 10*time.Second, "the session's end in the audit log", func() bool {
		return get("/api/v1/audit?action=shell+end", &audit) == 200 && len(audit.Entries) == 1
	})
	if e := audit.Entries[0].After; e["kind"] != "shell" || e["exit_status"] != float64(0) || e["bytes_to_device"].(float64) < 20 {
		t.Errorf("audit row %v", e)
	}
	// The page's download form: the file's bytes with the session's
	// cookie, a path outside the agent's directory refused with its
	// reason.
	do("download form", chromedp.WaitVisible(chromedp.ID("files-download")))
	fetch := func(path string) string {
		v, err := chromedp.Run(ctx, chromedp.Evaluate[string](`(function () { var x = new XMLHttpRequest(); `+
			`x.open("GET", document.querySelector("#filescard form").action + "?path=" + encodeURIComponent(`+strconv.Quote(path)+`), false); `+
			`x.send(); return x.status + " " + x.responseText; })()`))
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	if got := fetch(filepath.Join(files, "network")); got != "200 config interface 'lan'\n" {
		t.Errorf("download: %q", got)
	}
	if got := fetch("/etc/passwd"); !strings.HasPrefix(got, "403 ") || !strings.Contains(got, "path_not_allowed") {
		t.Errorf("download outside --files-allow: %q", got)
	}

	// The page's upload form: a file chosen in the picker arrives whole
	// (the page shows the device's SHA-256, the file on the device has
	// it); a path outside the agent's directory and a file over its size
	// limit are refused with their reasons.
	var sent string // the SHA-256 of the last file chosen
	upload := func(name string, size int, dest string) string {
		t.Helper()
		local := filepath.Join(t.TempDir(), name)
		b := make([]byte, size)
		rand.Read(b)
		os.WriteFile(local, b, 0o600)
		h := sha256.Sum256(b)
		sent = hex.EncodeToString(h[:])
		do("choose "+name, chromedp.SetUploadFiles(chromedp.ID("upload-file"), []string{local}),
			chromedp.SetValue(chromedp.ID("upload-path"), dest))
		if _, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.getElementById("upload-status").textContent = ""`)); err != nil {
			t.Fatal(err)
		}
		do("upload "+name, chromedp.Click(chromedp.ID("upload-send")))
		var got string
		testwait.For(t, 20*time.Second, "the upload's outcome on the page", func() bool {
			v, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.getElementById("upload-status").textContent`))
			got = v
			return strings.HasPrefix(v, "Uploaded") || strings.HasPrefix(v, "The upload failed")
		})
		return got
	}
	sum := func(path string) string {
		b, err := os.ReadFile(path)
		if err != nil {
			return err.Error()
		}
		h := sha256.Sum256(b)
		return hex.EncodeToString(h[:])
	}
	got := upload("app.conf", 1<<20, files+"/")
	if on := sum(filepath.Join(files, "app.conf")); on != sent || got != "Uploaded to "+filepath.Join(files, "app.conf")+": 1048576 bytes, SHA-256 "+sent+"." {
		t.Errorf("upload of a file with SHA-256 %s: the page says %q; the file on the device has %s", sent, got, on)
	}
	if got := upload("passwd", 100, "/etc/passwd"); !strings.Contains(got, "not under a directory of this device's --files-allow") || !strings.Contains(got, "(path_not_allowed)") {
		t.Errorf("upload outside --files-allow: the page says %q", got)
	}
	if got := upload("big.bin", 3<<20, files+"/"); !strings.Contains(got, "(file_too_large)") {
		t.Errorf("upload over --files-max-size: the page says %q", got)
	}
	if _, err := os.Stat(filepath.Join(files, "big.bin")); err == nil {
		t.Error("the file over the limit was written")
	}
	// A PUT without the session's CSRF token changes nothing.
	v, err := chromedp.Run(ctx, chromedp.Evaluate[string](`(function () { var x = new XMLHttpRequest(); `+
		`x.open("PUT", document.getElementById("upload").getAttribute("data-path") + "?path=" + encodeURIComponent(`+strconv.Quote(filepath.Join(files, "forged"))+`), false); `+
		`x.send("forged"); return x.status + " " + x.responseText; })()`))
	if err != nil || !strings.HasPrefix(v, "403 ") || !strings.Contains(v, "CSRF") {
		t.Errorf("an upload without the CSRF token: %q %v", v, err)
	}
	if _, err := os.Stat(filepath.Join(files, "forged")); err == nil {
		t.Error("an upload without the CSRF token was written")
	}
	p := slices.DeleteFunc(problems(), func(p string) bool {
		return strings.Contains(p, "status of 403") || strings.Contains(p, "status of 413") // the refused transfers
	})
	if len(p) > 0 {
		t.Fatalf("the browser reported problems (CSP violations or script errors):\n%s", strings.Join(p, "\n"))
	}
}
