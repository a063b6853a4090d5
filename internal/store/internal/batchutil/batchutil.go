// Package batchutil prepares a fleet.Batch for set-based SQL statements,
// which must not touch one row twice: one record per key, the batch's last
// (fleet.Batch's rule), ordered by key so that concurrent transactions lock
// rows in the same order.
package batchutil

import (
	"math"
	"slices"
	"time"

	"github.com/drover/drover/internal/fleet"
)

// LastPerKey returns in's last record for every key, ordered by key. It
// returns in itself when its keys already strictly increase.
func LastPerKey[T any](in []T, key func(*T) uint64) []T {
	sorted := true
	for i := 1; i < len(in); i++ {
		if key(&in[i-1]) >= key(&in[i]) {
			sorted = false
			break
		}
	}
	if sorted {
		return in
	}
	last := make(map[uint64]int, len(in))
	for i := range in {
		last[key(&in[i])] = i
	}
	out := make([]T, 0, len(last))
	for i := range in {
		if last[key(&in[i])] == i {
			out = append(out, in[i])
		}
	}
	slices.SortFunc(out, func(a, b T) int {
		ka, kb := key(&a), key(&b)
		switch {
		case ka < kb:
			return -1
		case ka > kb:
			return 1
		}
		return 0
	})
	return out
}

// Profiles, Devices and States apply LastPerKey with the batch's keys.
func Profiles(in []fleet.Profile) []fleet.Profile {
	return LastPerKey(in, func(p *fleet.Profile) uint64 { return p.ID })
}

func Devices(in []fleet.DeviceRecord) []fleet.DeviceRecord {
	return LastPerKey(in, func(d *fleet.DeviceRecord) uint64 { return d.ID })
}

func States(in []fleet.StateRecord) []fleet.StateRecord {
	return LastPerKey(in, func(s *fleet.StateRecord) uint64 { return s.DeviceID })
}

// ClampU stores counters above int64's range as its maximum, as every
// backend does (SQL has no unsigned 64-bit integer everywhere).
func ClampU(v *uint64) *int64 {
	if v == nil {
		return nil
	}
	x := int64(math.MaxInt64)
	if *v < math.MaxInt64 {
		x = int64(*v)
	}
	return &x
}

// UnclampU reads back a stored counter.
func UnclampU(v *int64) *uint64 {
	if v == nil {
		return nil
	}
	x := uint64(*v)
	return &x
}

// LastSeen is the stored form of a push time: unix ns, 0 for never.
func LastSeen(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

// FromLastSeen reads LastSeen's form back.
func FromLastSeen(ns int64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns).UTC()
}
