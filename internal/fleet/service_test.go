package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/drover/drover/internal/protocol"
)

// recStore is an in-memory Store that records commits.
type recStore struct {
	mu       sync.Mutex
	commits  int
	records  int
	profiles map[uint64]Profile
	devices  map[uint64]DeviceRecord
	states   map[uint64]StateRecord
	samples  []Sample
	fail     atomic.Bool
	delay    time.Duration
}

func newRecStore() *recStore {
	return &recStore{profiles: map[uint64]Profile{}, devices: map[uint64]DeviceRecord{}, states: map[uint64]StateRecord{}}
}

func (s *recStore) Load(ctx context.Context, _ LoadOptions, each func(DeviceRecord) error) (LoadResult, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var res LoadResult
	for _, p := range s.profiles {
		res.Profiles = append(res.Profiles, p)
		res.MaxProfileID = max(res.MaxProfileID, p.ID)
	}
	for id, d := range s.devices {
		d.State = s.states[id]
		if d.State.Firmware == "" {
			d.State.Firmware = d.Firmware
		}
		res.MaxDeviceID = max(res.MaxDeviceID, id)
		if err := each(d); err != nil {
			return res, err
		}
	}
	return res, nil
}

func (s *recStore) Commit(ctx context.Context, b *Batch) error {
	time.Sleep(s.delay) // a slow store: the latency the tests put under the service
	if s.fail.Load() {
		return errors.New("disk on fire")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.commits++
	s.records += b.Len()
	for _, p := range b.Profiles {
		s.profiles[p.ID] = p
	}
	for _, d := range b.Devices {
		s.devices[d.ID] = d
	}
	for _, st := range b.States {
		s.states[st.DeviceID] = st
	}
	s.samples = append(s.samples, b.Samples...)
	return nil
}

func (s *recStore) History(ctx context.Context, id uint64, q HistoryQuery) ([]Sample, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Sample
	for _, m := range s.samples {
		if m.DeviceID == id {
			out = append(out, m)
		}
	}
	return out, nil
}

func (s *recStore) PruneHistory(ctx context.Context, before time.Time, limit int) (int64, error) {
	return 0, nil
}
func (s *recStore) Close() error { return nil }

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func newService(t *testing.T, st *recStore) (*Service, *clock, *WriteThrough) {
	t.Helper()
	c := &clock{t: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	wt := NewWriteThrough(st, 0, nil)
	t.Cleanup(func() { wt.Close(context.Background()) })
	s, err := New(context.Background(), Stores{Devices: st}, wt, Options{EnrollmentSecret: "sesame", DefaultPushInterval: 100, Now: c.now})
	if err != nil {
		t.Fatal(err)
	}
	return s, c, wt
}

func reg(machine string) protocol.RegisterRequest {
	return protocol.RegisterRequest{MachineID: machine, DeviceType: "ICR-3241", Firmware: "6.3.5", EnrollmentSecret: "sesame"}
}

func push(seq uint64, applied int64) protocol.PushRequest {
	cpu := 10.0
	return protocol.PushRequest{Seq: seq, ConfigVersion: applied, State: protocol.State{CPU: &cpu}, RawState: json.RawMessage(`{"cpu":10}`)}
}

func TestRegisterAndReRegister(t *testing.T) {
	ctx := context.Background()
	s, _, _ := newService(t, newRecStore())
	if _, err := s.Register(ctx, protocol.RegisterRequest{MachineID: "m", DeviceType: "t", Firmware: "f", EnrollmentSecret: "wrong"}); !errors.Is(err, ErrEnrollment) {
		t.Fatalf("wrong secret: %v", err)
	}
	r1, err := s.Register(ctx, reg("m-1"))
	if err != nil || !r1.New || r1.PushInterval != 100 {
		t.Fatalf("%+v %v", r1, err)
	}
	if _, err := s.Push(ctx, r1.Token, push(1, 0)); err != nil {
		t.Fatal(err)
	}
	again := reg("m-1")
	again.DeviceKey = r1.DeviceKey // the same device proves it (admission.go)
	r2, err := s.Register(ctx, again)
	if err != nil || r2.New || r2.DeviceID != r1.DeviceID || r2.Token == r1.Token {
		t.Fatalf("re-register: %+v %v (first %+v)", r2, err, r1)
	}
	if _, err := s.Push(ctx, r1.Token, push(2, 0)); !errors.Is(err, ErrUnauthorized) {
		t.Fatalf("old token: %v", err)
	}
	if _, err := s.Push(ctx, r2.Token, push(2, 0)); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"", "x", "1.", ".abc", "99.abc", r2.Token + "x", "18446744073709551616.a"} {
		if _, err := s.Push(ctx, bad, push(3, 0)); !errors.Is(err, ErrUnauthorized) {
			t.Errorf("token %q: %v", bad, err)
		}
	}
	d, _ := s.Device(context.Background(), 1)
	if d.Seq != 2 || d.MachineID != "m-1" {
		t.Fatalf("device %+v", d)
	}
}

func TestSyncStatesAndLiveness(t *testing.T) {
	ctx := context.Background()
	s, c, _ := newService(t, newRecStore())
	r, _ := s.Register(ctx, reg("m"))
	id := uint64(1)
	state := func() (string, string) { d, _ := s.Device(context.Background(), id); return d.SyncState, d.Liveness }
	if st, l := state(); st != "arriving" || l != "unknown" {
		t.Fatalf("after register: %s %s", st, l)
	}
	resp, _ := s.Push(ctx, r.Token, push(1, 0))
	if st, l := state(); st != "synchronized" || l != "online" || resp.Config != nil {
		t.Fatalf("after push: %s %s %+v", st, l, resp)
	}
	p, err := s.UpdateProfile(ctx, 1, ProfileUpdate{Config: json.RawMessage(`{"apn":"internet"}`)})
	if err != nil || p.Version != 1 {
		t.Fatalf("%+v %v", p, err)
	}
	if st, _ := state(); st != "sync_pending" {
		t.Fatalf("after profile change: %s", st)
	}
	resp, _ = s.Push(ctx, r.Token, push(2, 0))
	if resp.Config == nil || resp.Config.Version != 1 || string(resp.Config.Data) != `{"apn":"internet"}` {
		t.Fatalf("push answer lacks config: %+v", resp)
	}
	failed := push(3, 0)
	failed.ConfigError = "apn rejected"
	s.Push(ctx, r.Token, failed)
	if st, _ := state(); st != "sync_error" {
		t.Fatalf("after failure: %s", st)
	}
	resp, _ = s.Push(ctx, r.Token, push(4, 1))
	if st, _ := state(); st != "synchronized" || resp.Config != nil {
		t.Fatalf("after apply: %s %+v", st, resp)
	}
	c.add(149 * time.Second)
	if _, l := state(); l != "online" {
		t.Fatalf("149 s: %s", l)
	}
	c.add(time.Second)
	if _, l := state(); l != "late" {
		t.Fatalf("150 s: %s", l)
	}
	c.add(150 * time.Second)
	if _, l := state(); l != "offline" {
		t.Fatalf("300 s: %s", l)
	}
	st := s.Stats()
	if st.Devices != 1 || st.Sync["synchronized"] != 1 || st.Liveness["offline"] != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// A thousand first devices of one new type/firmware create one profile.
func TestDefaultProfileRace(t *testing.T) {
	ctx := context.Background()
	st := newRecStore()
	st.delay = 2 * time.Millisecond
	s, _, _ := newService(t, st)
	var wg sync.WaitGroup
	errs := make(chan error, 1000)
	for i := range 1000 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := s.Register(ctx, reg(fmt.Sprintf("m-%d", i)))
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := len(s.Profiles()); n != 1 {
		t.Fatalf("%d profiles in memory", n)
	}
	if n := len(st.profiles); n != 1 {
		t.Fatalf("%d profiles stored", n)
	}
	if len(st.devices) != 1000 {
		t.Fatalf("%d devices stored", len(st.devices))
	}
	// Grouped commits: far fewer commits than writes.
	if st.commits >= 500 {
		t.Fatalf("%d commits for 1001 records: commits are not grouped", st.commits)
	}
}

func TestFirmwareUpgradeMovesProfile(t *testing.T) {
	ctx := context.Background()
	s, _, _ := newService(t, newRecStore())
	r, _ := s.Register(ctx, reg("m"))
	p := push(1, 0)
	p.State.Firmware = "7.0.0"
	if _, err := s.Push(ctx, r.Token, p); err != nil {
		t.Fatal(err)
	}
	d, _ := s.Device(context.Background(), 1)
	if d.Firmware != "7.0.0" || d.ProfileID != 2 || len(s.Profiles()) != 2 {
		t.Fatalf("device %+v, %d profiles", d, len(s.Profiles()))
	}
}

func TestRestartKeepsEverything(t *testing.T) {
	ctx := context.Background()
	st := newRecStore()
	s, _, wt := newService(t, st)
	r, _ := s.Register(ctx, reg("m"))
	s.UpdateProfile(ctx, 1, ProfileUpdate{Config: json.RawMessage(`{"a":1}`)})
	s.Push(ctx, r.Token, push(5, 1))
	wt.Close(ctx)

	s2, _, _ := newService(t, st)
	d, err := s2.Device(ctx, 1)
	if err != nil || d.Seq != 5 || d.SyncState != "synchronized" || string(d.State) != `{"cpu":10}` || d.DesiredVersion != 1 {
		t.Fatalf("after restart: %+v", d)
	}
	if _, err := s2.Push(ctx, r.Token, push(6, 1)); err != nil {
		t.Fatalf("token after restart: %v", err)
	}
	r2, _ := s2.Register(ctx, reg("other"))
	if r2.DeviceID != "2" {
		t.Fatalf("new ID after restart = %s", r2.DeviceID)
	}
	h, _ := s2.History(ctx, 1, HistoryQuery{})
	if len(h) != 2 {
		t.Fatalf("history %d samples", len(h))
	}
}

func TestStoreFailureIsNotAcknowledged(t *testing.T) {
	ctx := context.Background()
	st := newRecStore()
	s, _, _ := newService(t, st)
	r, _ := s.Register(ctx, reg("m"))
	st.fail.Store(true)
	if _, err := s.Push(ctx, r.Token, push(1, 0)); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("push with failing store: %v", err)
	}
	if _, err := s.Register(ctx, reg("n")); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("register with failing store: %v", err)
	}
	st.fail.Store(false)
	if _, err := s.Push(ctx, r.Token, push(2, 0)); err != nil {
		t.Fatalf("after recovery: %v", err)
	}
	r2, err := s.Register(ctx, reg("n"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Push(ctx, r2.Token, push(1, 0)); err != nil {
		t.Fatalf("device whose first registration failed: %v", err)
	}
}

func TestWriteThroughOverload(t *testing.T) {
	st := newRecStore()
	st.delay = 200 * time.Millisecond
	wt := NewWriteThrough(st, 10, nil)
	defer wt.Close(context.Background())
	var tickets []Ticket
	overloaded := 0
	for i := range 30 {
		tk, err := wt.Enqueue(func(b *Batch) { b.Samples = append(b.Samples, Sample{DeviceID: uint64(i)}) })
		if errors.Is(err, ErrOverloaded) {
			overloaded++
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		tickets = append(tickets, tk)
	}
	if overloaded == 0 {
		t.Fatal("no write was refused beyond max pending")
	}
	for _, tk := range tickets {
		if err := tk.Wait(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if len(st.samples) != len(tickets) {
		t.Fatalf("stored %d, acknowledged %d", len(st.samples), len(tickets))
	}
}

func TestListFilterAndPaging(t *testing.T) {
	ctx := context.Background()
	s, _, _ := newService(t, newRecStore())
	for i := range 25 {
		r, _ := s.Register(ctx, reg(fmt.Sprintf("m-%02d", i)))
		if i%2 == 0 {
			s.Push(ctx, r.Token, push(1, 0))
		}
	}
	arriving := Arriving
	var got []string
	cursor := ""
	for {
		p := page(t, s, Filter{SyncState: &arriving}, cursor, 5)
		for _, d := range p.Devices {
			got = append(got, d.MachineID)
		}
		if p.Next == "" {
			break
		}
		cursor = p.Next
	}
	if len(got) != 12 || got[0] != "m-01" || got[11] != "m-23" {
		t.Fatalf("arriving devices %v", got)
	}
	if p := page(t, s, Filter{Text: "m-1"}, "", 100); len(p.Devices) != 10 {
		t.Fatalf("text filter: %d", len(p.Devices))
	}
}

func BenchmarkPushMemory(b *testing.B) {
	ctx := context.Background()
	s, err := New(ctx, Stores{}, nil, Options{EnrollmentSecret: "sesame"})
	if err != nil {
		b.Fatal(err)
	}
	const n = 10000
	tokens := make([]string, n)
	for i := range n {
		r, err := s.Register(ctx, reg(fmt.Sprintf("m-%d", i)))
		if err != nil {
			b.Fatal(err)
		}
		tokens[i] = r.Token
	}
	p := push(1, 0)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			if _, err := s.Push(ctx, tokens[i%n], p); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
}

func BenchmarkRegisterMemory(b *testing.B) {
	ctx := context.Background()
	s, _ := New(ctx, Stores{}, nil, Options{EnrollmentSecret: "sesame"})
	var i atomic.Int64
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := s.Register(ctx, reg(fmt.Sprintf("m-%d", i.Add(1)))); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// A device that moves to another profile by a firmware upgrade gets that
// profile's configuration even when its version number is lower than the one
// the device applied from its old profile.
func TestFirmwareUpgradeGetsNewProfilesConfig(t *testing.T) {
	ctx := context.Background()
	s, _, _ := newService(t, newRecStore())
	other := reg("other")
	other.Firmware = "7.0.0"
	s.Register(ctx, other) // creates profile 1 for 7.0.0
	r, _ := s.Register(ctx, reg("m"))
	d, _ := s.Device(ctx, 2)
	p7, _ := s.UpdateProfile(ctx, 1, ProfileUpdate{Config: json.RawMessage(`{"fw":7}`)})
	p6, _ := s.UpdateProfile(ctx, d.ProfileID, ProfileUpdate{Config: json.RawMessage(`{"fw":6}`)})
	if p6.Version <= p7.Version {
		t.Fatalf("versions not unique across profiles: %d then %d", p7.Version, p6.Version)
	}
	s.Push(ctx, r.Token, push(1, p6.Version))
	up := push(2, p6.Version)
	up.State.Firmware = "7.0.0"
	resp, err := s.Push(ctx, r.Token, up)
	if err != nil || resp.Config == nil || resp.Config.Version != p7.Version {
		t.Fatalf("after upgrade: %+v %v", resp, err)
	}
	if d, _ := s.Device(ctx, 2); d.SyncState != "sync_pending" {
		t.Fatalf("sync state %s", d.SyncState)
	}
}

// page lists the devices in ID order after the cursor, as the API does.
func page(t *testing.T, s *Service, f Filter, after string, limit int) Result {
	t.Helper()
	r, err := s.Query(Query{Filter: f, After: after, Limit: limit, NoTotal: true})
	if err != nil {
		t.Fatal(err)
	}
	return r
}
