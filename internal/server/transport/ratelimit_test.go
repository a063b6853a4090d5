package transport

import (
	"testing"
	"time"
)

func TestRegLimiter(t *testing.T) {
	exempt, err := ParsePrefixes("127.0.0.0/8, ::1, 192.0.2.7")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ParsePrefixes("10.0.0.0/33"); err == nil {
		t.Fatal("bad prefix accepted")
	}
	l := NewRegisterLimiter(RegisterLimits{PerAddress: 1, PerAddressBurst: 2, Exempt: exempt})
	now := time.Unix(1000, 0)
	for _, addr := range []string{"127.0.0.5:1", "[::1]:2", "192.0.2.7:3", "[::ffff:127.0.0.1]:4"} {
		for i := range 10 {
			if ok, _ := l.Allow(addr, now); !ok {
				t.Fatalf("exempt %s refused at %d", addr, i)
			}
		}
	}
	// 2001:db8:1:2::/64 is one subscriber: its addresses share a bucket.
	for i, addr := range []string{"[2001:db8:1:2::1]:1", "[2001:db8:1:2::ffff]:1"} {
		if ok, _ := l.Allow(addr, now); !ok {
			t.Fatalf("registration %d refused", i)
		}
	}
	ok, wait := l.Allow("[2001:db8:1:2::3]:9", now)
	if ok || wait <= 0 || wait > time.Second {
		t.Fatalf("third from one /64: %v %v", ok, wait)
	}
	if ok, _ := l.Allow("[2001:db8:1:3::1]:1", now); !ok {
		t.Fatal("another /64 refused")
	}
	if ok, _ := l.Allow("[2001:db8:1:2::3]:9", now.Add(time.Second)); !ok {
		t.Fatal("refilled bucket refused")
	}
	// Idle addresses are forgotten.
	l.Allow("198.51.100.1:1", now)
	l.mu.Lock()
	n := len(l.addrs)
	l.sweep(now.Add(time.Hour))
	left := len(l.addrs)
	l.mu.Unlock()
	if n != 3 || left != 0 {
		t.Fatalf("tracked %d, after sweep %d", n, left)
	}
	if NewRegisterLimiter(RegisterLimits{}) != nil {
		t.Fatal("no limits should make no limiter")
	}
}
