package agent

// Port forwarding (docs/remote-access.md): when the server asks on the
// persistent connection ({"type":"tunnel"}), the agent opens its tunnel
// link, a WebSocket carrying a yamux session, and serves the streams the
// server opens on it: each names a destination, which the agent reaches
// only if its own allow-list (Config.TunnelAllow, --tunnel-allow) allows
// it. The agent never opens a stream toward the server.

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"time"

	"github.com/coder/websocket"
	"github.com/drover/drover/internal/tunnel"
	"github.com/hashicorp/yamux"
)

// tunnelDialTimeout bounds connecting to a destination.
const tunnelDialTimeout = 10 * time.Second

// linkURL is the WebSocket URL of the tunnel link.
func (c *client) linkURL() string {
	u := c.base + tunnel.PathLink
	if rest, ok := strings.CutPrefix(u, "https://"); ok {
		return "wss://" + rest
	}
	return "ws://" + strings.TrimPrefix(u, "http://")
}

// openLink opens the tunnel link unless one is open, and serves it until
// it ends or ctx ends.
func (a *Agent) openLink(ctx context.Context) {
	if !a.linkOpen.CompareAndSwap(false, true) {
		return
	}
	go func() {
		defer a.linkOpen.Store(false)
		if err := a.serveLink(ctx); err != nil && ctx.Err() == nil {
			a.log.Info("tunnel link ended", "err", err)
		}
	}()
}

func (a *Agent) serveLink(ctx context.Context) error {
	token, _ := a.connToken.Load().(string)
	hc := &http.Client{Transport: a.client.http.Transport}
	dctx, cancel := context.WithTimeout(ctx, a.cfg.RequestTimeout)
	ws, _, err := websocket.Dial(dctx, a.client.linkURL(), &websocket.DialOptions{HTTPClient: hc,
		CompressionMode: websocket.CompressionDisabled,
		HTTPHeader:      http.Header{"Authorization": {"Bearer " + token}, "User-Agent": {a.client.userAgent}}})
	cancel()
	if err != nil {
		return err
	}
	ws.SetReadLimit(tunnel.MaxMessage)
	lctx, lcancel := context.WithCancel(ctx)
	defer lcancel()
	nc := websocket.NetConn(lctx, ws, websocket.MessageBinary)
	sess, err := yamux.Server(nc, tunnel.SessionConfig())
	if err != nil {
		nc.Close()
		return err
	}
	defer sess.Close()
	a.log.Info("tunnel link up", "allow", a.cfg.TunnelAllow.String())
	for {
		st, err := sess.AcceptStream()
		if err != nil {
			if errors.Is(err, yamux.ErrSessionShutdown) {
				return nil
			}
			return err
		}
		go a.serveStream(ctx, st)
	}
}

// lookupIP resolves a destination's host name.
func lookupIP(ctx context.Context, host string) ([]netip.Addr, error) {
	return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
}

// serveStream answers one stream's request and carries its bytes.
func (a *Agent) serveStream(ctx context.Context, st *yamux.Stream) {
	var req tunnel.Request
	st.SetDeadline(time.Now().Add(tunnelDialTimeout))
	if err := tunnel.ReadLine(st, &req); err != nil {
		st.Close()
		return
	}
	refuse := func(code string, err error) {
		tunnel.WriteLine(st, tunnel.Answer{Error: code, Message: err.Error()})
		st.Close()
	}
	addr, err := a.cfg.TunnelAllow.Resolve(ctx, req.To, lookupIP)
	switch {
	case errors.Is(err, tunnel.ErrOff):
		a.log.Info("tunnel destination refused", "to", req.To, "err", err)
		refuse(tunnel.CodeOff, err)
		return
	case errors.Is(err, tunnel.ErrNotAllowed):
		a.log.Info("tunnel destination refused", "to", req.To, "err", err, "allow", a.cfg.TunnelAllow.String())
		refuse(tunnel.CodeNotAllowed, err)
		return
	case err != nil:
		refuse(tunnel.CodeUnreachable, err)
		return
	}
	if req.Check {
		tunnel.WriteLine(st, tunnel.Answer{})
		st.Close()
		return
	}
	d := net.Dialer{Timeout: tunnelDialTimeout}
	dc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		refuse(tunnel.CodeUnreachable, err)
		return
	}
	if err := tunnel.WriteLine(st, tunnel.Answer{}); err != nil {
		dc.Close()
		st.Close()
		return
	}
	st.SetDeadline(time.Time{})
	a.log.Info("tunnel opened", "to", req.To, "addr", addr)
	toDest, fromDest, _ := tunnel.NewCounters()
	err = tunnel.Pipe(st, dc, toDest, fromDest)
	a.log.Info("tunnel closed", "to", req.To, "bytes_in", toDest.N(), "bytes_out", fromDest.N(), "err", err)
}
