package server_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/drover/drover/internal/server/servertest"
	"github.com/drover/drover/internal/testwait"
)

func dialConnect(t *testing.T, s *servertest.Server, token string) *websocket.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ws, _, err := websocket.Dial(ctx, "wss://"+strings.TrimPrefix(s.URL, "https://")+"/api/v1/connect",
		&websocket.DialOptions{HTTPClient: s.Client(), HTTPHeader: http.Header{"Authorization": {"Bearer " + token}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ws.CloseNow() })
	return ws
}

// TestConnectNudgesPingsReplacesAndStops: the persistent connection is a
// real WebSocket: a command is announced at once, pings are answered, a
// newer connection of the device replaces the older one (1008) and a
// stopping server closes it (1001).
func TestConnectNudgesPingsReplacesAndStops(t *testing.T) {
	s := servertest.Start(t, servertest.Options{})
	c := &client{t: t, s: s, url: s.URL}
	id, token := c.register("m-conn")
	ws := dialConnect(t, s, token)
	waitMetric(t, s, "drover_device_connections", 1)

	msgs := make(chan string, 4)
	readErr := make(chan error, 1)
	go func() {
		for {
			_, m, err := ws.Read(context.Background())
			if err != nil {
				readErr <- err
				return
			}
			msgs <- string(m)
		}
	}()
	pctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	if err := ws.Ping(pctx); err != nil {
		t.Fatalf("ping: %v", err)
	}
	cancel()
	if st, _, out := c.do("POST", "/api/v1/commands", s.AdminToken, map[string]any{"kind": "reboot", "device_id": id}); st != 201 {
		t.Fatalf("command: %d %v", st, out)
	}
	select {
	case m := <-msgs:
		if m != `{"type":"push"}` {
			t.Fatalf("message %q", m)
		}
	case err := <-readErr:
		t.Fatalf("connection ended: %v", err)
	case <-time.After(5 * time.Second):
		t.Fatal("no nudge within 5 s")
	}

	ws2 := dialConnect(t, s, token)
	select {
	case err := <-readErr:
		if websocket.CloseStatus(err) != websocket.StatusPolicyViolation {
			t.Fatalf("replaced connection ended with %v, want 1008", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the older connection was not closed")
	}
	waitMetric(t, s, "drover_device_connections", 1)
	if n := s.Metric("drover_device_connections_ended_total", map[string]string{"reason": "replaced"}); n != 1 {
		t.Fatalf("connections ended as replaced: %v, want 1", n)
	}
	// A device with commands waiting is nudged as it connects.
	go func() {
		_, m, err := ws2.Read(context.Background())
		if err == nil {
			msgs <- string(m)
		}
		for err == nil {
			_, _, err = ws2.Read(context.Background())
		}
		readErr <- err
	}()
	select {
	case m := <-msgs:
		if m != `{"type":"push"}` {
			t.Fatalf("message %q", m)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no nudge on connect with a command waiting")
	}
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-readErr:
		if websocket.CloseStatus(err) != websocket.StatusGoingAway {
			t.Fatalf("on shutdown the connection ended with %v, want 1001", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the connection outlived the server")
	}
}

// TestConnectRefusals: no token 401, a wrong token 401, a plain GET (no
// upgrade) 400 with the JSON error body.
func TestConnectRefusals(t *testing.T) {
	s := servertest.Start(t, servertest.Options{})
	c := &client{t: t, s: s, url: s.URL}
	_, token := c.register("m-conn-bad")
	for _, tc := range []struct {
		token  string
		status int
		code   string
	}{{"", 401, "unauthorized"}, {"nope", 401, "unauthorized"}, {token, 400, "invalid_upgrade"}} {
		st, _, out := c.do("GET", "/api/v1/connect", tc.token, nil)
		if st != tc.status || out["error"] == nil {
			t.Errorf("token %q: %d %v, want %d", tc.token, st, out, tc.status)
		}
		if e, _ := out["error"].(map[string]any); e != nil && e["code"] != tc.code {
			t.Errorf("token %q: code %v, want %s", tc.token, e["code"], tc.code)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, resp, err := websocket.Dial(ctx, "wss://"+strings.TrimPrefix(s.URL, "https://")+"/api/v1/connect",
		&websocket.DialOptions{HTTPClient: s.Client(), HTTPHeader: http.Header{"Authorization": {"Bearer nope"}}})
	if err == nil || resp == nil || resp.StatusCode != 401 {
		t.Fatalf("dial with a wrong token: %v %v", resp, err)
	}
	if errors.Is(err, context.DeadlineExceeded) {
		t.Fatal("timed out")
	}
}

func waitMetric(t *testing.T, s *servertest.Server, name string, want float64) {
	t.Helper()
	if !testwait.Until(10*time.Second, func() bool { return s.Metric(name, nil) == want }) {
		t.Fatalf("%s = %v, want %v", name, s.Metric(name, nil), want)
	}
}
