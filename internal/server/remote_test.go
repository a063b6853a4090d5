package server_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/drover/drover/internal/server"
	"github.com/drover/drover/internal/server/servertest"
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
	defer sess.Close()
	st, err := sess.AcceptStream()
	if err != nil {
		t.Fatal(err)
	}
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
