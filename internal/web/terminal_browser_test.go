package web_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
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
// audit log holds. The page keeps the dashboard's Content-Security-Policy
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
	cfg.Connect, cfg.RemoteShell = true, "/bin/sh"
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
	p := slices.DeleteFunc(problems(), func(p string) bool { return strings.Contains(p, "status of 403") }) // the refused download
	if len(p) > 0 {
		t.Fatalf("the browser reported problems (CSP violations or script errors):\n%s", strings.Join(p, "\n"))
	}
}
