// Package tunnel is Drover's port forwarding (docs/remote-access.md): the
// device's allow-list of destinations, the stream protocol between server
// and agent carried by a yamux session, byte-counting copies, and the
// operator's client that opens a local port.
package tunnel

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
)

// AllowList is the destinations an agent may reach for the server: its
// local configuration, never widened by the server. The zero value (and
// nil) allows nothing.
type AllowList struct {
	rules []rule
}

// rule is one pattern: a host name, or an address prefix (a single
// address is a /32 or /128), with a port range.
type rule struct {
	host   string       // lower case, no trailing dot; "" for a prefix
	prefix netip.Prefix // valid when host is ""
	lo, hi uint16
}

// ParseAllowList reads a comma-separated list of HOST:PORT, IP:PORT and
// CIDR:PORT patterns (IPv6 in brackets: [fd00::/8]:22). PORT is a number,
// a range LO-HI or *. An empty string allows nothing.
func ParseAllowList(s string) (*AllowList, error) {
	l := &AllowList{}
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p == "" {
			continue
		}
		r, err := parseRule(p)
		if err != nil {
			return nil, err
		}
		l.rules = append(l.rules, r)
	}
	return l, nil
}

func parseRule(p string) (rule, error) {
	i := strings.LastIndexByte(p, ':')
	if i <= 0 {
		return rule{}, fmt.Errorf("tunnel allow-list: %q is not HOST:PORT, IP:PORT or CIDR:PORT", p)
	}
	host, port := p[:i], p[i+1:]
	var r rule
	switch {
	case port == "*":
		r.lo, r.hi = 1, 65535
	case strings.Contains(port, "-"):
		a, b, _ := strings.Cut(port, "-")
		lo, err1 := parsePort(a)
		hi, err2 := parsePort(b)
		if err1 != nil || err2 != nil || lo > hi {
			return rule{}, fmt.Errorf("tunnel allow-list: %q: the port range must be LO-HI within 1-65535", p)
		}
		r.lo, r.hi = lo, hi
	default:
		n, err := parsePort(port)
		if err != nil {
			return rule{}, fmt.Errorf("tunnel allow-list: %q: %w", p, err)
		}
		r.lo, r.hi = n, n
	}
	if strings.HasPrefix(host, "[") {
		if !strings.HasSuffix(host, "]") {
			return rule{}, fmt.Errorf("tunnel allow-list: %q: unclosed [", p)
		}
		host = host[1 : len(host)-1]
	} else if strings.Contains(host, ":") {
		return rule{}, fmt.Errorf("tunnel allow-list: %q: write IPv6 addresses in brackets, [ADDR]:PORT", p)
	}
	if pr, err := netip.ParsePrefix(host); err == nil {
		r.prefix = pr.Masked()
		return r, nil
	}
	if ad, err := netip.ParseAddr(host); err == nil {
		r.prefix = netip.PrefixFrom(ad.Unmap(), ad.Unmap().BitLen())
		return r, nil
	}
	if strings.Contains(host, "/") || !validHostName(host) {
		return rule{}, fmt.Errorf("tunnel allow-list: %q: %q is no host name, address or CIDR prefix", p, host)
	}
	r.host = strings.ToLower(strings.TrimSuffix(host, "."))
	return r, nil
}

func parsePort(s string) (uint16, error) {
	n, err := strconv.ParseUint(s, 10, 16)
	if err != nil || n == 0 {
		return 0, fmt.Errorf("port %q is not 1-65535", s)
	}
	return uint16(n), nil
}

// validHostName: letters, digits, '-', '_' and dots, at most 253 bytes.
func validHostName(h string) bool {
	if h == "" || len(h) > 253 {
		return false
	}
	for i := 0; i < len(h); i++ {
		c := h[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_' || c == '.') {
			return false
		}
	}
	return true
}

// Empty says whether l allows nothing (tunnels are off).
func (l *AllowList) Empty() bool { return l == nil || len(l.rules) == 0 }

