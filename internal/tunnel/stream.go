package tunnel

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/yamux"
)

// The link between server and agent is one yamux session
// (github.com/hashicorp/yamux) over a WebSocket: the server opens one
// stream per forwarded connection, the agent only accepts. Each stream
// starts with one JSON line from the server (Request) and one from the
// agent (Answer); then the stream carries the connection's bytes both
// ways, a half-close (FIN) passed on as such.

// PathLink is the device's endpoint for the link (a WebSocket upgrade with
// the device's token), opened when the server asks on the persistent
// connection with LinkMessage.
const PathLink = "/api/v1/tunnel"

// LinkMessage is the persistent connection's frame asking the agent to
// open the link; agents that do not know it ignore it.
var LinkMessage = []byte(`{"type":"tunnel"}`)

// Request is the server's first line on a stream.
type Request struct {
	To string `json:"to"` // HOST:PORT as seen from the device (Kind "")
	// Check asks only whether the request is allowed, without dialling,
	// starting a shell or touching a file.
	Check bool `json:"check,omitempty"`
	// Kind is what the stream carries (remote.go): "" a TCP connection to
	// To, KindShell a shell, KindPut or KindGet a file.
	Kind string `json:"kind,omitempty"`
	// Path is the file of KindPut and KindGet, absolute on the device.
	Path string `json:"path,omitempty"`
	// Size is the length of a KindPut file, sent after the answer.
	Size int64 `json:"size,omitempty"`
	// Cols and Rows are a shell's first window size.
	Cols uint16 `json:"cols,omitempty"`
	Rows uint16 `json:"rows,omitempty"`
	// Command, for KindShell, runs this command line with the shell
	// (SHELL -c COMMAND, no terminal, no input) instead of an
	// interactive shell.
	Command string `json:"command,omitempty"`
}

// Answer is the agent's first line on a stream: Error "" when connected
// (or, for a check, allowed).
type Answer struct {
	Error   string `json:"error,omitempty"` // not_allowed, tunnels_off, unreachable, bad_request, and remote.go's
	Message string `json:"message,omitempty"`
	// Size is the length of a KindGet file, sent after the answer.
	Size int64 `json:"size,omitempty"`
	// SHA256 is, in the last line of a KindPut stream, the hex SHA-256
	// of the file written.
	SHA256 string `json:"sha256,omitempty"`
}

// Answer codes.
const (
	CodeNotAllowed  = "not_allowed"
	CodeOff         = "tunnels_off"
	CodeUnreachable = "unreachable"
	CodeBadRequest  = "bad_request"
)

// maxLine bounds a Request or Answer line.
const maxLine = 2048

