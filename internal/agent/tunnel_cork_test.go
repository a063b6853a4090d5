package agent

import (
	"bytes"
	"net"
	"testing"
)

// countConn records each write that reaches the connection.
type countConn struct {
	net.Conn
	writes [][]byte
}

func (c *countConn) Write(p []byte) (int, error) {
	c.writes = append(c.writes, append([]byte(nil), p...))
	return len(p), nil
}

// chunkedConn stands for the WebSocket library: one message goes to the
// connection below in 4 KiB writes.
type chunkedConn struct {
	net.Conn
	below net.Conn
}

func (c *chunkedConn) Write(p []byte) (int, error) {
	for i := 0; i < len(p); i += 4096 {
		if _, err := c.below.Write(p[i:min(i+4096, len(p))]); err != nil {
			return i, err
		}
	}
	return len(p), nil
}

// TestLinkWriteIsOneTCPWrite: a message the yamux session sends on the
// link reaches the TCP connection as one write, however the layers above
// cut it; writes outside a message (control frames) pass straight on.
func TestLinkWriteIsOneTCPWrite(t *testing.T) {
	tcp := &countConn{}
	cork := &corkConn{}
	cork.set(tcp)
	w := &corkedWriter{Conn: &chunkedConn{below: cork}, cork: cork}

	msg := bytes.Repeat([]byte("x"), 20000)
	if n, err := w.Write(msg); n != len(msg) || err != nil {
		t.Fatalf("Write: %d, %v", n, err)
	}
	if len(tcp.writes) != 1 || !bytes.Equal(tcp.writes[0], msg) {
		t.Fatalf("%d TCP writes for one 20,000-byte message, want 1 with its bytes", len(tcp.writes))
	}
	if _, err := cork.Write([]byte("pong")); err != nil {
		t.Fatal(err)
	}
	if len(tcp.writes) != 2 || string(tcp.writes[1]) != "pong" {
		t.Fatalf("a write outside a message was held: %q", tcp.writes[1:])
	}
}
