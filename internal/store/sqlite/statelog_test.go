package sqlite

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/drover/drover/internal/fleet"
	"github.com/drover/drover/internal/testwait"
)

// noMerger stops the background merger for a test: it calls MergeStateLog.
func noMerger(t *testing.T) {
	old := logCheckEvery
	logCheckEvery = 0
	t.Cleanup(func() { logCheckEvery = old })
}

func stateOf(id uint64, seq uint64, fw string) fleet.StateRecord {
	return fleet.StateRecord{DeviceID: id, Firmware: fw, LastSeen: time.Unix(1_700_000_000+int64(seq), 0), Seq: seq,
		AppliedVersion: int64(seq) * 10, ConfigError: fmt.Sprintf("e%d", seq), State: json.RawMessage(fmt.Sprintf(`{"seq":%d}`, seq))}
}

func loadAll(t *testing.T, s *Store) map[uint64]fleet.DeviceRecord {
	t.Helper()
	out := map[uint64]fleet.DeviceRecord{}
	if _, err := s.Load(context.Background(), fleet.LoadOptions{}, func(d fleet.DeviceRecord) error { out[d.ID] = d; return nil }); err != nil {
		t.Fatal(err)
	}
	return out
}

func checkDevice(t *testing.T, s *Store, got fleet.DeviceRecord, want fleet.StateRecord) {
	t.Helper()
	if got.Firmware != want.Firmware || got.State.Seq != want.Seq || !got.State.LastSeen.Equal(want.LastSeen) ||
		got.State.AppliedVersion != want.AppliedVersion || got.State.ConfigError != want.ConfigError || string(got.State.State) != string(want.State) {
		t.Fatalf("device %d: got fw %q seq %d seen %v applied %d err %q state %s; want %+v", got.ID, got.Firmware, got.State.Seq,
			got.State.LastSeen, got.State.AppliedVersion, got.State.ConfigError, got.State.State, want)
	}
	st, err := s.DeviceState(context.Background(), got.ID)
	if err != nil || string(st) != string(want.State) {
		t.Fatalf("DeviceState(%d) = %s, %v; want %s", got.ID, st, err, want.State)
	}
}

