//go:build !linux

package transport

import "net"

// Listen opens a device listener (listen_linux.go adds
// TCP_DEFER_ACCEPT where there is one).
func Listen(addr string) (net.Listener, error) { return net.Listen("tcp", addr) }
