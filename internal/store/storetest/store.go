package storetest

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/drover/drover/internal/fleet"
)

type storeTest struct {
	name string
	fn   func(t *testing.T, h *handle)
}

var storeTests = []storeTest{
	{"Empty", testEmpty},
	{"RegisterAndReregister", testRegisterAndReregister},
	{"States", testStates},
	{"Profiles", testProfiles},
	{"History", testHistory},
	{"Retention", testRetention},
	{"HistoryCompacted", testHistoryCompacted},
	{"Atomic", testAtomic},
	{"DeviceState", testDeviceState},
	{"BigBatch", testBigBatch},
	{"ConcurrentWriters", testConcurrentWriters},
	{"Restart", testRestart},
	{"InstanceLock", testInstanceLock},
	{"Alerts", testAlerts},
	{"Labels", testLabels},
	{"LiveLabels", testLiveLabels},
	{"Sessions", testSessions},
	{"IDsNotReused", testIDsNotReused},
	{"Commands", testCommands},
	{"ConfigLayers", testConfigLayers},
}

// Values chosen to break stores that are not bytes-exact: case and trailing
// blanks (MySQL collations), quotes and backslashes, 4-byte UTF-8.
var trickyMachineIDs = []string{"m-abc", "M-ABC", "m-abc ", "m-abc  ", "ü-ñ-日本-😀", `a'b"c\d`, "%_*", "m-\u00e9", "m-e\u0301"}

func tokenHash(i int) []byte {
	h := make([]byte, 32)
	for j := range h {
		h[j] = byte(i*31 + j*7)
	}
	h[0], h[1], h[2], h[3] = 0x00, 0xff, '\'', '\\'
	return h
}

var t0 = time.Unix(1_700_000_000, 0).UTC()

func device(id uint64, machine string) fleet.DeviceRecord {
	return fleet.DeviceRecord{
		ID: id, MachineID: machine, DeviceType: "rut-x11", Model: "RUTX11 ü", Firmware: "7.04.2", Serial: fmt.Sprintf("SN'%d\\", id),
		TokenHash: tokenHash(int(id)), RegisteredAt: t0.Add(time.Duration(id) * time.Second),
	}
}

func state(id, seq uint64, at time.Time) fleet.StateRecord {
	return fleet.StateRecord{
		DeviceID: id, Firmware: "7.04.2", LastSeen: at, Seq: seq, AppliedVersion: int64(seq % 3),
		State: json.RawMessage(fmt.Sprintf(`{"seq":%d,"name":"ü😀 it's \"q\" \\","x": [1, 2 ]}`, seq)),
	}
}

func ptr[T any](v T) *T { return &v }

func sample(id, seq uint64, at time.Time) fleet.Sample {
	s := fleet.Sample{DeviceID: id, At: at, Seq: seq, Uptime: ptr(int64(seq * 60)), CPU: ptr(float64(seq%100) + 0.125)}
	if seq%2 == 0 {
		s.Temperature, s.RSSI, s.SINR = ptr(-40.25), ptr(-67.5), ptr(12.4)
		s.RxBytes, s.TxBytes = ptr(uint64(1)<<40+seq), ptr(uint64(seq))
		s.MemUsed, s.MemTotal, s.DiskUsed, s.DiskTotal = ptr(int64(1)<<33), ptr(int64(1)<<34), ptr(int64(0)), ptr(int64(seq))
		s.RSRP, s.RSRQ = ptr(-95.0), ptr(-10.5)
	}
	return s
}

func sameSample(a, b fleet.Sample) bool {
	return a.At.UnixMilli() == b.At.UnixMilli() && a.Seq == b.Seq &&
		eq(a.Uptime, b.Uptime) && eq(a.CPU, b.CPU) && eq(a.MemUsed, b.MemUsed) && eq(a.MemTotal, b.MemTotal) &&
		eq(a.DiskUsed, b.DiskUsed) && eq(a.DiskTotal, b.DiskTotal) && eq(a.Temperature, b.Temperature) &&
		eq(a.RxBytes, b.RxBytes) && eq(a.TxBytes, b.TxBytes) && eq(a.RSSI, b.RSSI) && eq(a.RSRP, b.RSRP) &&
		eq(a.RSRQ, b.RSRQ) && eq(a.SINR, b.SINR)
}

func eq[T comparable](a, b *T) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