// WriteLine writes v as one JSON line.
func WriteLine(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

// ReadLine reads one JSON line into v, byte by byte so that nothing after
// it is consumed.
func ReadLine(r io.Reader, v any) error {
	var b [maxLine]byte
	n := 0
	for {
		if n == len(b) {
			return errors.New("tunnel: line too long")
		}
		if _, err := io.ReadFull(r, b[n:n+1]); err != nil {
			return err
		}
		if b[n] == '\n' {
			break
		}
		n++
	}
	if err := json.Unmarshal(b[:n], v); err != nil {
		return fmt.Errorf("tunnel: bad line: %w", err)
	}
	return nil
}

// StreamWindow is the most a stream may have in flight before its reader
// takes it: a stream's buffer grows to it only when its reader lags (the
// default 256 KiB held bulk transfers to a quarter of loopback's speed on
// a busy machine).
const StreamWindow = 2 << 20

// MaxMessage bounds a link's WebSocket message: a yamux frame, at most one
// window and its header.
const MaxMessage = StreamWindow + 64

// SessionConfig is the yamux configuration of both ends: keep-alives
// every 30 s find a dead link, yamux logs nowhere (errors surface as the
// session's end).
func SessionConfig() *yamux.Config {
	c := yamux.DefaultConfig()
	c.LogOutput = io.Discard
	c.KeepAliveInterval = 30 * time.Second
	c.ConnectionWriteTimeout = 30 * time.Second
	c.StreamOpenTimeout = 30 * time.Second
	c.StreamCloseTimeout = time.Minute
	c.AcceptBacklog = 64
	c.MaxStreamWindowSize = StreamWindow
	return c
}

// Counter counts the bytes of one direction and notes when they moved.
type Counter struct {
	n    atomic.Int64
	last *atomic.Int64 // unix nanoseconds of the last activity, shared by both directions
}

// N is the bytes counted.
func (c *Counter) N() int64 { return c.n.Load() }

// Pipe copies a→b and b→a until both directions ended; a direction's end
// of input is passed on as a half-close. It returns the bytes a→b and b→a
// and the first error other than an orderly end. The connections are
// closed when it returns.
func Pipe(a, b net.Conn, ab, ba *Counter) error {
	var wg sync.WaitGroup
	var once sync.Once
	var first error
	fail := func(err error) {
		once.Do(func() { first = err })
		a.Close()
		b.Close()
	}
	cp := func(dst, src net.Conn, c *Counter) {
		defer wg.Done()
		if err := copyAhead(dst, src, c); err != nil {
			if err == errHalfClose {
				err = nil
			}
			fail(err)
		}
	}
	wg.Add(2)
	go cp(b, a, ab)
	go cp(a, b, ba)
	wg.Wait()
	a.Close()
	b.Close()
	if errors.Is(first, net.ErrClosed) || errors.Is(first, yamux.ErrStreamClosed) {
		first = nil
	}
	return first
}

// readBuf is one read's buffer; aheadMax bounds what a direction reads
// ahead of its writer.
const (
	readBuf  = 64 << 10
	aheadMax = 512 << 10
)

// errHalfClose is copyAhead's end when dst could not be half-closed: the
// pipe ends without an error.
var errHalfClose = errors.New("tunnel: half-close failed")

// copyAhead copies src→dst until src's end (passed on as a half-close) or
// an error (returned; nil for an orderly end). A reader goroutine reads
// ahead while dst is being written, and the writer takes everything read
// so far in one write: a TLS connection returns one 16 KiB record a read,
// and a yamux stream's write waits for its frame to be sent, so copying
// read by read left each side idle while the other worked and sent one
// small frame per record.
func copyAhead(dst, src net.Conn, c *Counter) error {
	var (
		mu      sync.Mutex
		cond    = sync.NewCond(&mu)
		pending []byte // read, not yet taken by the writer
		rerr    error  // the reader's end
		stopped bool   // the writer gave up
	)
	go func() {
		buf := make([]byte, readBuf)
		for {
			n, err := src.Read(buf)
			mu.Lock()
			if n > 0 {
				if c != nil {
					c.n.Add(int64(n))
					if c.last != nil {
						c.last.Store(time.Now().UnixNano())
					}
				}
				for len(pending)+n > aheadMax && !stopped {
					cond.Wait()
				}
				pending = append(pending, buf[:n]...)
			}
			if err != nil {
				rerr = err
			}
			end := err != nil || stopped
			cond.Broadcast()
			mu.Unlock()
			if end {
				return
			}
		}
	}()
	var out []byte
	for {
		mu.Lock()
		for len(pending) == 0 && rerr == nil {
			cond.Wait()
		}
		if len(pending) == 0 {
			err := rerr
			mu.Unlock()
			if err == io.EOF {
				if closeWrite(dst) != nil {
					return errHalfClose
				}
				return nil
			}
			return err
		}
		out, pending = pending, out[:0]
		cond.Broadcast()
		mu.Unlock()
		if _, err := dst.Write(out); err != nil {
			mu.Lock()
			stopped = true
			cond.Broadcast()
			mu.Unlock()
			return err
		}
	}
}

// NewCounters are the two counters of a pipe, sharing the time of the last
// activity, which starts now.
func NewCounters() (ab, ba *Counter, last *atomic.Int64) {
	last = new(atomic.Int64)
	last.Store(time.Now().UnixNano())
	return &Counter{last: last}, &Counter{last: last}, last
}

// closeWrite half-closes c: a TCP or TLS connection's write side, a yamux
// stream's (Close sends FIN and still reads).
func closeWrite(c net.Conn) error {
	switch c := c.(type) {
	case interface{ CloseWrite() error }:
		return c.CloseWrite()
	case *yamux.Stream:
		return c.Close()
	}
	return c.Close()
}
