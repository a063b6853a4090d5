package agent

import (
	"math/rand/v2"
	"time"
)

// backoff yields exponentially growing, capped delays with jitter. Every
// delay is at least half of its nominal value, so retries never spin.
type backoff struct {
	min, max time.Duration
	n        int
	rand     func() float64 // [0,1); nil: math/rand
}

func (b *backoff) next() time.Duration {
	d := b.min
	for i := 0; i < b.n && d < b.max; i++ {
		d *= 2
	}
	d = min(d, b.max)
	if d < b.max {
		b.n++
	}
	return d/2 + time.Duration(b.random()*float64(d/2))
}

func (b *backoff) reset() { b.n = 0 }

func (b *backoff) random() float64 {
	if b.rand != nil {
		return b.rand()
	}
	return rand.Float64()
}

// retryAfterDelay spreads a server's Retry-After over up to half of it again
// (at least one second), so that devices told to come back together do not.
func (b *backoff) retryAfterDelay(ra time.Duration) time.Duration {
	spread := max(ra/2, time.Second)
	return ra + time.Duration(b.random()*float64(spread))
}
