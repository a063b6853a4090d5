package server

import (
	"net"
	"testing"
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
