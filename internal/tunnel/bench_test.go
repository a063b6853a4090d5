package tunnel_test

import (
	"context"
	"io"
	"net"
	"testing"
)

// BenchmarkTunnelUpload sends 100 MB per iteration through a tunnel of an
// in-process server and agent to a sink on loopback (profiling:
// -cpuprofile); scripts/bench-tunnel.sh measures the real binaries.
func BenchmarkTunnelUpload(b *testing.B) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				io.Copy(io.Discard, c)
				c.Write([]byte{1})
				c.Close()
			}()
		}
	}()
	r := startRig(b, ln.Addr().String(), nil)
	buf := make([]byte, 256<<10)
	const size = 100 << 20
	b.SetBytes(size)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		c, err := r.operatorC.Dial(context.Background(), r.device, ln.Addr().String())
		if err != nil {
			b.Fatal(err)
		}
		for n := 0; n < size; n += len(buf) {
			if _, err := c.Write(buf); err != nil {
				b.Fatal(err)
			}
		}
		c.(interface{ CloseWrite() error }).CloseWrite()
		if _, err := io.ReadFull(c, buf[:1]); err != nil {
			b.Fatal(err)
		}
		c.Close()
	}
}
