package tunnel

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// UpgradeToken is the Upgrade header of the operator's tunnel request: after
// 101 Switching Protocols the HTTP connection carries the forwarded
// connection's bytes.
const UpgradeToken = "drover-tunnel"

// Client opens tunnels for an operator (drover tunnel).
type Client struct {
	Server    string      // https://HOST[:PORT] of drover serve
	Token     string      // the operator's API token
	TLS       *tls.Config // nil: system roots
	UserAgent string
	// Timeout bounds opening one tunnel (the device may have to open its
	// link first); 0: 30 s.
	Timeout time.Duration
}

// APIError is the server's refusal of a tunnel.
type APIError struct {
	Status  int
	Code    string
	Message string
}

func (e *APIError) Error() string {
	return fmt.Sprintf("%s (%d %s)", e.Message, e.Status, e.Code)
}

// path is the tunnel route of device to dest.
func path(device, dest string) string {
	return "/api/v1/devices/" + url.PathEscape(device) + "/tunnel?to=" + url.QueryEscape(dest)
}

// Check asks the server whether device may be reached at dest through a
// tunnel (the role, the limits, the device connected, its allow-list),
// without connecting to dest.
func (c *Client) Check(ctx context.Context, device, dest string) error {
	conn, br, resp, err := c.do(ctx, device, dest, false)
	if err != nil {
		return err
	}
	defer conn.Close()
	if resp.StatusCode == http.StatusOK {
		return nil
	}
	return readError(resp, br)
}

// Dial opens one tunnel to dest as seen from device: a connection whose
// bytes reach dest.
func (c *Client) Dial(ctx context.Context, device, dest string) (net.Conn, error) {
	conn, br, resp, err := c.do(ctx, device, dest, true)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		defer conn.Close()
		return nil, readError(resp, br)
	}
	if br.Buffered() == 0 {
		return conn, nil
	}
	return &bufConn{Conn: conn, r: br}, nil
}

func (c *Client) do(ctx context.Context, device, dest string, upgrade bool) (net.Conn, *bufio.Reader, *http.Response, error) {
	u, err := url.Parse(c.Server)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
		return nil, nil, nil, fmt.Errorf("--server %q is not an http(s)://HOST[:PORT] URL", c.Server)
	}
	timeout := c.Timeout
	if timeout == 0 {
		timeout = 30 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	addr := u.Host
	if u.Port() == "" {
		addr = net.JoinHostPort(u.Hostname(), map[string]string{"https": "443", "http": "80"}[u.Scheme])
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, nil, nil, err
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	if u.Scheme == "https" {
		cfg := &tls.Config{}
		if c.TLS != nil {
			cfg = c.TLS.Clone()
		}
		if cfg.ServerName == "" {
			cfg.ServerName = u.Hostname()
		}
		cfg.NextProtos = []string{"http/1.1"}
		tc := tls.Client(conn, cfg)
		if err := tc.HandshakeContext(ctx); err != nil {
			conn.Close()
			return nil, nil, nil, err
		}
		conn = tc
	}
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	req, err := http.NewRequest(http.MethodGet, strings.TrimSuffix(c.Server, "/")+path(device, dest), nil)
	if err != nil {
		conn.Close()
		return nil, nil, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+c.Token)
	if c.UserAgent != "" {
		req.Header.Set("User-Agent", c.UserAgent)
	}
	if upgrade {
		req.Header.Set("Connection", "Upgrade")
		req.Header.Set("Upgrade", UpgradeToken)
	}
	br := bufio.NewReader(conn)
	var resp *http.Response
	if err = req.Write(conn); err == nil {
		resp, err = http.ReadResponse(br, req)
	}
	if err == nil && !stop() {
		err = ctx.Err()
	}
	if err != nil {
		conn.Close()
		if ctx.Err() != nil {
			return nil, nil, nil, fmt.Errorf("opening the tunnel: %w", ctx.Err())
		}
		return nil, nil, nil, err
	}
	conn.SetDeadline(time.Time{})
	return conn, br, resp, nil
}

// readError is resp's JSON error body as an *APIError.
func readError(resp *http.Response, br *bufio.Reader) error {
	var body struct {
		Error struct{ Code, Message string }
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	if json.Unmarshal(b, &body) != nil || body.Error.Code == "" {
		return &APIError{Status: resp.StatusCode, Code: "unexpected_answer", Message: "the server answered " + resp.Status}
	}
	return &APIError{Status: resp.StatusCode, Code: body.Error.Code, Message: body.Error.Message}
}

// bufConn is a connection whose first bytes were read into r.
type bufConn struct {
	net.Conn
	r io.Reader
}

func (c *bufConn) Read(b []byte) (int, error) { return c.r.Read(b) }

func (c *bufConn) CloseWrite() error { return closeWrite(c.Conn) }

// Forward accepts connections on ln until ctx ends or ln fails, and
// forwards each through its own tunnel to dest on device; logf reports
// each connection's end or refusal.
func (c *Client) Forward(ctx context.Context, ln net.Listener, device, dest string, logf func(format string, args ...any)) error {
	go func() {
		<-ctx.Done()
		ln.Close()
	}()
	for {
		lc, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return err
		}
		go func() {
			start := time.Now()
			rc, err := c.Dial(ctx, device, dest)
			if err != nil {
				lc.Close()
				logf("%s: tunnel refused: %v", lc.RemoteAddr(), err)
				return
			}
			up, down, _ := NewCounters()
			err = Pipe(lc, rc, up, down)
			msg := fmt.Sprintf("%s: tunnel closed after %s, %d bytes sent, %d received", lc.RemoteAddr(),
				time.Since(start).Round(time.Millisecond), up.N(), down.N())
			if err != nil {
				msg += ": " + err.Error()
			}
			logf("%s", msg)
		}()
	}
}