// States go through the log and merges; what a reopened store loads, and
// what DeviceState reads, is always each device's newest state, also the
// firmware of a re-registration that came after its last push.
func TestStateLogKeepsNewestStates(t *testing.T) {
	noMerger(t)
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "d.db")
	s, err := Open(ctx, path, true)
	if err != nil {
		t.Fatal(err)
	}
	reg := func(id uint64, fw string) fleet.DeviceRecord {
		return fleet.DeviceRecord{ID: id, MachineID: fmt.Sprintf("m%d", id), DeviceType: "router", Firmware: fw, TokenHash: make([]byte, 32), RegisteredAt: time.Unix(1_700_000_000, 0)}
	}
	commit := func(b fleet.Batch) {
		t.Helper()
		if err := s.Commit(ctx, &b); err != nil {
			t.Fatal(err)
		}
	}
	commit(fleet.Batch{Devices: []fleet.DeviceRecord{reg(1, "1.0"), reg(2, "1.0"), reg(3, "1.0")}})
	want := map[uint64]fleet.StateRecord{}
	push := func(id, seq uint64, fw string) {
		st := stateOf(id, seq, fw)
		commit(fleet.Batch{States: []fleet.StateRecord{st}})
		want[id] = st
	}
	push(1, 1, "1.0")
	push(2, 2, "1.0")
	push(1, 3, "1.1")
	if err := s.MergeStateLog(ctx); err != nil { // generation 1 merged and dropped
		t.Fatal(err)
	}
	push(3, 4, "1.0")
	push(2, 5, "1.0")
	// Device 2 registers again with new firmware after its last push.
	commit(fleet.Batch{Devices: []fleet.DeviceRecord{reg(2, "2.0")}})
	w2 := want[2]
	w2.Firmware = "2.0"
	want[2] = w2
	for id, w := range want {
		got := loadAll(t, s)[id]
		checkDevice(t, s, got, w)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	// After a restart (the log replayed), and after merging everything.
	for round := range 2 {
		if s, err = Open(ctx, path, true); err != nil {
			t.Fatal(err)
		}
		if round == 1 {
			if err := s.MergeStateLog(ctx); err != nil {
				t.Fatal(err)
			}
			var gens int
			if err := s.w.QueryRow(`SELECT count(*) FROM state_logs`).Scan(&gens); err != nil || gens != 1 {
				t.Fatalf("generations after merging everything: %d, %v; want 1 (the open one)", gens, err)
			}
			var fw string
			var seq int64
			if err := s.w.QueryRow(`SELECT firmware, seq FROM devices WHERE id = 2`).Scan(&fw, &seq); err != nil || fw != "2.0" || seq != 5 {
				t.Fatalf("devices row 2 after the merge: %q %d %v", fw, seq, err)
			}
		}
		all := loadAll(t, s)
		for id, w := range want {
			checkDevice(t, s, all[id], w)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// Merges run while commits go on: nothing committed is lost or replaced by
// an older state.
func TestStateLogMergesUnderCommits(t *testing.T) {
	noMerger(t)
	old := mergeChunk
	mergeChunk = 7 // many merge transactions between the commits
	t.Cleanup(func() { mergeChunk = old })
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "d.db")
	s, err := Open(ctx, path, true)
	if err != nil {
		t.Fatal(err)
	}
	const devices = 200
	var reg fleet.Batch
	for i := uint64(1); i <= devices; i++ {
		reg.Devices = append(reg.Devices, fleet.DeviceRecord{ID: i, MachineID: fmt.Sprintf("m%d", i), DeviceType: "router", Firmware: "1.0", TokenHash: make([]byte, 32), RegisteredAt: time.Now()})
	}
	if err := s.Commit(ctx, &reg); err != nil {
		t.Fatal(err)
	}
	want := map[uint64]fleet.StateRecord{}
	var committed atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for seq := uint64(1); ; seq++ {
			select {
			case <-stop:
				return
			default:
			}
			var b fleet.Batch
			for k := range 10 {
				id := (seq*31+uint64(k)*17)%devices + 1
				st := stateOf(id, seq*100+uint64(k), "1.0")
				b.States = append(b.States, st)
				want[id] = st
			}
			if err := s.Commit(ctx, &b); err != nil {
				t.Error(err)
				return
			}
			committed.Add(1)
		}
	}()
	for range 5 {
		// Each merge finds commits made since the one before.
		since := committed.Load()
		testwait.For(t, 10*time.Second, "commits since the last merge", func() bool { return committed.Load() >= since+3 })
		if err := s.MergeStateLog(ctx); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if s, err = Open(ctx, path, true); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	all := loadAll(t, s)
	for id, w := range want {
		checkDevice(t, s, all[id], w)
	}
}

// A merged generation is unlisted before its rows are deleted: the table of
// one unlisted but not dropped (a crash during the gentle drop) is not read
// when the store opens, and the next merge drops it.
func TestStateLogUnlistedGenerationIsDropped(t *testing.T) {
	noMerger(t)
	oldChunk := dropChunk
	dropChunk = 3
	t.Cleanup(func() { dropChunk = oldChunk })
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "d.db")
	s, err := Open(ctx, path, true)
	if err != nil {
		t.Fatal(err)
	}
	var b fleet.Batch
	want := map[uint64]fleet.StateRecord{}
	for id := uint64(1); id <= 10; id++ {
		b.Devices = append(b.Devices, fleet.DeviceRecord{ID: id, MachineID: fmt.Sprintf("m%d", id), DeviceType: "router", Firmware: "1.0", TokenHash: make([]byte, 32), RegisteredAt: time.Unix(1_700_000_000, 0)})
		st := stateOf(id, id+10, "1.0")
		b.States = append(b.States, st)
		want[id] = st
	}
	if err := s.Commit(ctx, &b); err != nil {
		t.Fatal(err)
	}
	if err := s.MergeStateLog(ctx); err != nil {
		t.Fatal(err)
	}
	if ok, err := s.hasTable(ctx, logTable(1)); ok || err != nil {
		t.Fatalf("merged generation 1 still has its table (%v)", err)
	}
	// An unlisted generation left behind, with older states of devices 1-5.
	if _, err := s.w.Exec(`CREATE TABLE state_log_0 (device_id INTEGER NOT NULL, firmware TEXT NOT NULL, last_seen INTEGER NOT NULL,
		seq INTEGER NOT NULL, applied_version INTEGER NOT NULL, config_error TEXT NOT NULL, state BLOB)`); err != nil {
		t.Fatal(err)
	}
	for id := 1; id <= 5; id++ {
		if _, err := s.w.Exec(`INSERT INTO state_log_0 VALUES (?, '0.9', 1, 1, 1, '', '{"seq":1}')`, id); err != nil {
			t.Fatal(err)
		}
	}
	s.Close()
	if s, err = Open(ctx, path, true); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if !s.states.unlisted {
		t.Fatal("open did not notice the unlisted generation")
	}
	all := loadAll(t, s)
	for id, w := range want {
		checkDevice(t, s, all[id], w)
	}
	if err := s.MergeStateLog(ctx); err != nil {
		t.Fatal(err)
	}
	if ok, err := s.hasTable(ctx, "state_log_0"); ok || err != nil || s.states.unlisted {
		t.Fatalf("the unlisted generation was not dropped (%v)", err)
	}
}

// A merge reports its steps to the upkeep observer: the merge's
// transactions with the devices they moved, the unlisting with the
// generation's devices, the drop's deletes with their rows.
func TestStateLogMergeReportsUpkeep(t *testing.T) {
	noMerger(t)
	ctx := context.Background()
	s, err := Open(ctx, filepath.Join(t.TempDir(), "d.db"), true)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var mu sync.Mutex
	items, steps := map[string]int64{}, map[string]int{}
	s.ObserveUpkeep(func(work string, n int64, took time.Duration, err error) {
		if err != nil || took < 0 {
			t.Errorf("%s: took %v, err %v", work, took, err)
		}
		mu.Lock()
		items[work] += n
		steps[work]++
		mu.Unlock()
	})
	b := registered(1200)
	for id := uint64(1); id <= 1200; id++ {
		b.States = append(b.States, stateOf(id, id, "1.0"))
	}
	if err := s.Commit(ctx, &b); err != nil {
		t.Fatal(err)
	}
	if err := s.MergeStateLog(ctx); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	// 1,200 devices in chunks of mergeChunk, one transaction each.
	if chunks := (1200 + mergeChunk - 1) / mergeChunk; items["state_log_merge"] != 1200 || steps["state_log_merge"] != chunks {
		t.Errorf("merge: %d devices in %d steps; want 1200 in %d", items["state_log_merge"], steps["state_log_merge"], chunks)
	}
	if items["state_log_unlist"] != 1200 || steps["state_log_unlist"] != 1 {
		t.Errorf("unlist: %d devices in %d steps; want 1200 in 1", items["state_log_unlist"], steps["state_log_unlist"])
	}
	if items["state_log_drop"] != 1200 || steps["state_log_drop"] < 2 {
		t.Errorf("drop: %d rows in %d steps; want 1200 in at least 2 (the deletes, the drop)", items["state_log_drop"], steps["state_log_drop"])
	}
}

// A generation whose devices start pushing again is due for merging once a
// hundredth of its rows, and at least logRotateRewrites, were rewritten:
// each rewrite is a random page write.
func TestStateLogRotatesOnRewrites(t *testing.T) {
	noMerger(t)
	old := logRotateRewrites
	logRotateRewrites = 10
	t.Cleanup(func() { logRotateRewrites = old })
	ctx := context.Background()
	s, err := Open(ctx, filepath.Join(t.TempDir(), "d.db"), true)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	push := func(ids []uint64, seq uint64) {
		t.Helper()
		var b fleet.Batch
		for _, id := range ids {
			b.States = append(b.States, stateOf(id, seq, "1.0"))
		}
		if err := s.Commit(ctx, &b); err != nil {
			t.Fatal(err)
		}
	}
	due := func() bool {
		s.states.mu.Lock()
		defer s.states.mu.Unlock()
		return s.states.due()
	}
	reg := registered(2000)
	var all []uint64
	for _, d := range reg.Devices {
		all = append(all, d.ID)
	}
	if err := s.Commit(ctx, &reg); err != nil {
		t.Fatal(err)
	}
	push(all, 1)
	if due() {
		t.Fatal("due after one push per device")
	}
	push(all[:19], 2) // 19 rewrites of 2,019 rows: under a hundredth
	if due() {
		t.Fatal("due after 19 rewrites")
	}
	push(all[19:21], 2) // 21 of 2,021: a hundredth
	if !due() {
		t.Fatal("not due after 21 rewrites of 2,021 rows")
	}
	if err := s.MergeStateLog(ctx); err != nil {
		t.Fatal(err)
	}
	if due() {
		t.Fatal("due after the merge")
	}
	push(all[:30], 3) // new rows in the new generation, not rewrites
	if due() {
		t.Fatal("due after first pushes into the new generation")
	}
}

// registered is a batch registering devices 1 to n.
func registered(n uint64) fleet.Batch {
	var b fleet.Batch
	for id := uint64(1); id <= n; id++ {
		b.Devices = append(b.Devices, fleet.DeviceRecord{ID: id, MachineID: fmt.Sprintf("m%d", id), DeviceType: "router", Firmware: "1.0",
			TokenHash: make([]byte, 32), RegisteredAt: time.Unix(1_700_000_000, 0)})
	}
	return b
}
