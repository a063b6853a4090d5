package emulator

import "syscall"

// ipBindAddressNoPort is IP_BIND_ADDRESS_NO_PORT (Linux 4.2+).
const ipBindAddressNoPort = 24

// bindNoPort lets a dial bound to a source address pick its port at
// connect time, so each source address gets ~28k ports per destination
// instead of ~28k in total.
func bindNoPort(network, address string, c syscall.RawConn) error {
	var serr error
	err := c.Control(func(fd uintptr) {
		serr = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_IP, ipBindAddressNoPort, 1)
	})
	if err != nil {
		return err
	}
	return serr
}
