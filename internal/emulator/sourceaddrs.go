package emulator

import (
	"fmt"
	"net"
	"strconv"
	"strings"
)

// ParseSourceAddrs parses "a,b,c" where each item is an IPv4 address or a
// range a-b (the end may be its last byte only: 127.0.0.1-8).
func ParseSourceAddrs(s string) ([]net.IP, error) {
	if s == "" {
		return nil, nil
	}
	var out []net.IP
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		lo, hi, isRange := strings.Cut(item, "-")
		a := net.ParseIP(lo)
		if a == nil {
			return nil, fmt.Errorf("--source-addrs: %q is not an IP address", lo)
		}
		if !isRange {
			out = append(out, a)
			continue
		}
		a4 := a.To4()
		if a4 == nil {
			return nil, fmt.Errorf("--source-addrs: ranges are for IPv4 only (%q)", item)
		}
		var b4 net.IP
		if n, err := strconv.Atoi(hi); err == nil && n >= 0 && n <= 255 {
			b4 = net.IPv4(a4[0], a4[1], a4[2], byte(n)).To4()
		} else if b := net.ParseIP(hi); b != nil && b.To4() != nil {
			b4 = b.To4()
		} else {
			return nil, fmt.Errorf("--source-addrs: %q: bad range end", item)
		}
		if !a4[:3].Equal(b4[:3]) || b4[3] < a4[3] {
			return nil, fmt.Errorf("--source-addrs: %q: a range stays within one /24 and goes up", item)
		}
		for x := int(a4[3]); x <= int(b4[3]); x++ {
			out = append(out, net.IPv4(a4[0], a4[1], a4[2], byte(x)))
		}
	}
	return out, nil
}
