package transport

import (
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// RegisterLimits bound registrations (docs/operations.md#registration-rate-limits).
type RegisterLimits struct {
	Rate            float64        // per second in total; 0: unlimited
	Burst           int            // registrations in total at once
	PerAddress      float64        // per second per source address (IPv6: per /64); 0: unlimited
	PerAddressBurst int            // registrations per address at once
	Exempt          []netip.Prefix // addresses without a per-address limit
}

// maxTracked bounds the per-address table; beyond it idle entries are
// dropped early, and addresses that find no room share one limiter.
const maxTracked = 100_000

// RegisterLimiter applies RegisterLimits with golang.org/x/time/rate
// buckets. It is safe for concurrent use.
type RegisterLimiter struct {
	total  *rate.Limiter // nil: unlimited
	per    rate.Limit
	burst  int
	exempt []netip.Prefix

	mu        sync.Mutex
	addrs     map[netip.Addr]*addrLimit
	overflow  *rate.Limiter // shared by addresses that found the table full
	lastSweep time.Time
}

type addrLimit struct {
	lim  *rate.Limiter
	seen time.Time
}

// NewRegisterLimiter is the limiter of l, or nil when l limits nothing.
func NewRegisterLimiter(l RegisterLimits) *RegisterLimiter {
	if l.Rate <= 0 && l.PerAddress <= 0 {
		return nil
	}
	rl := &RegisterLimiter{per: rate.Limit(l.PerAddress), burst: max(1, l.PerAddressBurst), exempt: l.Exempt, addrs: map[netip.Addr]*addrLimit{}}
	if l.Rate > 0 {
		rl.total = rate.NewLimiter(rate.Limit(l.Rate), max(1, l.Burst))
	}
	if l.PerAddress > 0 {
		rl.overflow = rate.NewLimiter(rl.per, rl.burst)
	}
	return rl
}

// take takes one token from lim at now, or tells how long until one is free.
func take(lim *rate.Limiter, now time.Time) (bool, time.Duration) {
	res := lim.ReserveN(now, 1)
	if !res.OK() {
		return false, time.Minute
	}
	if d := res.DelayFrom(now); d > 0 {
		res.CancelAt(now)
		return false, d
	}
	return true, 0
}

// Allow decides one registration from remote (host:port) at now; refused,
// it tells how long until one would be allowed.
func (l *RegisterLimiter) Allow(remote string, now time.Time) (bool, time.Duration) {
	if l.per > 0 {
		if lim := l.limiterFor(remote, now); lim != nil {
			if ok, wait := take(lim, now); !ok {
				return false, wait
			}
		}
	}
	if l.total != nil {
		return take(l.total, now)
	}
	return true, 0
}

// limiterFor finds the address's bucket; nil when it is exempt.
func (l *RegisterLimiter) limiterFor(remote string, now time.Time) *rate.Limiter {
	host := remote
	if h, _, err := net.SplitHostPort(remote); err == nil {
		host = h
	}
	addr, err := netip.ParseAddr(strings.TrimPrefix(strings.TrimSuffix(host, "]"), "["))
	if err != nil {
		return l.overflow
	}
	addr = addr.Unmap()
	for _, p := range l.exempt {
		if p.Contains(addr) {
			return nil
		}
	}
	if addr.Is6() {
		addr = netip.PrefixFrom(addr, 64).Masked().Addr() // one subscriber's whole /64
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if e, ok := l.addrs[addr]; ok {
		e.seen = now
		return e.lim
	}
	if len(l.addrs) >= maxTracked || now.Sub(l.lastSweep) > time.Minute {
		l.sweep(now)
	}
	if len(l.addrs) >= maxTracked {
		return l.overflow
	}
	e := &addrLimit{lim: rate.NewLimiter(l.per, l.burst), seen: now}
	l.addrs[addr] = e
	return e.lim
}

// sweep drops addresses whose bucket has refilled (idle long enough that a
// fresh bucket is the same); l.mu held.
func (l *RegisterLimiter) sweep(now time.Time) {
	l.lastSweep = now
	idle := time.Duration(float64(l.burst)/float64(l.per)*float64(time.Second)) + time.Second
	for a, e := range l.addrs {
		if now.Sub(e.seen) > idle {
			delete(l.addrs, a)
		}
	}
}

// ParsePrefixes reads a comma-separated list of CIDR prefixes or addresses
// (RegisterLimits.Exempt).
func ParsePrefixes(v string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, f := range strings.Split(v, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if !strings.Contains(f, "/") {
			a, err := netip.ParseAddr(f)
			if err != nil {
				return nil, err
			}
			out = append(out, netip.PrefixFrom(a, a.BitLen()))
			continue
		}
		p, err := netip.ParsePrefix(f)
		if err != nil {
			return nil, err
		}
		out = append(out, p.Masked())
	}
	return out, nil
}
