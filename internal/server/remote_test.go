package server_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/drover/drover/internal/server"
	"github.com/drover/drover/internal/server/servertest"
	"github.com/drover/drover/internal/testwait"
	"github.com/drover/drover/internal/tunnel"
	"github.com/hashicorp/yamux"
)

// TestRemoteLabelGateAndOldAgents: with -remote-access-labels, a device
// without one of the labels is refused every kind of remote session
// (403 remote_access_disabled) before the server asks it for anything;
// with the label, a terminal asked of an agent from before terminals
// (which takes the request for a tunnel and refuses it) answers 501
// not_supported, and the agent got the terminal's size.
func TestRemoteLabelGateAndOldAgents(t *testing.T) {
	s := servertest.Start(t, servertest.Options{Configure: func(c *server.Config) {
		c.Tunnel.Open = 5 * time.Second
		c.RemoteAccessLabels = "remote, lab"
	}})
	c := &client{t: t, s: s, url: s.URL}
	id, token := c.register("m-remote-gate")
	msgs := connectedMessages(t, s, token)
	dev := "/api/v1/devices/" + id
	for _, path := range []string{dev + "/terminal", dev + "/files?path=/etc/hosts", dev + "/tunnel?to=127.0.0.1:22"} {
		st, _, out := c.do("GET", path, s.AdminToken, nil)
		e, _ := out["error"].(map[string]any)
		if st != 403 || e["code"] != "remote_access_disabled" || !strings.Contains(e["message"].(string), "remote, lab") {
			t.Errorf("GET %s without the label: %d %v", path, st, out)
		}
	}
	if st, _, out := c.do("PUT", dev+"/files?path=/tmp/x", s.AdminToken, "abc"); st != 403 {
		t.Errorf("PUT files without the label: %d %v", st, out)
	}
	select {
	case m := <-msgs:
		t.Fatalf("the server asked a gated device for %q", m)
	default:
	}

	if st, _, out := c.do("POST", "/api/v1/labels/assign", s.AdminToken, map[string]any{"label": "lab", "filter": map[string]any{}}); st != 200 {
		t.Fatalf("label: %d %v", st, out)
	}
	type answer struct {
		st  int
		out map[string]any
	}
	done := make(chan answer, 1)
	go func() {
		st, _, out := c.do("GET", dev+"/terminal?cols=120&rows=40", s.AdminToken, nil)
		done <- answer{st, out}
	}()
	st := acceptStream(t, s, token, msgs)
	// What an agent from before terminals sees and answers: a tunnel
	// request with no destination, refused.
	var req struct {
		To         string
		Check      bool
		Kind       string
		Cols, Rows int
	}
	if err := tunnel.ReadLine(st, &req); err != nil || req.Kind != "shell" || !req.Check || req.To != "" || req.Cols != 120 || req.Rows != 40 {
		t.Fatalf("request %+v, %v", req, err)
	}
	tunnel.WriteLine(st, tunnel.Answer{Error: tunnel.CodeOff, Message: "tunnels are off on this device (no --tunnel-allow)"})
	a := <-done
	if e, _ := a.out["error"].(map[string]any); a.st != 501 || e["code"] != "not_supported" || !strings.Contains(e["message"].(string), "update it") {
		t.Fatalf("terminal on an old agent: %d %v", a.st, a.out)
	}
}

// connectedMessages holds the device's persistent connection and passes on
// what the server writes on it, until it ends.
func connectedMessages(t *testing.T, s *servertest.Server, token string) <-chan string {
	ws := dialConnect(t, s, token)
	waitMetric(t, s, "drover_device_connections", 1)
	msgs := make(chan string, 8)
	go func() {
		for {
			_, m, err := ws.Read(context.Background())
			if err != nil {
				close(msgs)
				return
			}
			msgs <- string(m)
		}
	}()
	return msgs
}

