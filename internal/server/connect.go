package server

// Persistent connections (docs/protocol.md#persistent-connection): a
// device may hold one WebSocket on the HTTPS port. The server sends it
// {"type":"push"} when there is something for it (a command, a new
// configuration of its profile); the device then pushes at once and gets
// it in the push answer, through the one path every agent uses.
//
// An idle connection is kept cheap (docs/performance.md#persistent-
// connections): after the upgrade the handler hands the hijacked
// connection to one small goroutine and returns, so net/http's goroutine,
// its grown stack and its 4 KiB bufio buffers go; that goroutine reads
// frames straight from the TLS connection with a 14-byte header buffer,
// pings the device after connPing of silence from the same goroutine (no
// ticker), and nudges are written by a short-lived goroutine per nudge.
// Devices send no data frames; the server side of RFC 6455 needed here is
// the handshake, unmasked frames out, masked frames in, ping/pong, close.

import (
	"crypto/sha1"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/drover/drover/internal/protocol"
)

// nudgeMessage asks the device to push now.
var nudgeMessage = []byte(`{"type":"push"}`)

// connPing is how long a connection may be silent before the server pings
// it (keeps NAT mappings and finds dead peers); connAnswer is how long the
// device then has to answer, and the limit on any write.
// connGrace is how long the server reads once more when connAnswer has
// passed: on a busy machine the reading goroutine may run only after its
// deadline, with the pong already received and unread.
var (
	connPing   = 2 * time.Minute
	connAnswer = 30 * time.Second
	connGrace  = time.Second
)

// Why a connection ended (drover_device_connections_ended_total); the
// first reason set wins.
const (
	endClosed      uint32 = iota // by the device, or its connection failed
	endUnanswered                // no pong to the server's ping
	endReplaced                  // by a newer connection of the device
	endProtocol                  // a frame the server refuses
	endWriteFailed               // a nudge, ping or pong could not be written
	endStopping                  // server shutdown
)

// endReasons are the metric's labels, indexed by the end constants.
var endReasons = []string{"closed", "unanswered", "replaced", "protocol", "write_failed", "stopping"}

// WebSocket opcodes and close codes (RFC 6455).
const (
	opContinuation = 0x0
	opText         = 0x1
	opBinary       = 0x2
	opClose        = 0x8
	opPing         = 0x9
	opPong         = 0xA

	closeGoingAway      = 1001
	closeProtocolError  = 1002
	closePolicyViolated = 1008
	closeTooBig         = 1009
)

// hub holds the devices' connections, one per device.
type hub struct {
	mu      sync.Mutex
	conns   map[uint64]*deviceConn
	stopped bool
}

// deviceConn is one device's connection.
type deviceConn struct {
	id      uint64
	nc      net.Conn
	wmu     sync.Mutex    // one frame written at a time
	nudging atomic.Bool   // a nudge write is on its way
	ended   atomic.Uint32 // why the server ended it, plus one; 0: it did not
	hdr     [14]byte      // frame header being read
	// asked notes each nudge written: the push it asks for is not counted
	// against the device's quota (fleet.Service.Nudged); nil: none.
	asked func(id uint64)
}

func newHub() *hub { return &hub{conns: map[uint64]*deviceConn{}} }

// add registers c, replacing (closing) the device's older connection; false
// when the server is stopping.
func (h *hub) add(c *deviceConn) bool {
	h.mu.Lock()
	if h.stopped {
		h.mu.Unlock()
		return false
	}
	old := h.conns[c.id]
	h.conns[c.id] = c
	h.mu.Unlock()
	if old != nil {
		old.end(endReplaced)
		old.closeWith(closePolicyViolated, "replaced by a newer connection")
	}
	return true
}

func (h *hub) remove(c *deviceConn) {
	h.mu.Lock()
	if h.conns[c.id] == c {
		delete(h.conns, c.id)
	}
	h.mu.Unlock()
}

// notify tells a connected device to push; O(1), never blocks.
func (h *hub) notify(id uint64) {
	h.mu.Lock()
	c := h.conns[id]
	h.mu.Unlock()
	if c != nil {
		c.nudge()
	}
}

// holds says whether the device holds a connection to this server.
func (h *hub) holds(id uint64) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.conns[id] != nil
}

// ask writes msg, a text frame of at most 125 bytes, to the device's
// connection (tunnel.go); false when it holds none or the write failed.
func (h *hub) ask(id uint64, msg []byte) bool {
	h.mu.Lock()
	c := h.conns[id]
	h.mu.Unlock()
	if c == nil {
		return false
	}
	if c.write(opText, msg) != nil {
		c.end(endWriteFailed)
		c.nc.Close()
		return false
	}
	return true
}

