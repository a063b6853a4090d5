// Package httpclose ends an HTTP/1 connection after an answer given without
// reading the request's body (a body declared over a limit) so that the
// client reads the answer rather than a connection reset.
package httpclose

import (
	"io"
	"net/http"
	"time"
)

// How long a closing connection keeps reading, and how much, so that a
// client still sending its body sees the answer: closing a socket with
// unread bytes makes the kernel send a reset, which may reach the client
// before it has read the answer. Bounded so that a client declaring more
// than it sends, or sending without end, holds the connection briefly.
const (
	lingerIdle  = 250 * time.Millisecond
	lingerTotal = 2 * time.Second
	lingerBytes = 4 << 20
)

// After marks the answer about to be written to w as the connection's last
// (Connection: close) and returns the function to run once it is written:
// it sends the answer at once, reads and discards what the client still
// sends (up to 4 MiB, for at most 2 s, a quarter second of silence ends it), and then
// lets net/http close the connection without reading more. HTTP/2 resets
// the stream instead: both are no-ops there.
func After(w http.ResponseWriter, r *http.Request) func() {
	if r.ProtoMajor != 1 {
		return func() {}
	}
	w.Header().Set("Connection", "close")
	rc := http.NewResponseController(w)
	// Reading the body after the answer needs full duplex on HTTP/1.
	rc.EnableFullDuplex()
	return func() {
		if rc.Flush() == nil {
			drain(rc, r.Body)
		}
		rc.SetReadDeadline(time.Now())
	}
}

func drain(rc *http.ResponseController, body io.Reader) {
	if body == nil || body == http.NoBody {
		return
	}
	end := time.Now().Add(lingerTotal)
	buf := make([]byte, 32<<10)
	for read := 0; read < lingerBytes; {
		next := time.Now().Add(lingerIdle)
		if next.After(end) {
			next = end
		}
		if rc.SetReadDeadline(next) != nil {
			return
		}
		n, err := body.Read(buf)
		read += n
		if err != nil {
			return
		}
	}
}
