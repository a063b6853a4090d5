package server

import (
	"io"
	"net"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// TestReadFrame: client frames must be masked, data frames beyond the
// body limit end the connection, pings are answered with their payload,
// and a close ends the connection with the client's code.
func TestReadFrame(t *testing.T) {
	mask := []byte{1, 2, 3, 4}
	masked := func(b0 byte, payload string) []byte {
		f := []byte{b0, 0x80 | byte(len(payload))}
		f = append(f, mask...)
		for i := range len(payload) {
			f = append(f, payload[i]^mask[i%4])
		}
		return f
	}
	for _, tc := range []struct {
		name  string
		frame []byte
		code  uint16
		pong  string
	}{
		{"unmasked", []byte{0x81, 0x01, 'x'}, closeProtocolError, ""},
		{"reserved bits", masked(0xC1, "x"), closeProtocolError, ""},
		{"too big", append([]byte{0x82, 0x80 | 127, 0, 0, 0, 0, 0x7f, 0, 0, 0}, mask...), closeTooBig, ""},
		{"unknown opcode", masked(0x83, ""), closeProtocolError, ""},
		{"text dropped", masked(0x81, "hello"), 0, ""},
		{"ping", masked(0x89, "hi"), 0, "hi"},
		{"close", masked(0x88, "\x03\xe8bye"), 1000, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, cli := net.Pipe()
			defer srv.Close()
			defer cli.Close()
			go cli.Write(tc.frame)
			pong := make(chan string, 1)
			go func() {
				b := make([]byte, 64)
				n, _ := cli.Read(b)
				if n >= 2 && b[0] == 0x80|opPong {
					pong <- string(b[2:n])
				}
				close(pong)
			}()
			c := &deviceConn{nc: srv}
			if _, err := srv.Read(c.hdr[:1]); err != nil {
				t.Fatal(err)
			}
			code, _ := c.readFrame()
			if code != tc.code {
				t.Fatalf("code %d, want %d", code, tc.code)
			}
			if tc.pong != "" {
				if got := <-pong; got != tc.pong {
					t.Fatalf("pong %q, want %q", got, tc.pong)
				}
			}
		})
	}
}

// lateConn answers the first read after a ping with a timeout although the
// pong is on its way: a goroutine scheduled after its deadline on a busy
// machine.
type lateConn struct {
	net.Conn
	late atomic.Bool
}

func (l *lateConn) Write(b []byte) (int, error) {
	if len(b) > 0 && b[0] == 0x80|opPing {
		l.late.Store(true)
	}
	return l.Conn.Write(b)
}

func (l *lateConn) Read(b []byte) (int, error) {
	if l.late.CompareAndSwap(true, false) {
		return 0, os.ErrDeadlineExceeded
	}
	return l.Conn.Read(b)
}

// TestHoldPongAfterDeadline: a pong that is there when the answer's
// deadline has passed keeps the connection (the grace read), a ping never
// answered ends it, and each end is counted by its reason.
func TestHoldPongAfterDeadline(t *testing.T) {
	defer func(p, a time.Duration) { connPing, connAnswer = p, a }(connPing, connAnswer)
	connPing, connAnswer = 20*time.Millisecond, 200*time.Millisecond
	a := &api{m: newMetrics(), hub: newHub()}
	start := func(id uint64) (net.Conn, chan struct{}) {
		srv, cli := net.Pipe()
		c := &deviceConn{id: id, nc: &lateConn{Conn: srv}}
		a.hub.add(c)
		a.m.connections.Inc()
		done := make(chan struct{})
		go func() { a.hold(c); close(done) }()
		return cli, done
	}
	readPing := func(cli net.Conn) {
		t.Helper()
		cli.SetReadDeadline(time.Now().Add(5 * time.Second))
		b := make([]byte, 2)
		if _, err := io.ReadFull(cli, b); err != nil || b[0] != 0x80|opPing {
			t.Fatalf("no ping: %x %v", b, err)
		}
	}
	value := func(c prometheus.Metric) float64 {
		var m dto.Metric
		c.Write(&m)
		return m.GetCounter().GetValue() + m.GetGauge().GetValue()
	}
	ended := func(reason string) float64 { return value(a.m.connectionsEnded.WithLabelValues(reason)) }

	cli, done := start(1)
	readPing(cli)
	if _, err := cli.Write([]byte{0x80 | opPong, 0x80, 1, 2, 3, 4}); err != nil {
		t.Fatalf("the connection ended before its pong was read: %v", err)
	}
	readPing(cli) // still held: pinged again
	if n := a.hub.connected(); n != 1 || ended("unanswered") != 0 {
		t.Fatalf("held %d, unanswered %v after a pong read late", n, ended("unanswered"))
	}
	cli.Close()
	<-done
	if ended("closed") != 1 {
		t.Fatalf("closed %v, want 1", ended("closed"))
	}

	cli, done = start(2)
	readPing(cli) // and never answer
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("an unanswered ping did not end the connection")
	}
	cli.Close()
	if ended("unanswered") != 1 || a.hub.connected() != 0 || value(a.m.connections) != 0 {
		t.Fatalf("unanswered %v, held %d, gauge %v", ended("unanswered"), a.hub.connected(), value(a.m.connections))
	}
}