func fmtSample(s fleet.Sample) string {
	b, _ := json.Marshal(s)
	return fmt.Sprintf("device %d %s", s.DeviceID, b)
}

func profile(id uint64, typ, fw string) fleet.Profile {
	at := t0.Add(time.Duration(id)*time.Millisecond + 123*time.Millisecond)
	return fleet.Profile{ID: id, DeviceType: typ, Firmware: fw, Config: json.RawMessage(`{}`), PushInterval: 200, CreatedAt: at, UpdatedAt: at}
}

func testEmpty(t *testing.T, h *handle) {
	s := h.store
	l := load(t, s)
	if len(l.devices) != 0 || len(l.profiles) != 0 || l.res.MaxDeviceID != 0 || l.res.MaxProfileID != 0 {
		t.Fatalf("new store is not empty: %d devices, %d profiles, max ids %d/%d", len(l.devices), len(l.profiles), l.res.MaxDeviceID, l.res.MaxProfileID)
	}
	if got := history(t, s, 1, fleet.HistoryQuery{}); len(got) != 0 {
		t.Fatalf("history of unknown device: %d samples", len(got))
	}
	if n, err := s.PruneHistory(testCtx(t), time.Now(), 100); n != 0 || err != nil {
		t.Fatalf("prune empty store: %d, %v", n, err)
	}
	commit(t, s, &fleet.Batch{})
}

func testRegisterAndReregister(t *testing.T, h *handle) {
	s := h.store
	b := &fleet.Batch{Profiles: []fleet.Profile{profile(1, "rut-x11", "7.04.2")}}
	var regs []fleet.DeviceRecord
	for i, m := range trickyMachineIDs {
		d := device(uint64(i+1), m)
		regs = append(regs, d)
		b.Devices = append(b.Devices, d)
	}
	commit(t, s, b)
	l := load(t, s)
	if len(l.devices) != len(regs) {
		t.Fatalf("loaded %d devices, want %d (machine IDs must compare byte-exact)", len(l.devices), len(regs))
	}
	for _, r := range regs {
		checkDevice(t, l.devices[r.ID], r, fleet.StateRecord{})
	}
	if l.res.MaxDeviceID != uint64(len(regs)) || l.res.MaxProfileID != 1 {
		t.Fatalf("max ids %d/%d, want %d/1", l.res.MaxDeviceID, l.res.MaxProfileID, len(regs))
	}

	// The device pushes, then re-registers: same ID, new token and details.
	// Its state and first registration time stay.
	st := state(1, 5, t0.Add(time.Hour+123456789))
	commit(t, s, &fleet.Batch{States: []fleet.StateRecord{st}})
	re := regs[0]
	re.TokenHash, re.Serial, re.Model = tokenHash(1000), "new-serial", "RUTX11 v2"
	re.Firmware = st.Firmware
	again := re
	again.RegisteredAt = t0.Add(48 * time.Hour)
	commit(t, s, &fleet.Batch{Devices: []fleet.DeviceRecord{again}})
	l = load(t, s)
	if len(l.devices) != len(regs) {
		t.Fatalf("re-registration changed the device count to %d", len(l.devices))
	}
	checkDevice(t, l.devices[1], re, st)
	for _, r := range regs[1:] {
		checkDevice(t, l.devices[r.ID], r, fleet.StateRecord{})
	}

	// Within one batch the later record of a device wins.
	x, y := regs[1], regs[1]
	x.TokenHash, y.TokenHash = tokenHash(2001), tokenHash(2002)
	y.Serial = "later"
	commit(t, s, &fleet.Batch{Devices: []fleet.DeviceRecord{x, y}})
	checkDevice(t, load(t, s).devices[y.ID], y, fleet.StateRecord{})
}

