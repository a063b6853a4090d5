package emulator

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/drover/drover/internal/emulator/results"
)

// ConnMode is how emulated devices use connections.
type ConnMode string

// Connection modes.
const (
	ConnNew       ConnMode = "new"       // new TCP (+ full TLS handshake) per request, as most agents do
	ConnResume    ConnMode = "resume"    // new TCP per request, TLS session resumed from the device's own ticket
	ConnKeepAlive ConnMode = "keepalive" // connections kept open and reused
)

// transport is a minimal HTTP/1.1 client: one request per write, responses
// parsed from a buffered reader, connections pooled only in keep-alive
// mode. It does what the emulator needs and nothing else, at a fraction of
// net/http's cost per request.
type transport struct {
	addr    string
	host    string // Host header
	tlsConf *tls.Config
	mode    ConnMode
	dialers []*net.Dialer
	raw     []*rawDialer // the lean dialers (Linux, IP address targets), one per source address
	next    atomic.Uint32
	timeout time.Duration

	mu     sync.Mutex
	idle   []*conn
	all    map[*conn]struct{}
	closed bool

	dials, dialErrors, tlsFull, tlsResumed, tlsErrors, requests, reused atomic.Int64
	tlsResumeFailed                                                     atomic.Int64 // a session offered, a full handshake done
	open, maxOpen                                                       atomic.Int64
}

type conn struct {
	nc   net.Conn
	raw  net.Conn // the TCP connection under nc; shutdown sets its deadline
	br   *bufio.Reader
	used int  // requests answered on this connection
	set  bool // the deadline of the first request is already set
	// tc is this record's copy of the transport's TLS configuration (base),
	// made once: a resuming connection points its ClientSessionCache at the
	// device's own session slot.
	tc, base *tls.Config
}

// sessionSlot is one device's TLS session cache: the one session an agent
// keeps (its last ticket from the server), whatever the cache key. A
// device runs one operation at a time, so the slot needs no lock.
type sessionSlot struct{ s *tls.ClientSessionState }

func (c *sessionSlot) Get(string) (*tls.ClientSessionState, bool) { return c.s, c.s != nil }

// Put keeps the newest session; crypto/tls puts nil to forget a session
// the server refused.
func (c *sessionSlot) Put(_ string, s *tls.ClientSessionState) { c.s = s }

// conns recycles connection records and their read buffers: with a new
// connection per request, one 4 KiB buffer per request would be garbage.
var conns = sync.Pool{New: func() any { return &conn{br: bufio.NewReaderSize(nil, 4096)} }}

func newTransport(target *url.URL, tlsConf *tls.Config, mode ConnMode, sources []net.IP, timeout time.Duration) (*transport, error) {
	t := &transport{mode: mode, timeout: timeout, host: target.Host, all: map[*conn]struct{}{}}
	port := target.Port()
	switch target.Scheme {
	case "https":
		if port == "" {
			port = "443"
		}
		c := tlsConf.Clone()
		if c.ServerName == "" {
			c.ServerName = target.Hostname()
		}
		c.NextProtos = []string{"http/1.1"}
		c.ClientSessionCache = nil // resume mode: each device's own slot, set per connection
		t.tlsConf = c
	case "http":
		if port == "" {
			port = "80"
		}
	default:
		return nil, fmt.Errorf("target %q: scheme must be http or https", target.String())
	}
	t.addr = net.JoinHostPort(target.Hostname(), port)
	if len(sources) == 0 {
		t.dialers = []*net.Dialer{{Timeout: timeout}}
	}
	for _, ip := range sources {
		t.dialers = append(t.dialers, &net.Dialer{Timeout: timeout, LocalAddr: &net.TCPAddr{IP: ip}, Control: bindNoPort})
	}
	if ip := net.ParseIP(target.Hostname()); ip != nil {
		n, _ := strconv.Atoi(port)
		raddr := &net.TCPAddr{IP: ip, Port: n}
		if len(sources) == 0 {
			sources = []net.IP{nil}
		}
		for _, src := range sources {
			d, ok := newRawDialer(raddr, src, t.tlsConf != nil)
			if !ok {
				t.raw = nil
				break
			}
			t.raw = append(t.raw, d)
		}
	}
	return t, nil
}

// errStale marks a kept-alive connection that the server had closed.
var errStale = errors.New("connection closed by the server before answering")

