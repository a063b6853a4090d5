package server_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/drover/drover/internal/server"
	"github.com/drover/drover/internal/server/servertest"
	"github.com/drover/drover/internal/tunnel"
	"github.com/hashicorp/yamux"
)

func tunnelClient(s *servertest.Server, token string) *tunnel.Client {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(s.CACertPEM)
	return &tunnel.Client{Server: s.URL, Token: token, TLS: &tls.Config{RootCAs: pool}}
}

func tunnelCode(err error) string {
	var e *tunnel.APIError
	if errors.As(err, &e) {
		return e.Code
	}
	if err != nil {
		return err.Error()
	}
	return ""
}

// dialLink opens a device's tunnel link as an agent would.
func dialLink(s *servertest.Server, token string) (*websocket.Conn, *http.Response, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return websocket.Dial(ctx, "wss://"+strings.TrimPrefix(s.URL, "https://")+tunnel.PathLink,
		&websocket.DialOptions{HTTPClient: s.Client(), HTTPHeader: http.Header{"Authorization": {"Bearer " + token}}})
}

// TestTunnelOldAgentsAndStrayDevices: a device without its persistent
// connection gets 409; an agent that does not know tunnels ignores the
// server's request, which then ends in 504, and its nudges go on working;
// a link the server did not ask for is refused; a link on which the
// device opens a stream toward the operator is closed.
func TestTunnelOldAgentsAndStrayDevices(t *testing.T) {
	s := servertest.Start(t, servertest.Options{Configure: func(c *server.Config) { c.Tunnel.Open = time.Second }})
	c := &client{t: t, s: s, url: s.URL}
	id, token := c.register("m-tunnel-old")
	op := tunnelClient(s, s.AdminToken)
	ctx := context.Background()
	if err := op.Check(ctx, id, "127.0.0.1:22"); tunnelCode(err) != "connect_requested" {
		t.Fatalf("no connection: %v", err)
	}
	blockedID, _ := c.register("m-tunnel-blocked")
	if st, _, out := c.do("POST", "/api/v1/devices/"+blockedID+"/block", s.AdminToken, nil); st != 200 {
		t.Fatalf("block: %d %v", st, out)
	}
	if err := op.Check(ctx, blockedID, "127.0.0.1:22"); tunnelCode(err) != "device_not_active" || !strings.Contains(err.Error(), "blocked") {
		t.Fatalf("blocked device: %v", err)
	}

	msgs := connectedMessages(t, s, token)
	start := time.Now()
	if err := op.Check(ctx, id, "127.0.0.1:22"); tunnelCode(err) != "device_no_tunnel" || time.Since(start) < 900*time.Millisecond {
		t.Fatalf("an agent that ignores the request: %v after %v", err, time.Since(start))
	}
	if m := <-msgs; m != `{"type":"tunnel"}` {
		t.Fatalf("message %q, want the tunnel request", m)
	}
	if st, _, out := c.do("POST", "/api/v1/commands", s.AdminToken, map[string]any{"kind": "reboot", "device_id": id}); st != 201 {
		t.Fatalf("command: %d %v", st, out)
	}
	select {
	case m := <-msgs:
		if m != `{"type":"push"}` {
			t.Fatalf("message %q, want a nudge", m)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no nudge after the tunnel request")
	}

	// Not asked: refused.
	_, token2 := c.register("m-tunnel-stray")
	if _, resp, err := dialLink(s, token2); err == nil || resp == nil || resp.StatusCode != http.StatusConflict {
		t.Fatalf("unasked link: %v", err)
	}
	if _, resp, err := dialLink(s, "wrong"); err == nil || resp == nil || resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("link with a wrong token: %v", err)
	}

	// Asked, opened, and the device opens a stream: the link ends.
	checked := make(chan error, 1)
	go func() { checked <- op.Check(ctx, id, "127.0.0.1:22") }()
	if m := <-msgs; m != `{"type":"tunnel"}` {
		t.Fatalf("message %q, want the tunnel request", m)
	}
	lw, _, err := dialLink(s, token)
	if err != nil {
		t.Fatal(err)
	}
	nc := websocket.NetConn(context.Background(), lw, websocket.MessageBinary)
	sess, err := yamux.Server(nc, tunnel.SessionConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	st, err := sess.AcceptStream()
	if err != nil {
		t.Fatal(err)
	}
	var req tunnel.Request
	if err := tunnel.ReadLine(st, &req); err != nil || req.To != "127.0.0.1:22" || !req.Check {
		t.Fatalf("request %+v, %v", req, err)
	}
	tunnel.WriteLine(st, tunnel.Answer{Error: tunnel.CodeNotAllowed, Message: "no"})
	if err := <-checked; tunnelCode(err) != "destination_not_allowed" {
		t.Fatalf("refused by the device: %v", err)
	}
	if s, err := sess.OpenStream(); err == nil {
		s.Write([]byte("hello operator"))
	}
	select {
	case <-sess.CloseChan():
	case <-time.After(10 * time.Second):
		t.Fatal("the server kept a link on which the device opened a stream")
	}
}
