package storetest

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/drover/drover/internal/fleet"
)

// historyCompactor is a store that packs closed history partitions into
// another form (PostgreSQL: packed rows; SQLite: the history archive):
// CompactHistory does now what its background job does, as of now.
type historyCompactor interface {
	CompactHistory(ctx context.Context, now time.Time) (int, error)
}

// compact runs the store's compaction as of now, if it has one.
func compact(t *testing.T, s fleet.Store, now time.Time) {
	t.Helper()
	if c, ok := s.(historyCompactor); ok {
		if _, err := c.CompactHistory(testCtx(t), now); err != nil {
			t.Fatalf("compact history: %v", err)
		}
	}
}

// testHistoryCompacted: history reads the same before and after its
// partitions are compacted, with samples added late to a compacted
// partition, equal times kept in insertion order; retention over compacted
// history deletes exactly the older samples, in chunks of at most limit.
func testHistoryCompacted(t *testing.T, h *handle) {
	s := h.store
	want := map[uint64][]fleet.Sample{}
	var b fleet.Batch
	// 3 devices, 10 hours at 200 s (phase shifted), in two commits.
	for i := range 3 * 180 {
		id := uint64(i%3 + 1)
		m := sample(id, uint64(i), t0.Add(time.Duration(i/3)*200*time.Second+time.Duration(id)*37*time.Millisecond))
		b.Samples = append(b.Samples, m)
		want[id] = append(want[id], m)
		if i == 3*90 {
			commit(t, s, &b)
			b = fleet.Batch{}
		}
	}
	commit(t, s, &b)
	check := func(when string) {
		t.Helper()
		for id := uint64(1); id <= 3; id++ {
			checkSamples(t, fmt.Sprintf("%s: device %d", when, id), history(t, s, id, fleet.HistoryQuery{Limit: 10000}), want[id])
		}
		d := want[2]
		a, z, n := len(d)/10, len(d)*5/6, len(d)/3
		checkSamples(t, when+": from/to", history(t, s, 2, fleet.HistoryQuery{From: d[a].At, To: d[z].At, Limit: 10000}), d[a:z])
		checkSamples(t, when+": limit", history(t, s, 2, fleet.HistoryQuery{From: d[a].At, Limit: n}), d[a:a+n])
		checkSamples(t, when+": between samples", history(t, s, 2,
			fleet.HistoryQuery{From: d[n].At.Add(time.Millisecond), To: d[n+1].At}), nil)
	}
	check("raw")
	day := t0.Add(24 * time.Hour)
	compact(t, s, day)
	check("compacted")
	compact(t, s, day) // again: nothing changes
	check("compacted twice")

	// Late samples into compacted partitions: one at the time of an
	// existing sample (it comes after it), one between two.
	d1 := want[1]
	tie := sample(1, 9001, d1[120].At)
	mid := sample(1, 9002, d1[150].At.Add(time.Second))
	commit(t, s, &fleet.Batch{Samples: []fleet.Sample{tie, mid}})
	want[1] = slices.Concat(d1[:121], []fleet.Sample{tie}, d1[121:151], []fleet.Sample{mid}, d1[151:])
	check("late samples")
	compact(t, s, day)
	check("late samples compacted")
	h.reopen()
	s = h.store
	check("reopened")

	// Retention with a cutoff within a partition, in small chunks (the late
	// samples are newer: MariaDB prunes by ID, which grows with time only
	// for samples written in time order).
	before := t0.Add(5*time.Hour + 1234*time.Millisecond)
	var older int64
	for id := range want {
		keep := want[id][:0:0]
		for _, m := range want[id] {
			if m.At.Before(before) {
				older++
			} else {
				keep = append(keep, m)
			}
		}
		want[id] = keep
	}
	total, err := s.(fleet.HistoryDropper).DropHistory(testCtx(t), before)
	if err != nil {
		t.Fatal(err)
	}
	const limit = 7
	for calls := 0; ; calls++ {
		got, err := s.PruneHistory(testCtx(t), before, limit)
		if err != nil {
			t.Fatal(err)
		}
		if got > limit {
			t.Fatalf("prune deleted %d with limit %d", got, limit)
		}
		if total += got; got < limit {
			break
		}
		if calls > 1000 {
			t.Fatal("prune never finishes")
		}
	}
	if total != older {
		t.Fatalf("dropped and pruned %d samples, want the %d older than the cutoff", total, older)
	}
	check("after retention")
	compact(t, s, day)
	check("after retention, compacted")
}