func testStates(t *testing.T, h *handle) {
	s := h.store
	// A device and its first push in the same batch: devices go first.
	d1, d2, d3 := device(1, "a"), device(2, "b"), device(3, "c")
	s1 := state(1, 1, t0.Add(time.Minute+1))
	commit(t, s, &fleet.Batch{Profiles: []fleet.Profile{profile(1, "rut-x11", "7.04.2")}, Devices: []fleet.DeviceRecord{d1, d2, d3}, States: []fleet.StateRecord{s1}})
	l := load(t, s)
	checkDevice(t, l.devices[1], d1, s1)
	checkDevice(t, l.devices[2], d2, fleet.StateRecord{})

	// Extremes: seq above int64, applied version at int64's maximum, a
	// config error with a NUL byte, non-compact JSON kept as sent, a
	// firmware upgrade; two pushes in one batch (the later wins).
	s2a := state(2, 7, t0.Add(2*time.Minute))
	s2b := fleet.StateRecord{DeviceID: 2, Firmware: "7.05", LastSeen: time.Unix(1_800_000_000, 999_999_999).UTC(), Seq: math.MaxUint64,
		AppliedVersion: math.MaxInt64, ConfigError: "apply failed: \x00 ü 'x' \\n", State: json.RawMessage("{ \"a\" :\t\"ü\" , \"b\": [ ] }")}
	s3 := state(3, 1<<63, t0.Add(3*time.Minute))
	commit(t, s, &fleet.Batch{States: []fleet.StateRecord{s2a, s3, s2b}})
	l = load(t, s)
	checkDevice(t, l.devices[1], d1, s1)
	checkDevice(t, l.devices[2], d2, s2b)
	checkDevice(t, l.devices[3], d3, s3)

	// A later push replaces everything, including clearing the error.
	s2c := state(2, 8, t0.Add(4*time.Minute))
	s2c.Firmware = "7.05"
	commit(t, s, &fleet.Batch{States: []fleet.StateRecord{s2c}})
	checkDevice(t, load(t, s).devices[2], d2, s2c)
}

func testProfiles(t *testing.T, h *handle) {
	s := h.store
	p1, p2, p3 := profile(1, "rut-x11", "7.04.2"), profile(2, "rut-x11", "7.05"), profile(3, "RUT-X11", "7.04.2")
	p2.Config = json.RawMessage("{\"ntp\": \"pool.ntp.org\",  \"n\": [1, 2]}")
	commit(t, s, &fleet.Batch{Profiles: []fleet.Profile{p1, p2, p3}})
	l := load(t, s)
	if len(l.profiles) != 3 || l.res.MaxProfileID != 3 {
		t.Fatalf("loaded %d profiles, max id %d; want 3, 3 (profile keys compare byte-exact)", len(l.profiles), l.res.MaxProfileID)
	}
	for _, p := range []fleet.Profile{p1, p2, p3} {
		checkProfile(t, l.profiles[p.ID], p)
	}
	// Updates; two versions of one profile in a batch: the later wins.
	u1 := p1
	u1.Version, u1.Config, u1.PushInterval, u1.UpdatedAt = 1, json.RawMessage(`{"x":"'\\ü"}`), 60, p1.UpdatedAt.Add(time.Hour+7*time.Millisecond)
	u2 := u1
	u2.Version, u2.Config, u2.UpdatedAt = 2, json.RawMessage(`{"x":2}`), u1.UpdatedAt.Add(time.Millisecond)
	commit(t, s, &fleet.Batch{Profiles: []fleet.Profile{u1, u2}})
	l = load(t, s)
	checkProfile(t, l.profiles[1], u2)
	checkProfile(t, l.profiles[2], p2)
}

