//go:build !linux

package server

import "net"

// listenDevices opens a device listener (listen_linux.go adds
// TCP_DEFER_ACCEPT where there is one).
func listenDevices(addr string) (net.Listener, error) { return net.Listen("tcp", addr) }
