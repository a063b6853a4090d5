package transport

import (
	"context"
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// Listen opens a device listener with TCP_DEFER_ACCEPT: the kernel
// hands a connection to accept only once its first bytes (the request, or
// TLS's ClientHello) have arrived, so the server never parks a goroutine
// waiting for them, and connections that send nothing cost no accept and
// take no busy slot of the server's accept gate. A connection silent for
// longer than the timeout is accepted anyway, as without the option.
func Listen(addr string) (net.Listener, error) {
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_DEFER_ACCEPT, 5)
		})
		if err != nil {
			return err
		}
		return serr
	}}
	return lc.Listen(context.Background(), "tcp", addr)
}