// TestRemoteShellIdleAndFrames: a terminal carries input, window changes
// and output as frames on the device's stream, and the session's idle
// limit ends it (1001 idle_timeout to the operator, the audit row with
// its bytes and reason), as it ends a tunnel.
func TestRemoteShellIdleAndFrames(t *testing.T) {
	s := servertest.Start(t, servertest.Options{Configure: func(c *server.Config) { c.Tunnel.Idle = time.Second }})
	c := &client{t: t, s: s, url: s.URL}
	id, token := c.register("m-remote-idle")
	msgs := connectedMessages(t, s, token)
	type dialed struct {
		ws  *websocket.Conn
		err error
	}
	opened := make(chan dialed, 1)
	op := tunnelClient(s, s.AdminToken)
	go func() {
		ws, err := op.Terminal(context.Background(), id, tunnel.TerminalOptions{Cols: 90, Rows: 30})
		opened <- dialed{ws, err}
	}()
	st := acceptStream(t, s, token, msgs)
	var req tunnel.Request
	if err := tunnel.ReadLine(st, &req); err != nil || req.Kind != tunnel.KindShell || req.Check || req.Cols != 90 || req.Rows != 30 {
		t.Fatalf("request %+v, %v", req, err)
	}
	tunnel.WriteLine(st, tunnel.Answer{})
	d := <-opened
	if d.err != nil {
		t.Fatal(d.err)
	}
	ctx := context.Background()
	d.ws.Write(ctx, websocket.MessageBinary, []byte("ls\r"))
	d.ws.Write(ctx, websocket.MessageText, []byte(`{"type":"resize","cols":120,"rows":50}`))
	buf := make([]byte, tunnel.MaxFrame)
	if typ, p, err := tunnel.ReadFrame(st, buf); err != nil || typ != tunnel.FrameData || string(p) != "ls\r" {
		t.Fatalf("input frame %c %q %v", typ, p, err)
	}
	if typ, p, err := tunnel.ReadFrame(st, buf); err != nil || typ != tunnel.FrameWindow {
		t.Fatalf("window frame %c %v", typ, err)
	} else if cols, rows, _ := tunnel.ParseWindow(p); cols != 120 || rows != 50 {
		t.Fatalf("window %dx%d", cols, rows)
	}
	tunnel.WriteFrame(st, tunnel.FrameData, []byte("a.txt\r\n"))
	if typ, m, err := d.ws.Read(ctx); err != nil || typ != websocket.MessageBinary || string(m) != "a.txt\r\n" {
		t.Fatalf("output %v %q %v", typ, m, err)
	}
	start := time.Now()
	_, _, err := d.ws.Read(ctx)
	if websocket.CloseStatus(err) != websocket.StatusGoingAway || !strings.Contains(err.Error(), "idle_timeout") || time.Since(start) < 900*time.Millisecond {
		t.Fatalf("after a second without a byte: %v after %v", err, time.Since(start))
	}
	var entries []any
	testwait.For(t, 5*time.Second, "the shell's end in the audit log", func() bool {
		_, _, out := c.do("GET", "/api/v1/audit?action=shell+end", s.AdminToken, nil)
		entries, _ = out["entries"].([]any)
		return len(entries) == 1
	})
	if a := entries[0].(map[string]any)["after"].(map[string]any); a["end_reason"] != "idle_timeout" || a["bytes_to_device"] != float64(3) || a["bytes_from_device"] != float64(7) || a["kind"] != "shell" {
		t.Fatalf("audit row %v", a)
	}
}

// acceptStream is the agent's side of the server's first stream: it waits
// for the server's request for the link on msgs, opens the link and
// accepts the stream (the link closes when the test ends).
func acceptStream(t *testing.T, s *servertest.Server, token string, msgs <-chan string) *yamux.Stream {
	t.Helper()
	if m := <-msgs; m != `{"type":"tunnel"}` {
		t.Fatalf("message %q, want the tunnel request", m)
	}
	lw, _, err := dialLink(s, token)
	if err != nil {
		t.Fatal(err)
	}
	sess, err := yamux.Server(websocket.NetConn(context.Background(), lw, websocket.MessageBinary), tunnel.SessionConfig())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sess.Close() })
	st, err := sess.AcceptStream()
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// TestRemoteAccessByConfiguration: /drover/remote_access in a device's
// effective configuration enables or disables remote access at run time,
// per device (its own values) or group (a label's values), over the
// server's -remote-access-labels; the refusal names the layer, and a
// refused session is audited.
func TestRemoteAccessByConfiguration(t *testing.T) {
	s := servertest.Start(t, servertest.Options{Configure: func(c *server.Config) { c.RemoteAccessLabels = "lab" }})
	c := &client{t: t, s: s, url: s.URL}
	id, _ := c.register("m-remote-config")
	dev := "/api/v1/devices/" + id
	// The device holds no connection: a session past the gate answers 409
	// connect_requested.
	expect := func(what, code, msg string) {
		t.Helper()
		st, _, out := c.do("GET", dev+"/terminal", s.AdminToken, nil)
		e, _ := out["error"].(map[string]any)
		m, _ := e["message"].(string)
		if e["code"] != code || !strings.Contains(m, msg) || (code == "remote_access_disabled") != (st == 403) {
			t.Errorf("%s: %d %v, want %s saying %q", what, st, out, code, msg)
		}
	}
	put := func(path string, body any) {
		t.Helper()
		if st, _, out := c.do("PUT", path, s.AdminToken, body); st != 200 {
			t.Fatalf("PUT %s: %d %v", path, st, out)
		}
	}
	expect("no configuration, no label", "remote_access_disabled", "-remote-access-labels names (lab)")
	if st, _, out := c.do("POST", "/api/v1/labels/assign", s.AdminToken, map[string]any{"label": "north", "filter": map[string]any{}}); st != 200 {
		t.Fatalf("label: %d %v", st, out)
	}
	put("/api/v1/labels/north/config", map[string]any{"values": map[string]any{"drover": map[string]any{"remote_access": true}}})
	expect("enabled by its label", "connect_requested", "")
	put(dev+"/config", map[string]any{"values": map[string]any{"drover": map[string]any{"remote_access": false}}})
	expect("disabled by its own values", "remote_access_disabled", "remote access is disabled for device "+id+" by its configuration: /drover/remote_access is not true (set by the device's own values)")
	if st, _, out := c.do("PUT", dev+"/files?path=/tmp/x", s.AdminToken, "abc"); st != 403 {
		t.Errorf("upload to a disabled device: %d %v", st, out)
	}
	_, _, out := c.do("GET", "/api/v1/audit?action=file+refused", s.AdminToken, nil)
	if e, _ := out["entries"].([]any); len(e) != 1 || e[0].(map[string]any)["after"].(map[string]any)["end_reason"] != "refused: remote_access_disabled" {
		t.Errorf("audit of the refused upload: %v", out)
	}
	if st, _, out := c.do("DELETE", dev+"/config", s.AdminToken, nil); st != 200 && st != 204 {
		t.Fatalf("DELETE device config: %d %v", st, out)
	}
	expect("enabled by its label again", "connect_requested", "")
	put("/api/v1/labels/north/config", map[string]any{"values": map[string]any{"drover": map[string]any{"remote_access": "yes"}}})
	expect("not a boolean", "remote_access_disabled", "(set by label north)")
}

