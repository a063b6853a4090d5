//go:build !linux

package emulator

import (
	"net"
	"time"
)

type rawDialer struct{}

// newRawDialer: only Linux has the lean dialer; elsewhere net.Dialer dials.
func newRawDialer(*net.TCPAddr, net.IP, bool) (*rawDialer, bool) { return nil, false }

func (d *rawDialer) dial(time.Time) (net.Conn, error) { panic("unreachable") }