// notifyWhere tells every connected device for which match is true.
func (h *hub) notifyWhere(match func(id uint64) bool) {
	h.mu.Lock()
	ids := make([]uint64, 0, len(h.conns))
	for id := range h.conns {
		ids = append(ids, id)
	}
	h.mu.Unlock()
	for _, id := range ids {
		if match(id) {
			h.notify(id)
		}
	}
}

// connected is how many devices hold a connection.
func (h *hub) connected() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.conns)
}

// close ends every connection (server shutdown).
func (h *hub) close() {
	h.mu.Lock()
	h.stopped = true
	all := make([]*deviceConn, 0, len(h.conns))
	for _, c := range h.conns {
		all = append(all, c)
	}
	h.mu.Unlock()
	for _, c := range all {
		c.end(endStopping)
		c.closeWith(closeGoingAway, "server stopping")
	}
}

// nudge writes {"type":"push"} unless a nudge is already on its way.
func (c *deviceConn) nudge() {
	if !c.nudging.CompareAndSwap(false, true) {
		return
	}
	if c.asked != nil {
		c.asked(c.id) // before the device can answer
	}
	go func() {
		c.nudging.Store(false) // a nudge from now on needs another frame
		if c.write(opText, nudgeMessage) != nil {
			c.end(endWriteFailed)
			c.nc.Close()
		}
	}()
}

// write sends one unfragmented frame of at most 125 bytes. A write that
// fails or times out leaves the TLS state unusable: callers close.
func (c *deviceConn) write(op byte, payload []byte) error {
	if len(payload) > 125 {
		return errors.New("frame too long")
	}
	var b [2 + 125]byte
	b[0], b[1] = 0x80|op, byte(len(payload))
	n := 2 + copy(b[2:], payload)
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.nc.SetWriteDeadline(time.Now().Add(connAnswer))
	_, err := c.nc.Write(b[:n])
	return err
}

// end notes why the server ends c, unless a reason is noted already.
func (c *deviceConn) end(why uint32) { c.ended.CompareAndSwap(0, why+1) }

// reason is why c ended: the noted reason, else endClosed.
func (c *deviceConn) reason() uint32 {
	if r := c.ended.Load(); r > 0 {
		return r - 1
	}
	return endClosed
}

// closeWith sends a close frame and closes the connection; the reading
// goroutine then ends.
func (c *deviceConn) closeWith(code uint16, reason string) {
	var p [125]byte
	binary.BigEndian.PutUint16(p[:], code)
	n := 2 + copy(p[2:], reason)
	c.write(opClose, p[:n])
	c.nc.Close()
}

var errBadUpgrade = &apiError{status: http.StatusBadRequest, code: "invalid_upgrade",
	msg: "a WebSocket upgrade (RFC 6455, version 13) is expected", outcome: outInvalid}

// wsAccept is the Sec-WebSocket-Accept value for a client's key.
func wsAccept(key string) string {
	h := sha1.Sum([]byte(key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"))
	return base64.StdEncoding.EncodeToString(h[:])
}

// headerHas reports whether a comma-separated header holds token.
func headerHas(h http.Header, name, token string) bool {
	for _, v := range h.Values(name) {
		for _, t := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), token) {
				return true
			}
		}
	}
	return false
}

// connect upgrades a device's request to its persistent connection.
func (a *api) connect(w http.ResponseWriter, r *http.Request) {
	rt := &route{endpoint: "connect"}
	token, ok := bearer(r)
	if !ok {
		a.fail(w, rt, errNoBearer)
		return
	}
	id, err := a.fleet.Authenticate(r.Context(), token)
	if err != nil {
		a.fail(w, rt, err)
		return
	}
	key := r.Header.Get("Sec-WebSocket-Key")
	if k, err := base64.StdEncoding.DecodeString(key); err != nil || len(k) != 16 || r.ProtoMajor != 1 ||
		!headerHas(r.Header, "Connection", "upgrade") || !headerHas(r.Header, "Upgrade", "websocket") ||
		r.Header.Get("Sec-WebSocket-Version") != "13" {
		w.Header().Set("Sec-WebSocket-Version", "13")
		a.fail(w, rt, errBadUpgrade)
		return
	}
	nc, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		a.fail(w, rt, err)
		return
	}
	// The client speaks only after the 101; anything buffered is a protocol
	// error. brw (net/http's 4 KiB buffers) is not kept.
	if brw.Reader.Buffered() > 0 {
		nc.Close()
		return
	}
	nc.SetDeadline(time.Now().Add(connAnswer))
	answer := "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: " + wsAccept(key) + "\r\n"
	if a.node != nil { // as every answer: the hijacked connection skips net/http's headers
		answer += "X-Drover-Node: " + a.node[0] + "\r\n"
	}
	if _, err := io.WriteString(nc, answer+"\r\n"); err != nil {
		nc.Close()
		return
	}
	nc.SetDeadline(time.Time{})
	c := &deviceConn{id: id, nc: nc, asked: a.fleet.Nudged}
	if !a.hub.add(c) {
		c.closeWith(closeGoingAway, "server stopping")
		a.m.connectionsEnded.WithLabelValues(endReasons[endStopping]).Inc()
		return
	}
	a.m.connections.Inc()
	if a.tunnels != nil {
		a.tunnels.connected(id)
	}
	if a.fleet.HasCommands(id) {
		c.nudge()
	}
	go a.hold(c) // the handler returns: net/http's goroutine and buffers go
}