// get returns a pooled connection (keep-alive) or dials a new one; sess is
// the device's TLS session slot (used in resume mode; nil: none).
func (t *transport) get(ctx context.Context, sess *sessionSlot) (*conn, error) {
	if t.mode == ConnKeepAlive {
		t.mu.Lock()
		if n := len(t.idle); n > 0 {
			c := t.idle[n-1]
			t.idle = t.idle[:n-1]
			t.mu.Unlock()
			return c, nil
		}
		t.mu.Unlock()
	}
	return t.dial(ctx, sess)
}

func (t *transport) dial(ctx context.Context, sess *sessionSlot) (*conn, error) {
	i := 0
	if n := max(len(t.raw), len(t.dialers)); n > 1 {
		i = int(t.next.Add(1) % uint32(n))
	}
	t.dials.Add(1)
	var nc net.Conn
	var err error
	if t.raw != nil {
		nc, err = t.raw[i].dial(time.Now().Add(t.timeout))
	} else {
		nc, err = t.dialers[i].DialContext(ctx, "tcp", t.addr)
		if err == nil {
			err = nc.SetDeadline(time.Now().Add(t.timeout))
		}
	}
	if err != nil {
		t.dialErrors.Add(1)
		return nil, err
	}
	c := conns.Get().(*conn)
	c.nc, c.raw, c.used, c.set = nc, nc, 0, true
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		nc.Close()
		conns.Put(c)
		return nil, context.Canceled
	}
	t.all[c] = struct{}{} // from here, shutdown can interrupt it
	t.mu.Unlock()
	if n := t.open.Add(1); n > t.maxOpen.Load() {
		t.maxOpen.Store(n) // racy maximum; good enough for a gauge
	}
	if t.tlsConf != nil {
		conf := t.tlsConf
		offered := false
		if t.mode == ConnResume && sess != nil {
			if c.base != t.tlsConf {
				c.tc, c.base = t.tlsConf.Clone(), t.tlsConf
			}
			// The record's earlier connection is closed: nothing reads
			// its configuration any more.
			c.tc.ClientSessionCache = sess
			conf, offered = c.tc, sess.s != nil
		}
		tc := tls.Client(nc, conf)
		// Handshake, not HandshakeContext: that starts a goroutine per
		// handshake to watch ctx; shutdown interrupts through the deadline.
		if err := tc.Handshake(); err != nil {
			t.tlsErrors.Add(1)
			t.closeConn(c)
			if t.raw != nil && isConnectErr(err) {
				t.dialErrors.Add(1) // the connect itself failed (found by the first write)
				return nil, err
			}
			return nil, &tlsError{err}
		}
		if tc.ConnectionState().DidResume {
			t.tlsResumed.Add(1)
		} else {
			t.tlsFull.Add(1)
			if offered {
				t.tlsResumeFailed.Add(1)
			}
		}
		c.nc = tc
	}
	c.br.Reset(c.nc)
	return c, nil
}

// isConnectErr tells whether err is a connect's failure, which the lean
// dialer learns from the first write or read.
func isConnectErr(err error) bool {
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.EADDRNOTAVAIL) ||
		errors.Is(err, syscall.ENETUNREACH) || errors.Is(err, syscall.EHOSTUNREACH)
}

type tlsError struct{ err error }

func (e *tlsError) Error() string { return "tls: " + e.err.Error() }
func (e *tlsError) Unwrap() error { return e.err }

func (t *transport) release(c *conn, reuse bool) {
	if reuse && t.mode == ConnKeepAlive {
		t.mu.Lock()
		if !t.closed {
			t.idle = append(t.idle, c)
			t.mu.Unlock()
			return
		}
		t.mu.Unlock()
	}
	t.closeConn(c)
}

func (t *transport) closeConn(c *conn) {
	c.nc.Close()
	t.mu.Lock()
	_, ok := t.all[c]
	if ok {
		delete(t.all, c)
		t.open.Add(-1)
	}
	t.mu.Unlock()
	if ok {
		c.nc, c.raw = nil, nil
		c.br.Reset(nil)
		conns.Put(c)
	}
}

// shutdown closes idle connections and, if abort, interrupts busy ones.
func (t *transport) shutdown(abort bool) {
	t.mu.Lock()
	t.closed = true
	idle := t.idle
	t.idle = nil
	if abort {
		for c := range t.all {
			c.raw.SetDeadline(time.Unix(1, 0))
		}
	}
	t.mu.Unlock()
	for _, c := range idle {
		t.closeConn(c)
	}
}

