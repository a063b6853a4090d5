// Package timeorder finds a time cutoff in a table whose ids grow with time
// (samples appended in time order), by binary search on the id: no index on
// time is needed to prune by time. Bounds reads a history query.
package timeorder

import (
	"math"

	"github.com/drover/drover/internal/fleet"
)

// FirstFrom returns the smallest id in [lo, hi] whose row is at or after at,
// or hi+1 when there is none. next(m) returns the first row with id >= m and
// its time, ok false when there is none.
func FirstFrom(lo, hi, at int64, next func(m int64) (id, t int64, ok bool, err error)) (int64, error) {
	// Invariant: every id < l is before at; the answer is within [l, h].
	l, h := lo, hi+1
	for l < h {
		m := l + (h-l)/2
		id, t, ok, err := next(m)
		if err != nil {
			return 0, err
		}
		if !ok {
			h = m
			continue
		}
		if t < at {
			l = id + 1
		} else {
			h = m
		}
	}
	return l, nil
}

// Bounds returns a history query's range in unix ms (zero From and To:
// unbounded) and its limit (0: the default, 1000).
func Bounds(q fleet.HistoryQuery) (from, to int64, limit int) {
	from, to, limit = math.MinInt64, math.MaxInt64, q.Limit
	if !q.From.IsZero() {
		from = q.From.UnixMilli()
	}
	if !q.To.IsZero() {
		to = q.To.UnixMilli()
	}
	if limit <= 0 {
		limit = 1000
	}
	return from, to, limit
}