func testHistory(t *testing.T, h *handle) {
	s := h.store
	var b fleet.Batch
	want := map[uint64][]fleet.Sample{}
	for i := range 60 {
		id := uint64(i%3 + 1)
		m := sample(id, uint64(i), t0.Add(time.Duration(i)*time.Second+time.Duration(i)*time.Millisecond))
		b.Samples = append(b.Samples, m)
		want[id] = append(want[id], m)
	}
	// Two samples of one device in the same millisecond: insertion order.
	tie1, tie2 := sample(1, 1001, t0.Add(time.Hour)), sample(1, 1000, t0.Add(time.Hour))
	b.Samples = append(b.Samples, tie1, tie2)
	want[1] = append(want[1], tie1, tie2)
	// Counters beyond int64 are kept as int64's maximum.
	huge := sample(4, 1, t0)
	huge.RxBytes, huge.TxBytes = ptr(uint64(math.MaxUint64)), ptr(uint64(math.MaxInt64))
	empty := fleet.Sample{DeviceID: 4, At: t0.Add(time.Second), Seq: 2}
	b.Samples = append(b.Samples, huge, empty)
	commit(t, s, &b)
	for id := uint64(1); id <= 3; id++ {
		checkSamples(t, fmt.Sprintf("device %d", id), history(t, s, id, fleet.HistoryQuery{}), want[id])
	}
	clamped := huge
	clamped.RxBytes = ptr(uint64(math.MaxInt64))
	checkSamples(t, "device 4", history(t, s, 4, fleet.HistoryQuery{}), []fleet.Sample{clamped, empty})

	// From is inclusive, To exclusive, Limit keeps the oldest.
	d2 := want[2]
	checkSamples(t, "from/to", history(t, s, 2, fleet.HistoryQuery{From: d2[3].At, To: d2[7].At}), d2[3:7])
	checkSamples(t, "from", history(t, s, 2, fleet.HistoryQuery{From: d2[15].At}), d2[15:])
	checkSamples(t, "to", history(t, s, 2, fleet.HistoryQuery{To: d2[1].At}), d2[:1])
	checkSamples(t, "limit", history(t, s, 2, fleet.HistoryQuery{From: d2[2].At, Limit: 5}), d2[2:7])
	checkSamples(t, "empty range", history(t, s, 2, fleet.HistoryQuery{From: d2[5].At, To: d2[5].At}), nil)

	// The default limit is 1000.
	b = fleet.Batch{}
	for i := range 1005 {
		b.Samples = append(b.Samples, fleet.Sample{DeviceID: 9, At: t0.Add(time.Duration(i) * time.Millisecond), Seq: uint64(i)})
	}
	commit(t, s, &b)
	got := history(t, s, 9, fleet.HistoryQuery{})
	if len(got) != 1000 || got[0].Seq != 0 || got[999].Seq != 999 {
		t.Fatalf("default limit: %d samples", len(got))
	}
}

func testRetention(t *testing.T, h *handle) {
	s := h.store
	const n, limit = 1000, 64
	var all [2][]fleet.Sample
	for c := range 4 { // four commits, appended in time order
		var b fleet.Batch
		for i := c * n / 4; i < (c+1)*n/4; i++ {
			m := sample(uint64(i%2+1), uint64(i), t0.Add(time.Duration(i)*time.Second))
			b.Samples = append(b.Samples, m)
			all[i%2] = append(all[i%2], m)
		}
		commit(t, s, &b)
	}
	before := t0.Add(500*time.Second + 500*time.Millisecond) // samples 0..500 are older
	var total int64
	calls := 0
	for {
		got, err := s.PruneHistory(testCtx(t), before, limit)
		if err != nil {
			t.Fatal(err)
		}
		if got > limit {
			t.Fatalf("prune deleted %d with limit %d", got, limit)
		}
		total += got
		if calls++; got < limit {
			break
		}
		if calls > 100 {
			t.Fatal("prune never finishes")
		}
	}
	if total != 501 || calls != 501/limit+1 {
		t.Fatalf("pruned %d in %d calls, want 501 in %d", total, calls, 501/limit+1)
	}
	for d := range 2 {
		var keep []fleet.Sample
		for _, m := range all[d] {
			if !m.At.Before(before) {
				keep = append(keep, m)
			}
		}
		checkSamples(t, fmt.Sprintf("device %d after prune", d+1), history(t, s, uint64(d+1), fleet.HistoryQuery{Limit: n}), keep)
	}
	if got, err := s.PruneHistory(testCtx(t), before, limit); got != 0 || err != nil {
		t.Fatalf("second prune: %d, %v", got, err)
	}
	// New samples after a prune are kept in order with the rest.
	late := sample(1, 5000, t0.Add(2*n*time.Second))
	commit(t, s, &fleet.Batch{Samples: []fleet.Sample{late}})
	got := history(t, s, 1, fleet.HistoryQuery{Limit: n})
	if len(got) == 0 || !sameSample(got[len(got)-1], late) {
		t.Fatalf("sample committed after the prune is not last")
	}
	if got, err := s.PruneHistory(testCtx(t), t0.Add(3*n*time.Second), 10000); got != int64(n-501+1) || err != nil {
		t.Fatalf("prune everything: %d, %v; want %d", got, err, n-501+1)
	}
}

