package alert

import (
	"fmt"
	"time"

	"github.com/drover/drover/internal/fleet"
)

// checkQuota raises quota alerts for the devices that hit a push-rate or
// profile-creation quota within a rule's Seconds, and clears them when the
// device has hit none for that long (docs/alerts.md).
func (e *Engine) checkQuota(rules []*compiled, now time.Time) {
	var quota []*compiled
	for _, r := range rules {
		if r.Kind == Quota && !r.Disabled {
			quota = append(quota, r)
		}
	}
	if len(quota) == 0 {
		return
	}
	type hit struct {
		last        int64
		refused, fw uint64
	}
	hits := map[uint64]hit{}
	for _, h := range e.fleet.QuotaDevices() {
		if n, f := h.Counts[fleet.QuotaPushRate], h.Counts[fleet.QuotaProfileCreate]; n+f > 0 && !h.Lifted {
			hits[h.DeviceID] = hit{h.Last.UnixNano(), n, f}
		}
	}
	nowNs := now.UnixNano()
	e.fleet.Scan(func(d fleet.DeviceInfo) {
		h, ok := hits[d.ID]
		sh := &e.shards[d.ID%nShards]
		for _, r := range quota {
			if !targets(r, d) {
				continue
			}
			k := cellKey{r.gen, d.ID}
			recent := ok && nowNs-h.last <= r.Seconds*int64(time.Second)
			sh.mu.Lock()
			c := sh.m[k]
			switch {
			case recent && c == nil && !r.gone.Load():
				c = &cell{}
				sh.m[k] = c
				c.active = e.raise(r, d.ID, d.DeviceType, float64(h.refused), now,
					fmt.Sprintf("hit a quota: %d pushes refused with 429, %d new firmware not given a profile", h.refused, h.fw))
			case !recent && c != nil:
				if c.active != nil {
					e.clear(r, c.active, now, ReasonNoQuotaHit)
				}
				delete(sh.m, k)
			}
			sh.mu.Unlock()
		}
	})
}