func (t *transport) stats() results.Conns {
	return results.Conns{
		Dials: t.dials.Load(), DialErrors: t.dialErrors.Load(), TLSFull: t.tlsFull.Load(),
		TLSResumed: t.tlsResumed.Load(), TLSErrors: t.tlsErrors.Load(), Requests: t.requests.Load(),
		MaxOpen: t.maxOpen.Load(), ReusedConns: t.reused.Load(), TLSResumeFailed: t.tlsResumeFailed.Load(),
	}
}

// response is what the emulator needs of an answer.
type response struct {
	status     int
	retryAfter time.Duration // -1: no Retry-After
	body       []byte        // in the caller's buffer
	close      bool
	node       []byte // X-Drover-Node: which server node answered ("" when none said)
}

// do sends req (a complete HTTP/1.1 request) and reads the answer. A
// request that fails on a reused connection before any answer byte is sent
// once more on a new connection; resent tells so. sess is the device's TLS
// session slot (nil: none).
func (t *transport) do(ctx context.Context, sess *sessionSlot, req []byte, body []byte, resp *response) (resent bool, err error) {
	for attempt := 0; ; attempt++ {
		var c *conn
		c, err = t.get(ctx, sess)
		if err != nil {
			return resent, err
		}
		reused := c.used > 0
		if reused {
			t.reused.Add(1)
		}
		t.requests.Add(1)
		err = c.roundTrip(req, body, resp, t.timeout)
		if err == nil {
			c.used++
			t.release(c, !resp.close)
			return resent, nil
		}
		t.closeConn(c)
		if !reused && t.raw != nil && isConnectErr(err) {
			t.dialErrors.Add(1) // the lean dialer's connect failed, found by the first write
		}
		if reused && attempt == 0 && errors.Is(err, errStale) && ctx.Err() == nil {
			resent = true
			continue
		}
		if errors.Is(err, errStale) {
			err = io.ErrUnexpectedEOF
		}
		return resent, err
	}
}

func (c *conn) roundTrip(req, body []byte, resp *response, timeout time.Duration) error {
	if c.set {
		c.set = false // a new connection: its deadline covers connect, handshake and this request
	} else if err := c.nc.SetDeadline(time.Now().Add(timeout)); err != nil {
		return err
	}
	if _, err := c.nc.Write(req); err != nil {
		if c.used > 0 && isConnGone(err) {
			return errStale
		}
		return err
	}
	// Let other goroutines send first: the answer is then often already
	// there, which saves a read that would find nothing (a syscall).
	runtime.Gosched()
	return c.readResponse(resp, body)
}

func isConnGone(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

var errProtocol = errors.New("malformed HTTP response")

func (c *conn) readResponse(resp *response, body []byte) error {
	resp.retryAfter, resp.close, resp.body, resp.node = -1, false, body[:0], resp.node[:0]
	var line []byte
	var err error
	for {
		line, err = c.br.ReadSlice('\n')
		if err != nil {
			if len(line) == 0 && c.used > 0 && isConnGone(err) {
				return errStale
			}
			if errors.Is(err, io.EOF) {
				return io.ErrUnexpectedEOF
			}
			return err
		}
		// "HTTP/1.1 200 OK\r\n"
		if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.")) || line[8] != ' ' {
			return errProtocol
		}
		resp.status = int(line[9]-'0')*100 + int(line[10]-'0')*10 + int(line[11]-'0')
		if resp.status < 100 || resp.status > 599 {
			return errProtocol
		}
		http10 := line[7] == '0'
		resp.close = http10
		length, chunked := int64(-1), false
		for {
			line, err = c.br.ReadSlice('\n')
			if err != nil {
				if errors.Is(err, io.EOF) {
					return io.ErrUnexpectedEOF
				}
				return err
			}
			if len(line) <= 2 {
				break
			}
			colon := bytes.IndexByte(line, ':')
			if colon <= 0 {
				return errProtocol
			}
			name, val := line[:colon], bytes.TrimSpace(line[colon+1:])
			switch {
			case equalFold(name, "content-length"):
				n, err := strconv.ParseInt(string(val), 10, 64)
				if err != nil || n < 0 {
					return errProtocol
				}
				length = n
			case equalFold(name, "transfer-encoding"):
				chunked = equalFold(val, "chunked")
			case equalFold(name, "connection"):
				if equalFold(val, "close") {
					resp.close = true
				} else if equalFold(val, "keep-alive") {
					resp.close = false
				}
			case equalFold(name, "retry-after"):
				resp.retryAfter = parseRetryAfter(string(val))
			case equalFold(name, "x-drover-node"):
				resp.node = append(resp.node[:0], val[:min(len(val), 64)]...)
			}
		}
		if resp.status >= 200 || resp.status == 101 {
			if resp.status == 204 || resp.status == 304 {
				return nil
			}
			switch {
			case chunked:
				return c.readChunked(resp)
			case length >= 0:
				return c.readN(resp, length)
			default:
				resp.close = true
				return c.readToEOF(resp)
			}
		}
		// 1xx: another status line follows.
	}
}