// testAtomic commits a batch whose profile clashes with another's (device
// type, firmware): the commit fails and nothing of the batch is stored.
func testAtomic(t *testing.T, h *handle) {
	s := h.store
	d1, st1 := device(1, "one"), state(1, 1, t0)
	commit(t, s, &fleet.Batch{Profiles: []fleet.Profile{profile(1, "a", "1")}, Devices: []fleet.DeviceRecord{d1}, States: []fleet.StateRecord{st1}})
	bad := &fleet.Batch{
		Profiles: []fleet.Profile{profile(2, "b", "1"), profile(3, "a", "1")},
		Devices:  []fleet.DeviceRecord{device(2, "two")},
		States:   []fleet.StateRecord{state(1, 2, t0.Add(time.Hour))},
		Samples:  []fleet.Sample{sample(1, 2, t0)},
	}
	if err := s.Commit(testCtx(t), bad); err == nil {
		t.Fatal("a profile with another profile's (device type, firmware) was committed")
	}
	l := load(t, s)
	if len(l.devices) != 1 || len(l.profiles) != 1 {
		t.Fatalf("after the failed commit: %d devices, %d profiles; want 1, 1", len(l.devices), len(l.profiles))
	}
	checkDevice(t, l.devices[1], d1, st1)
	if got := history(t, s, 1, fleet.HistoryQuery{}); len(got) != 0 {
		t.Fatalf("failed commit left %d samples", len(got))
	}
	// The store still works.
	bad.Profiles = bad.Profiles[:1]
	commit(t, s, bad)
	if l := load(t, s); len(l.devices) != 2 || len(l.profiles) != 2 || l.devices[1].State.Seq != 2 {
		t.Fatalf("after the good commit: %d devices, %d profiles", len(l.devices), len(l.profiles))
	}
}

func testDeviceState(t *testing.T, h *handle) {
	sr := h.store
	st := state(1, 3, t0)
	commit(t, h.store, &fleet.Batch{Devices: []fleet.DeviceRecord{device(1, "a"), device(2, "b")}, States: []fleet.StateRecord{st}})
	for _, c := range []struct {
		id   uint64
		want string
	}{{1, string(st.State)}, {2, ""}, {99, ""}} {
		got, err := sr.DeviceState(testCtx(t), c.id)
		if err != nil || string(got) != c.want {
			t.Errorf("DeviceState(%d) = %q, %v; want %q", c.id, got, err, c.want)
		}
	}
}

// testBigBatch commits more than any single statement should carry, with
// one state as large as the protocol allows.
func testBigBatch(t *testing.T, h *handle) {
	s := h.store
	const n = 20000
	var b fleet.Batch
	for i := 1; i <= n; i++ {
		b.Devices = append(b.Devices, device(uint64(i), fmt.Sprintf("big-%d", i)))
	}
	commit(t, s, &b)
	b = fleet.Batch{}
	pad := strings.Repeat("x", 600)
	for i := 1; i <= n; i++ {
		st := state(uint64(i), uint64(i), t0.Add(time.Duration(i)*time.Millisecond))
		st.State = json.RawMessage(fmt.Sprintf(`{"i":%d,"pad":"%s"}`, i, pad))
		b.States = append(b.States, st)
		b.Samples = append(b.Samples, sample(uint64(i), uint64(i), st.LastSeen))
	}
	largeState := json.RawMessage(`{"blob":"` + strings.Repeat("ü", 30000) + `"}`)
	b.States[n/2].State = largeState
	commit(t, s, &b)
	l := load(t, s)
	if len(l.devices) != n {
		t.Fatalf("loaded %d devices, want %d", len(l.devices), n)
	}
	for _, i := range []int{1, n / 2, n/2 + 1, n} {
		checkDevice(t, l.devices[uint64(i)], device(uint64(i), fmt.Sprintf("big-%d", i)), b.States[i-1])
	}
	for i := 1; i <= n; i++ {
		if l.devices[uint64(i)].State.Seq != uint64(i) {
			t.Fatalf("device %d: seq %d", i, l.devices[uint64(i)].State.Seq)
		}
	}
	if got := history(t, s, n, fleet.HistoryQuery{}); len(got) != 1 {
		t.Fatalf("device %d: %d samples", n, len(got))
	}
	if pruned, err := s.PruneHistory(testCtx(t), t0.Add(time.Hour), 100000); pruned != n || err != nil {
		t.Fatalf("pruned %d, %v; want %d", pruned, err, n)
	}
}