// hold reads the device's frames until the connection ends: pongs, pings
// (answered), close; data frames are read and dropped. After connPing of
// silence it pings; no answer within connAnswer ends the connection.
func (a *api) hold(c *deviceConn) {
	defer func() {
		a.m.connections.Dec()
		a.m.connectionsEnded.WithLabelValues(endReasons[c.reason()]).Inc()
	}()
	defer a.hub.remove(c)
	defer c.nc.Close()
	pinged := false
	for {
		wait := connPing
		if pinged {
			wait = connAnswer
		}
		c.nc.SetReadDeadline(time.Now().Add(wait))
		_, err := io.ReadFull(c.nc, c.hdr[:1])
		var ne net.Error
		if err != nil && errors.As(err, &ne) && ne.Timeout() {
			if !pinged {
				if c.write(opPing, nil) != nil {
					c.end(endWriteFailed)
					return
				}
				pinged = true
				continue
			}
			// The answer may be here unread (see connGrace).
			c.nc.SetReadDeadline(time.Now().Add(connGrace))
			if _, err = io.ReadFull(c.nc, c.hdr[:1]); err != nil {
				if errors.As(err, &ne) && ne.Timeout() {
					c.end(endUnanswered)
				}
				return
			}
		}
		if err != nil {
			return
		}
		pinged = false
		c.nc.SetReadDeadline(time.Now().Add(connAnswer)) // the rest of the frame
		code, reason := c.readFrame()
		if code != 0 {
			if code == closeProtocolError || code == closeTooBig {
				c.end(endProtocol)
			}
			c.closeWith(code, reason)
			return
		}
	}
}

// readFrame reads the rest of a frame whose first byte is in c.hdr[0] and
// acts on it; a non-zero code ends the connection with that close code.
func (c *deviceConn) readFrame() (uint16, string) {
	h := c.hdr[:]
	if _, err := io.ReadFull(c.nc, h[1:2]); err != nil {
		return closeProtocolError, "short frame"
	}
	op, fin := h[0]&0x0F, h[0]&0x80 != 0
	if h[0]&0x70 != 0 || h[1]&0x80 == 0 {
		return closeProtocolError, "reserved bits set or frame not masked"
	}
	n, ext := uint64(h[1]&0x7F), 0
	switch n {
	case 126:
		ext = 2
	case 127:
		ext = 8
	}
	if _, err := io.ReadFull(c.nc, h[2:2+ext+4]); err != nil {
		return closeProtocolError, "short frame"
	}
	switch ext {
	case 2:
		n = uint64(binary.BigEndian.Uint16(h[2:4]))
	case 8:
		n = binary.BigEndian.Uint64(h[2:10])
	}
	mask := [4]byte(h[2+ext : 2+ext+4])
	if op >= opClose {
		if n > 125 || !fin {
			return closeProtocolError, "bad control frame"
		}
		p := make([]byte, n)
		if _, err := io.ReadFull(c.nc, p); err != nil {
			return closeProtocolError, "short frame"
		}
		for i := range p {
			p[i] ^= mask[i%4]
		}
		switch op {
		case opClose:
			code := uint16(1000)
			if len(p) >= 2 {
				code = binary.BigEndian.Uint16(p)
			}
			return code, ""
		case opPing:
			if c.write(opPong, p) != nil {
				return closeGoingAway, ""
			}
		case opPong:
		default:
			return closeProtocolError, "unknown opcode"
		}
		return 0, ""
	}
	switch op {
	case opContinuation, opText, opBinary:
	default:
		return closeProtocolError, "unknown opcode"
	}
	if n > protocol.MaxBodyBytes {
		return closeTooBig, "message too big"
	}
	if _, err := io.CopyN(io.Discard, c.nc, int64(n)); err != nil {
		return closeProtocolError, "short frame"
	}
	return 0, ""
}

// connectHandler is the connect route's handler; nil without a hub (tests
// that build an api by hand).
func (a *api) connectHandler() http.Handler {
	if a.hub == nil {
		return nil
	}
	return http.HandlerFunc(a.connect)
}
