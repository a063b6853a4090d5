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
	"strconv"
	"strings"
	"sync"
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
	// The link's own transport (one connection, the upgraded one) with a
	// corkable connection under its TLS.
	cork := &corkConn{}
	hc := &http.Client{Transport: a.client.http.Transport}
	if base, ok := a.client.http.Transport.(*http.Transport); ok {
		tr := base.Clone()
		var d net.Dialer
		tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			cork.set(c)
			return cork, nil
		}
		defer tr.CloseIdleConnections()
		hc.Transport = tr
	}
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
	nc := &corkedWriter{Conn: websocket.NetConn(lctx, ws, websocket.MessageBinary), cork: cork}
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
	switch req.Kind {
	case "":
	case tunnel.KindShell:
		a.serveShell(ctx, st, req)
		return
	case tunnel.KindPut, tunnel.KindGet:
		a.serveFile(st, req)
		return
	default:
		refuse(tunnel.CodeBadRequest, errors.New("unknown kind of stream "+strconv.Quote(req.Kind)))
		return
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

// corkConn is the link's TCP connection; while corked, writes are held
// and go out in one write when uncorked. The agent is the WebSocket
// client and must mask what it sends: the WebSocket library masks in its
// 4 KiB write buffer and flushes it each time, which without the cork
// made each 4 KiB a TLS record and a system call of its own.
type corkConn struct {
	net.Conn
	mu     sync.Mutex
	corked bool
	held   []byte
}

func (c *corkConn) set(conn net.Conn) { c.Conn = conn }

func (c *corkConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.corked {
		c.held = append(c.held, p...)
		return len(p), nil
	}
	return c.Conn.Write(p)
}

func (c *corkConn) cork() {
	c.mu.Lock()
	c.corked = true
	c.mu.Unlock()
}

// uncork writes what was held.
func (c *corkConn) uncork() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.corked = false
	if len(c.held) == 0 {
		return nil
	}
	_, err := c.Conn.Write(c.held)
	if cap(c.held) > 1<<20 {
		c.held = nil
	} else {
		c.held = c.held[:0]
	}
	return err
}

// corkedWriter is the WebSocket connection under the yamux session: each
// write (one WebSocket message) goes out corked, as one TCP write.
type corkedWriter struct {
	net.Conn
	cork *corkConn
}

func (w *corkedWriter) Write(p []byte) (int, error) {
	w.cork.cork()
	n, err := w.Conn.Write(p)
	if uerr := w.cork.uncork(); err == nil && uerr != nil {
		return n, uerr
	}
	return n, err
}
