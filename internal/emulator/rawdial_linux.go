package emulator

import (
	"net"
	"os"
	"syscall"
	"time"
)

// rawDialer opens the emulator's TCP connections with the fewest system
// calls that still make a real connection: socket, bind (from a source
// address), connect, and the Go poller's registration. net.Dialer adds
// what one request per connection does not need: keep-alive and no-delay
// options (four setsockopt calls; no-delay is set for TLS only), getsockopt, getsockname and getpeername
// after connect, and a context watcher per dial.
type rawDialer struct {
	raddr   syscall.Sockaddr
	remote  net.Addr
	laddr   syscall.Sockaddr // nil: the kernel's choice
	family  int
	noDelay bool
}

// newRawDialer dials raddr from source (nil: any). noDelay turns Nagle's
// algorithm off, which TLS needs: its handshake writes several times
// before an answer, and a small write waiting for the previous one's
// (delayed) acknowledgement costs 40 ms. A plain HTTP request is one write.
func newRawDialer(raddr *net.TCPAddr, source net.IP, noDelay bool) (*rawDialer, bool) {
	d := &rawDialer{remote: raddr, noDelay: noDelay}
	if ip4 := raddr.IP.To4(); ip4 != nil {
		d.family = syscall.AF_INET
		d.raddr = &syscall.SockaddrInet4{Port: raddr.Port, Addr: [4]byte(ip4)}
	} else if ip16 := raddr.IP.To16(); ip16 != nil && raddr.Zone == "" {
		d.family = syscall.AF_INET6
		d.raddr = &syscall.SockaddrInet6{Port: raddr.Port, Addr: [16]byte(ip16)}
	} else {
		return nil, false
	}
	if source != nil {
		if ip4 := source.To4(); ip4 != nil && d.family == syscall.AF_INET {
			d.laddr = &syscall.SockaddrInet4{Addr: [4]byte(ip4)}
		} else if ip16 := source.To16(); ip16 != nil && ip4 == nil && d.family == syscall.AF_INET6 {
			d.laddr = &syscall.SockaddrInet6{Addr: [16]byte(ip16)}
		} else {
			return nil, false
		}
	}
	return d, true
}

// dial starts a connection and returns it at once: the connect completes
// in the kernel while the first write waits for it in the poller (a write
// to a socket still connecting returns EAGAIN; a failed connect fails the
// write with its error). deadline bounds connect and everything after it.
func (d *rawDialer) dial(deadline time.Time) (net.Conn, error) {
	fd, err := syscall.Socket(d.family, syscall.SOCK_STREAM|syscall.SOCK_NONBLOCK|syscall.SOCK_CLOEXEC, syscall.IPPROTO_TCP)
	if err != nil {
		return nil, os.NewSyscallError("socket", err)
	}
	if d.laddr != nil {
		if d.family == syscall.AF_INET {
			// Port chosen at connect time: ~28k ports per source address
			// and destination instead of ~28k in total.
			syscall.SetsockoptInt(fd, syscall.IPPROTO_IP, ipBindAddressNoPort, 1)
		}
		if err := syscall.Bind(fd, ownSockaddr(d.laddr)); err != nil {
			syscall.Close(fd)
			return nil, os.NewSyscallError("bind", err)
		}
	}
	if d.noDelay {
		syscall.SetsockoptInt(fd, syscall.IPPROTO_TCP, syscall.TCP_NODELAY, 1)
	}
	if err := syscall.Connect(fd, ownSockaddr(d.raddr)); err != nil && err != syscall.EINPROGRESS && err != syscall.EINTR {
		syscall.Close(fd)
		return nil, os.NewSyscallError("connect", err)
	}
	f := os.NewFile(uintptr(fd), "tcp")
	if err := f.SetDeadline(deadline); err != nil {
		f.Close() // not pollable: should not happen for a non-blocking socket
		return nil, err
	}
	return &fileConn{File: f, remote: d.remote}, nil
}

// ownSockaddr copies a shared address for one system call: Bind and
// Connect write the address's raw form into it, so concurrent dials must
// not share one.
func ownSockaddr(sa syscall.Sockaddr) syscall.Sockaddr {
	switch a := sa.(type) {
	case *syscall.SockaddrInet4:
		c := *a
		return &c
	case *syscall.SockaddrInet6:
		c := *a
		return &c
	}
	return sa
}

// fileConn is a connected socket as a net.Conn (os.File does the polling
// and deadlines).
type fileConn struct {
	*os.File
	remote net.Addr
}

func (c *fileConn) LocalAddr() net.Addr  { return nil }
func (c *fileConn) RemoteAddr() net.Addr { return c.remote }
