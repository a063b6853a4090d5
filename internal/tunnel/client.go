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
	"strconv"
	"strings"
	"time"

	"github.com/coder/websocket"
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

// httpClient is c's client for the API's plain requests (files,
// terminals): the 100-continue wait covers the device's link opening, so
// that a refused upload is refused before its body is sent.
func (c *Client) httpClient() *http.Client {
	timeout := c.Timeout
	if timeout == 0 {
		timeout = 30 * time.Second
	}
	tr := &http.Transport{TLSClientConfig: c.TLS, ExpectContinueTimeout: timeout, ResponseHeaderTimeout: timeout + time.Minute,
		Proxy: http.ProxyFromEnvironment, ForceAttemptHTTP2: false}
	return &http.Client{Transport: tr}
}

// apiURL is the URL of path on c's server.
func (c *Client) apiURL(path string) (string, error) {
	u, err := url.Parse(c.Server)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
		return "", fmt.Errorf("--server %q is not an http(s)://HOST[:PORT] URL", c.Server)
	}
	return strings.TrimSuffix(c.Server, "/") + path, nil
}

func (c *Client) header() http.Header {
	h := http.Header{"Authorization": {"Bearer " + c.Token}}
	if c.UserAgent != "" {
		h.Set("User-Agent", c.UserAgent)
	}
	return h
}

// FileResult is the server's answer to an upload.
type FileResult struct {
	DeviceID string `json:"device_id"`
	Path     string `json:"path"`
	Size     int64  `json:"size"`
	SHA256   string `json:"sha256"`
}

// filesPath is the files route of device and path.
func filesPath(device, path string) string {
	return "/api/v1/devices/" + url.PathEscape(device) + "/files?path=" + url.QueryEscape(path)
}

// Put uploads size bytes of body to path on device.
func (c *Client) Put(ctx context.Context, device, path string, body io.Reader, size int64) (FileResult, error) {
	u, err := c.apiURL(filesPath(device, path))
	if err != nil {
		return FileResult{}, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, u, body)
	if err != nil {
		return FileResult{}, err
	}
	req.ContentLength = size
	if size == 0 {
		req.Body = http.NoBody
	}
	req.Header = c.header()
	req.Header.Set("Content-Type", "application/octet-stream")
	req.Header.Set("Expect", "100-continue")
	resp, err := c.httpClient().Do(req)
	if err != nil {
		return FileResult{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		return FileResult{}, readError(resp, nil)
	}
	var res FileResult
	if err := json.NewDecoder(resp.Body).Decode(&res); err != nil {
		return FileResult{}, fmt.Errorf("the server's answer: %w", err)
	}
	return res, nil
}

// Get downloads path from device into w; it returns the bytes written.
func (c *Client) Get(ctx context.Context, device, path string, w io.Writer) (int64, error) {
	u, err := c.apiURL(filesPath(device, path))
	if err != nil {
		return 0, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return 0, err
	}
	req.Header = c.header()
	resp, err := c.httpClient().Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, readError(resp, nil)
	}
	n, err := io.Copy(w, resp.Body)
	if err == nil && resp.ContentLength >= 0 && n != resp.ContentLength {
		err = fmt.Errorf("received %d bytes of %d", n, resp.ContentLength)
	}
	return n, err
}

// TerminalOptions shape a terminal: its window, or a command line run
// without one.
type TerminalOptions struct {
	Cols, Rows uint16
	Command    string
}

// Terminal opens a terminal on device: a WebSocket whose binary messages
// are the terminal's bytes both ways, and whose text messages are JSON:
// {"type":"resize","cols":C,"rows":R} to the server, {"type":"exit",
// "status":N} from it (docs/remote-access.md).
func (c *Client) Terminal(ctx context.Context, device string, o TerminalOptions) (*websocket.Conn, error) {
	q := url.Values{}
	if o.Cols > 0 && o.Rows > 0 {
		q.Set("cols", strconv.Itoa(int(o.Cols)))
		q.Set("rows", strconv.Itoa(int(o.Rows)))
	}
	if o.Command != "" {
		q.Set("command", o.Command)
	}
	u, err := c.apiURL("/api/v1/devices/" + url.PathEscape(device) + "/terminal?" + q.Encode())
	if err != nil {
		return nil, err
	}
	timeout := c.Timeout
	if timeout == 0 {
		timeout = 30 * time.Second
	}
	dctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	ws, resp, err := websocket.Dial(dctx, u, &websocket.DialOptions{HTTPClient: c.httpClient(), HTTPHeader: c.header(),
		CompressionMode: websocket.CompressionDisabled})
	if err != nil {
		if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols {
			return nil, readError(resp, nil)
		}
		return nil, err
	}
	ws.SetReadLimit(MaxFrame + 64)
	return ws, nil
}