// String is l as ParseAllowList reads it.
func (l *AllowList) String() string {
	if l == nil {
		return ""
	}
	var b []string
	for _, r := range l.rules {
		h := r.host
		if h == "" {
			h = r.prefix.String()
			if r.prefix.IsSingleIP() {
				h = r.prefix.Addr().String()
			}
			if r.prefix.Addr().Is6() {
				h = "[" + h + "]"
			}
		}
		p := strconv.Itoa(int(r.lo))
		switch {
		case r.lo == 1 && r.hi == 65535:
			p = "*"
		case r.lo != r.hi:
			p += "-" + strconv.Itoa(int(r.hi))
		}
		b = append(b, h+":"+p)
	}
	return strings.Join(b, ",")
}

// ErrNotAllowed is a destination outside the allow-list.
var ErrNotAllowed = errors.New("not in this device's tunnel allow-list")

// ErrOff is any destination while the allow-list is empty.
var ErrOff = errors.New("tunnels are off on this device (no --tunnel-allow)")

// Resolver looks a host name up; net.DefaultResolver.LookupNetIP("ip", …)
// fits.
type Resolver func(ctx context.Context, host string) ([]netip.Addr, error)

// Resolve checks the destination HOST:PORT against l and returns the
// address to dial: HOST:PORT itself when a host name pattern names HOST,
// else one of HOST's addresses that an address pattern allows (the
// address is dialled, not the name again, so that a second lookup cannot
// answer otherwise). Errors wrap ErrOff or ErrNotAllowed, or are the
// lookup's.
func (l *AllowList) Resolve(ctx context.Context, dest string, lookup Resolver) (string, error) {
	if l.Empty() {
		return "", ErrOff
	}
	host, port, err := SplitDestination(dest)
	if err != nil {
		return "", err
	}
	name := strings.ToLower(strings.TrimSuffix(host, "."))
	addr, literal := netip.ParseAddr(host)
	if literal == nil {
		addr = addr.Unmap()
		if addr.Zone() != "" {
			return "", fmt.Errorf("%s: %w", dest, ErrNotAllowed)
		}
		if l.allowsAddr(addr, port) {
			return net.JoinHostPort(addr.String(), strconv.Itoa(int(port))), nil
		}
		return "", fmt.Errorf("%s: %w", dest, ErrNotAllowed)
	}
	for _, r := range l.rules {
		if r.host != "" && r.host == name && r.lo <= port && port <= r.hi {
			return net.JoinHostPort(host, strconv.Itoa(int(port))), nil
		}
	}
	if !l.anyPrefix(port) {
		return "", fmt.Errorf("%s: %w", dest, ErrNotAllowed)
	}
	addrs, err := lookup(ctx, host)
	if err != nil {
		return "", fmt.Errorf("%s: %w", dest, err)
	}
	for _, a := range addrs {
		if a = a.Unmap(); l.allowsAddr(a, port) {
			return net.JoinHostPort(a.String(), strconv.Itoa(int(port))), nil
		}
	}
	return "", fmt.Errorf("%s (%v): %w", dest, addrs, ErrNotAllowed)
}

func (l *AllowList) allowsAddr(a netip.Addr, port uint16) bool {
	for _, r := range l.rules {
		if r.host == "" && r.prefix.Contains(a) && r.lo <= port && port <= r.hi {
			return true
		}
	}
	return false
}

func (l *AllowList) anyPrefix(port uint16) bool {
	for _, r := range l.rules {
		if r.host == "" && r.lo <= port && port <= r.hi {
			return true
		}
	}
	return false
}

// SplitDestination splits HOST:PORT (IPv6 in brackets) and checks it.
func SplitDestination(dest string) (string, uint16, error) {
	host, ps, err := net.SplitHostPort(dest)
	if err != nil || host == "" {
		return "", 0, fmt.Errorf("destination %q is not HOST:PORT", dest)
	}
	port, err := parsePort(ps)
	if err != nil {
		return "", 0, fmt.Errorf("destination %q: %w", dest, err)
	}
	if _, err := netip.ParseAddr(host); err != nil && !validHostName(host) {
		return "", 0, fmt.Errorf("destination %q: %q is no host name or address", dest, host)
	}
	return host, port, nil
}
