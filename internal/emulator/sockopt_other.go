//go:build !linux

package emulator

import "syscall"

func bindNoPort(network, address string, c syscall.RawConn) error { return nil }
