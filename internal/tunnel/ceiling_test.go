package tunnel_test

import (
	"crypto/tls"
	"io"
	"net"
	"testing"

	"github.com/drover/drover/internal/server/transport"
)

// BenchmarkHops is the ceiling of a tunnel's design without its code: 100 MB
// per iteration from a client to a sink on loopback, directly ("direct"),
// through two relays that only copy ("3 TCP hops": client → server →
// agent → LAN host), and through the same relays with the two TLS legs a
// tunnel has ("3 hops, 2 TLS legs": client ⇒ server ⇒ agent → LAN host,
// each relay ending one TLS connection and the server opening the next).
// A tunnel carries WebSocket and yamux framing on top of the last.
//
//	go test -run '^$' -bench Hops -benchtime 5x ./internal/tunnel/
func BenchmarkHops(b *testing.B) {
	cfg := selfSignedTLS(b)
	client := &tls.Config{InsecureSkipVerify: true}
	b.Run("direct", func(b *testing.B) { hopsBench(b, sink(b), nil) })
	b.Run("3 TCP hops", func(b *testing.B) {
		agent := relay(b, nil, sink(b), nil)
		server := relay(b, nil, agent, nil)
		hopsBench(b, server, nil)
	})
	b.Run("3 hops, 2 TLS legs", func(b *testing.B) {
		agent := relay(b, cfg, sink(b), nil)
		server := relay(b, cfg, agent, client)
		hopsBench(b, server, client)
	})
}

// hopsBench writes 100 MB per iteration to addr (over TLS with tc) and waits
// for the sink's one-byte receipt.
func hopsBench(b *testing.B, addr string, tc *tls.Config) {
	buf := make([]byte, 256<<10)
	const size = 100 << 20
	b.SetBytes(size)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		c, err := dial(addr, tc)
		if err != nil {
			b.Fatal(err)
		}
		for n := 0; n < size; n += len(buf) {
			if _, err := c.Write(buf); err != nil {
				b.Fatal(err)
			}
		}
		closeWrite(c)
		if _, err := io.ReadFull(c, buf[:1]); err != nil {
			b.Fatal(err)
		}
		c.Close()
	}
}

// dial connects to addr, over TLS with tc when it is not nil.
func dial(addr string, tc *tls.Config) (net.Conn, error) {
	if tc != nil {
		return tls.Dial("tcp", addr, tc)
	}
	return net.Dial("tcp", addr)
}

func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	}
}

// sink reads each connection to its end, then answers one byte.
func sink(b *testing.B) string {
	return listen(b, nil, func(c net.Conn) {
		io.Copy(io.Discard, c)
		c.Write([]byte{1})
	})
}

// relay accepts (over TLS with in) and copies both ways to next (over TLS
// with out).
func relay(b *testing.B, in *tls.Config, next string, out *tls.Config) string {
	return listen(b, in, func(c net.Conn) {
		d, err := dial(next, out)
		if err != nil {
			return
		}
		defer d.Close()
		done := make(chan struct{})
		go func() {
			io.Copy(c, d)
			close(done)
		}()
		io.Copy(d, c)
		closeWrite(d)
		<-done
	})
}

func listen(b *testing.B, tc *tls.Config, serve func(net.Conn)) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if tc != nil {
				c = tls.Server(c, tc)
			}
			go func() {
				defer c.Close()
				serve(c)
			}()
		}
	}()
	return ln.Addr().String()
}

// selfSignedTLS is the server's own generated certificate.
func selfSignedTLS(b *testing.B) *tls.Config {
	certPEM, keyPEM, err := transport.SelfSigned()
	if err != nil {
		b.Fatal(err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		b.Fatal(err)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}}
}