// testConcurrentWriters commits from many goroutines at once: each has its
// own devices, and all of them also update a shared set of devices in
// different orders, which lock-based databases may answer with deadlocks
// that the store must resolve itself.
func testConcurrentWriters(t *testing.T, h *handle) {
	s := h.store
	const writers, commits, perCommit, shared = 8, 20, 5, 6
	var pre fleet.Batch
	for i := 1; i <= shared; i++ {
		pre.Devices = append(pre.Devices, device(uint64(i), fmt.Sprintf("shared-%d", i)))
	}
	commit(t, s, &pre)
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			for c := range commits {
				var b fleet.Batch
				for k := range perCommit {
					id := uint64(1000 + w*commits*perCommit + c*perCommit + k)
					at := t0.Add(time.Duration(c) * time.Second)
					b.Devices = append(b.Devices, device(id, fmt.Sprintf("w%d-%d", w, id)))
					b.States = append(b.States, state(id, uint64(c+1), at))
					b.Samples = append(b.Samples, sample(id, uint64(c+1), at))
				}
				for _, k := range rng.Perm(shared) {
					b.States = append(b.States, state(uint64(k+1), uint64(w*1000+c), t0))
				}
				if err := s.Commit(testCtx(t), &b); err != nil {
					errs <- fmt.Errorf("writer %d commit %d: %w", w, c, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	l := load(t, s)
	if len(l.devices) != shared+writers*commits*perCommit {
		t.Fatalf("%d devices, want %d", len(l.devices), shared+writers*commits*perCommit)
	}
	for id, d := range l.devices {
		if id <= shared {
			if w, c := d.State.Seq/1000, d.State.Seq%1000; w >= writers || c >= commits {
				t.Errorf("shared device %d: seq %d was never written", id, d.State.Seq)
			}
			continue
		}
		if d.State.Seq == 0 {
			t.Errorf("device %d lost its state", id)
		}
		if got := history(t, s, id, fleet.HistoryQuery{}); len(got) != 1 {
			t.Errorf("device %d: %d samples, want 1", id, len(got))
		}
	}
}

func testRestart(t *testing.T, h *handle) {
	s := h.store
	var b fleet.Batch
	regs := map[uint64]fleet.DeviceRecord{}
	states := map[uint64]fleet.StateRecord{}
	for i := 1; i <= 500; i++ {
		d := device(uint64(i), fmt.Sprintf("r-%d", i))
		regs[d.ID] = d
		b.Devices = append(b.Devices, d)
		if i%5 != 0 {
			st := state(d.ID, uint64(i), t0.Add(time.Duration(i)*time.Microsecond))
			states[d.ID] = st
			b.States = append(b.States, st)
			b.Samples = append(b.Samples, sample(d.ID, uint64(i), st.LastSeen), sample(d.ID, uint64(i)+1, st.LastSeen.Add(time.Second)))
		}
	}
	b.Profiles = []fleet.Profile{profile(1, "rut-x11", "7.04.2"), profile(7, "trb140", "1.0")}
	commit(t, s, &b)
	wantHist := history(t, s, 3, fleet.HistoryQuery{})
	s = h.reopen()
	l := load(t, s)
	if len(l.devices) != len(regs) || len(l.profiles) != 2 || l.res.MaxDeviceID != 500 || l.res.MaxProfileID != 7 {
		t.Fatalf("after restart: %d devices, %d profiles, max ids %d/%d", len(l.devices), len(l.profiles), l.res.MaxDeviceID, l.res.MaxProfileID)
	}
	for id, r := range regs {
		checkDevice(t, l.devices[id], r, states[id])
	}
	checkProfile(t, l.profiles[7], b.Profiles[1])
	if len(wantHist) != 2 {
		t.Fatalf("history before restart: %d samples", len(wantHist))
	}
	checkSamples(t, "history after restart", history(t, s, 3, fleet.HistoryQuery{}), wantHist)
	// Writing goes on where it stopped.
	st := state(3, 99, t0.Add(time.Hour))
	commit(t, s, &fleet.Batch{States: []fleet.StateRecord{st}, Samples: []fleet.Sample{sample(3, 99, t0.Add(time.Hour))}})
	s = h.reopen()
	checkDevice(t, load(t, s).devices[3], regs[3], st)
	if got := history(t, s, 3, fleet.HistoryQuery{}); len(got) != 3 || got[2].Seq != 99 {
		t.Fatalf("history after second restart: %d samples", len(got))
	}
}