// TestRemoteConnectOnDemand: a session to a device holding no persistent
// connection asks it to open one in the answer to its next push
// ("connect"); when that push is not due within the open timeout the
// operator gets 409 connect_requested with Retry-After at once, and the
// device is no longer asked once connected. When the push is due within
// it, the session waits for the connection and goes on.
func TestRemoteConnectOnDemand(t *testing.T) {
	s := servertest.Start(t, servertest.Options{Configure: func(c *server.Config) { c.Tunnel.Open = 5 * time.Second }})
	c := &client{t: t, s: s, url: s.URL}
	id, token := c.register("m-remote-demand")
	seq := 0
	push := func(c *client, token string) map[string]any {
		t.Helper()
		seq++
		st, _, out := c.do("POST", "/api/v1/push", token, fmt.Sprintf(`{"seq":%d,"config_version":0,"state":{}}`, seq))
		if st != 200 {
			t.Fatalf("push: %d %v", st, out)
		}
		return out
	}
	if out := push(c, token); out["connect"] != nil {
		t.Errorf("push answer before any session: %v", out)
	}
	start := time.Now()
	st, h, out := c.do("GET", "/api/v1/devices/"+id+"/terminal", s.AdminToken, nil)
	if st != 409 || errCode(out) != "connect_requested" || h.Get("Retry-After") != "205" || time.Since(start) > 2*time.Second {
		t.Fatalf("session to a device without connection, next push in 200 s: %d %v Retry-After %q after %v", st, out, h.Get("Retry-After"), time.Since(start))
	}
	if out := push(c, token); out["connect"] != float64(300) {
		t.Fatalf("push answer after a session was asked for: %v, want connect 300", out)
	}
	connectedMessages(t, s, token)
	if out := push(c, token); out["connect"] != nil {
		t.Errorf("push answer once connected: %v", out)
	}

	// Pushing every second: the session waits for the connection.
	s2 := servertest.Start(t, servertest.Options{Configure: func(c *server.Config) { c.Tunnel.Open = 10 * time.Second; c.PushInterval = 1 }})
	c2 := &client{t: t, s: s2, url: s2.URL}
	id2, token2 := c2.register("m-remote-demand-wait")
	push(c2, token2)
	done := make(chan error, 1)
	go func() { done <- tunnelClient(s2, s2.AdminToken).Check(context.Background(), id2, "127.0.0.1:22") }()
	if !testwait.Until(10*time.Second, func() bool { return push(c2, token2)["connect"] != nil }) {
		t.Fatal("no push answer asked the device to connect")
	}
	msgs := connectedMessages(t, s2, token2)
	str := acceptStream(t, s2, token2, msgs)
	var req tunnel.Request
	if err := tunnel.ReadLine(str, &req); err != nil || req.To != "127.0.0.1:22" || !req.Check {
		t.Fatalf("request %+v, %v", req, err)
	}
	tunnel.WriteLine(str, tunnel.Answer{})
	if err := <-done; err != nil {
		t.Fatalf("the waiting session: %v", err)
	}
}