const maxBody = 1 << 20

func (c *conn) readN(resp *response, n int64) error {
	if n > maxBody {
		return fmt.Errorf("answer body of %d bytes is too large", n)
	}
	b := resp.body
	if int64(cap(b)) < n {
		b = make([]byte, n)
	}
	b = b[:n]
	if _, err := io.ReadFull(c.br, b); err != nil {
		if errors.Is(err, io.EOF) {
			return io.ErrUnexpectedEOF
		}
		return err
	}
	resp.body = b
	return nil
}

func (c *conn) readToEOF(resp *response) error {
	buf := bytes.NewBuffer(resp.body[:0])
	_, err := io.Copy(buf, io.LimitReader(c.br, maxBody))
	resp.body = buf.Bytes()
	return err
}

func (c *conn) readChunked(resp *response) error {
	b := resp.body[:0]
	for {
		line, err := c.br.ReadSlice('\n')
		if err != nil {
			return io.ErrUnexpectedEOF
		}
		line = bytes.TrimSpace(line)
		if i := bytes.IndexByte(line, ';'); i >= 0 {
			line = line[:i]
		}
		n, err := strconv.ParseInt(string(line), 16, 64)
		if err != nil || n < 0 || int64(len(b))+n > maxBody {
			return errProtocol
		}
		if n == 0 {
			for { // trailers
				line, err := c.br.ReadSlice('\n')
				if err != nil {
					return io.ErrUnexpectedEOF
				}
				if len(line) <= 2 {
					resp.body = b
					return nil
				}
			}
		}
		start := len(b)
		b = append(b, make([]byte, n)...)
		if _, err := io.ReadFull(c.br, b[start:]); err != nil {
			return io.ErrUnexpectedEOF
		}
		if _, err := c.br.Discard(2); err != nil {
			return io.ErrUnexpectedEOF
		}
	}
}

func equalFold(b []byte, s string) bool {
	if len(b) != len(s) {
		return false
	}
	for i := 0; i < len(b); i++ {
		c := b[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != s[i] {
			return false
		}
	}
	return true
}

// parseRetryAfter reads seconds or an HTTP date; -1 when unreadable.
func parseRetryAfter(v string) time.Duration {
	if n, err := strconv.Atoi(v); err == nil && n >= 0 {
		return time.Duration(n) * time.Second
	}
	if t, err := time.Parse(time.RFC1123, v); err == nil {
		return max(time.Until(t), 0)
	}
	return -1
}

// Drop reasons: why an operation got no HTTP answer.
const (
	DropTimeout   = "timeout"
	DropRefused   = "refused"
	DropReset     = "reset"
	DropEOF       = "eof"
	DropNoPort    = "no_port"  // ephemeral ports exhausted: add --source-addrs
	DropFDLimit   = "fd_limit" // open files exhausted: use --procs
	DropTLS       = "tls"
	DropProtocol  = "protocol"
	DropCancelled = "cancelled"
	DropOther     = "other"
)

func classify(err error) string {
	var te *tlsError
	var ne net.Error
	switch {
	case errors.Is(err, context.Canceled):
		return DropCancelled
	case errors.Is(err, os.ErrDeadlineExceeded), errors.Is(err, context.DeadlineExceeded):
		return DropTimeout
	case errors.Is(err, syscall.ECONNREFUSED):
		return DropRefused
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return DropReset
	case errors.Is(err, syscall.EADDRNOTAVAIL), errors.Is(err, syscall.EADDRINUSE):
		return DropNoPort
	case errors.Is(err, syscall.EMFILE), errors.Is(err, syscall.ENFILE):
		return DropFDLimit
	case errors.As(err, &te):
		if errors.As(te.err, &ne) && ne.Timeout() {
			return DropTimeout
		}
		if errors.Is(te.err, io.EOF) || errors.Is(te.err, syscall.ECONNRESET) {
			return DropReset
		}
		return DropTLS
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return DropEOF
	case errors.Is(err, errProtocol):
		return DropProtocol
	case errors.As(err, &ne) && ne.Timeout():
		return DropTimeout
	}
	return DropOther
}
