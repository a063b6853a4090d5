package server_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/drover/drover/internal/server"
	"github.com/drover/drover/internal/server/servertest"
)

// TestNodeHeader: --node-name is sent as X-Drover-Node on every answer
// (success, error, probe, unknown path, the 101 of the persistent
// connection), and not at all without it.
func TestNodeHeader(t *testing.T) {
	named := servertest.Start(t, servertest.Options{Configure: func(c *server.Config) { c.NodeName = "node-b.2" }})
	plain := servertest.Start(t, servertest.Options{})
	for _, path := range []string{"/readyz", "/healthz", "/api/v1/devices", "/nowhere"} {
		for _, s := range []*servertest.Server{named, plain} {
			resp, err := s.Client().Get(s.URL + path)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			want := ""
			if s == named {
				want = "node-b.2"
			}
			if got := resp.Header.Get("X-Drover-Node"); got != want || len(resp.Header.Values("X-Drover-Node")) > 1 {
				t.Errorf("%s %s: X-Drover-Node %q, want %q", s.URL, path, resp.Header.Values("X-Drover-Node"), want)
			}
		}
	}
	resp, err := named.Client().Post(named.URL+"/api/v1/push", "application/json", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 401 || resp.Header.Get("X-Drover-Node") != "node-b.2" {
		t.Errorf("push without token: %d, X-Drover-Node %q", resp.StatusCode, resp.Header.Get("X-Drover-Node"))
	}
	for _, s := range []*servertest.Server{named, plain} {
		c := &client{t: t, s: s, url: s.URL}
		_, token := c.register("m-node-header")
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		ws, resp, err := websocket.Dial(ctx, "wss://"+strings.TrimPrefix(s.URL, "https://")+"/api/v1/connect",
			&websocket.DialOptions{HTTPClient: s.Client(), HTTPHeader: http.Header{"Authorization": {"Bearer " + token}}})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		ws.CloseNow()
		want := ""
		if s == named {
			want = "node-b.2"
		}
		if resp.StatusCode != http.StatusSwitchingProtocols || resp.Header.Get("X-Drover-Node") != want || len(resp.Header.Values("X-Drover-Node")) > 1 {
			t.Errorf("%s connect: %d, X-Drover-Node %q, want %q", s.URL, resp.StatusCode, resp.Header.Values("X-Drover-Node"), want)
		}
	}
	for _, bad := range []string{"a b", "x\r\ny", strings.Repeat("n", 65), "ü"} {
		c := server.DefaultConfig()
		c.NodeName = bad
		if err := c.Validate(); err == nil {
			t.Errorf("node name %q accepted", bad)
		}
	}
}
