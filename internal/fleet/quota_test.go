package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/drover/drover/internal/protocol"
)

// polStore is a recStore that also keeps the policy (PolicyStore).
type polStore struct {
	*recStore
	pmu    sync.Mutex
	policy *ProfilePolicy
	links  map[profileKey]ProfileLink
	lifts  map[uint64]QuotaLift
	rps    map[string]RolloutPolicy
}

func newPolStore() *polStore {
	return &polStore{recStore: newRecStore(), links: map[profileKey]ProfileLink{}, lifts: map[uint64]QuotaLift{}}
}

func (s *polStore) LoadPolicy(ctx context.Context) (PolicyData, error) {
	s.pmu.Lock()
	defer s.pmu.Unlock()
	var d PolicyData
	if s.policy != nil {
		p := *s.policy
		d.Policy = &p
	}
	for _, l := range s.links {
		d.Links = append(d.Links, l)
	}
	for _, l := range s.lifts {
		d.Lifts = append(d.Lifts, l)
	}
	for _, p := range s.rps {
		d.RolloutPolicies = append(d.RolloutPolicies, p)
	}
	return d, nil
}

func (s *polStore) SaveProfilePolicy(ctx context.Context, p ProfilePolicy) error {
	s.pmu.Lock()
	defer s.pmu.Unlock()
	s.policy = &p
	return nil
}

func (s *polStore) SaveRolloutPolicy(ctx context.Context, p RolloutPolicy) error {
	s.pmu.Lock()
	defer s.pmu.Unlock()
	if s.rps == nil {
		s.rps = map[string]RolloutPolicy{}
	}
	s.rps[p.Name] = p
	return nil
}

func (s *polStore) DeleteRolloutPolicy(ctx context.Context, name string) error {
	s.pmu.Lock()
	defer s.pmu.Unlock()
	delete(s.rps, name)
	return nil
}

func (s *polStore) SaveProfileLink(ctx context.Context, l ProfileLink) error {
	s.pmu.Lock()
	defer s.pmu.Unlock()
	s.links[profileKey{l.DeviceType, l.Firmware}] = l
	return nil
}

func (s *polStore) DeleteProfileLink(ctx context.Context, typ, fw string) error {
	s.pmu.Lock()
	defer s.pmu.Unlock()
	delete(s.links, profileKey{typ, fw})
	return nil
}

func (s *polStore) SaveQuotaLift(ctx context.Context, l QuotaLift) error {
	s.pmu.Lock()
	defer s.pmu.Unlock()
	s.lifts[l.DeviceID] = l
	return nil
}

func (s *polStore) DeleteQuotaLift(ctx context.Context, id uint64) error {
	s.pmu.Lock()
	defer s.pmu.Unlock()
	delete(s.lifts, id)
	return nil
}

func (s *polStore) DeleteProfiles(ctx context.Context, ids []uint64) error {
	s.pmu.Lock()
	defer s.pmu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, id := range ids {
		delete(s.profiles, id)
		for k, l := range s.links {
			if l.ProfileID == id {
				delete(s.links, k)
			}
		}
	}
	return nil
}

func newQuotaService(t *testing.T, st *polStore, q QuotaOptions, c *clock) *Service {
	t.Helper()
	wt := NewWriteThrough(st, 0, nil)
	t.Cleanup(func() { wt.Close(context.Background()) })
	s, err := New(context.Background(), Stores{Devices: st, Policy: st}, wt, Options{EnrollmentSecret: "sesame", DefaultPushInterval: 100, Now: c.now, Quotas: q})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func newClock() *clock { return &clock{t: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)} }

func wantQuota(t *testing.T, err error, wait time.Duration) {
	t.Helper()
	var qe *QuotaError
	if !errors.As(err, &qe) || !errors.Is(err, ErrQuota) {
		t.Fatalf("want a quota error, got %v", err)
	}
	if qe.RetryAfter != wait {
		t.Fatalf("retry after %v, want %v", qe.RetryAfter, wait)
	}
}

func TestPushQuotaRefusesAndWritesNothing(t *testing.T) {
	ctx := context.Background()
	st, c := newPolStore(), newClock()
	s := newQuotaService(t, st, QuotaOptions{PushRate: 2, PushBurst: 3}, c)
	r, _ := s.Register(ctx, reg("m"))
	for i := range 3 {
		if _, err := s.Push(ctx, r.Token, push(uint64(i+1), 0)); err != nil {
			t.Fatalf("push %d of the burst: %v", i+1, err)
		}
	}
	st.mu.Lock()
	commits, samples := st.commits, len(st.samples)
	st.mu.Unlock()
	// Interval 100 s at 2 per interval: one push per 50 s; the burst of 3
	// is used, the next is due 50 s after the burst.
	_, err := s.Push(ctx, r.Token, push(4, 0))
	wantQuota(t, err, 50*time.Second)
	st.mu.Lock()
	if st.commits != commits || len(st.samples) != samples || st.states[1].Seq != 3 {
		t.Fatalf("a refused push was written: commits %d→%d, samples %d→%d, seq %d", commits, st.commits, samples, len(st.samples), st.states[1].Seq)
	}
	st.mu.Unlock()
	if d, _ := s.Device(ctx, 1); d.Seq != 3 {
		t.Fatalf("in memory seq %d after a refused push", d.Seq)
	}
	c.add(49 * time.Second)
	_, err = s.Push(ctx, r.Token, push(4, 0))
	wantQuota(t, err, time.Second)
	c.add(time.Second)
	if _, err := s.Push(ctx, r.Token, push(4, 0)); err != nil {
		t.Fatalf("after Retry-After: %v", err)
	}
	hits := s.QuotaDevices()
	if len(hits) != 1 || hits[0].DeviceID != 1 || hits[0].Counts[QuotaPushRate] != 2 || hits[0].Lifted {
		t.Fatalf("quota devices %+v", hits)
	}
	if n := s.QuotaHits()[QuotaPushRate]; n != 2 {
		t.Fatalf("push_rate hits %d", n)
	}
}

// An agent pushing on its interval, early after reboots and configuration
// changes, and on a profile whose interval an operator shortened, is never
// refused.
func TestPushQuotaNeverPunishesAnAgent(t *testing.T) {
	ctx := context.Background()
	c := newClock()
	s := newQuotaService(t, newPolStore(), DefaultQuotas(), c)
	r, _ := s.Register(ctx, reg("m"))
	seq := uint64(0)
	pushOK := func(what string) {
		t.Helper()
		seq++
		if _, err := s.Push(ctx, r.Token, push(seq, 0)); err != nil {
			t.Fatalf("%s (push %d): %v", what, seq, err)
		}
	}
	long := 3600
	s.UpdateProfile(ctx, 1, ProfileUpdate{PushInterval: &long})
	for range 5 {
		pushOK("hourly")
		c.add(time.Hour - 3*time.Second) // a little early each time
	}
	// Reboot: pushes at once, then a configuration change: at once again.
	pushOK("after reboot")
	pushOK("after a configuration change")
	// The operator shortens the interval to a minute: the agent follows at
	// once, though its last pushes were on the hourly schedule.
	short := 60
	s.UpdateProfile(ctx, 1, ProfileUpdate{PushInterval: &short})
	for range 200 {
		c.add(58 * time.Second)
		pushOK("every minute")
	}
	if hits := s.QuotaDevices(); len(hits) != 0 {
		t.Fatalf("a well-behaved agent hit a quota: %+v", hits)
	}
}

func TestHistoryQuota(t *testing.T) {
	ctx := context.Background()
	st, c := newPolStore(), newClock()
	// One sample per interval; bytes for 10 samples over 2000 s: at most
	// one per 200 s, which binds at interval 100 s.
	s := newQuotaService(t, st, QuotaOptions{HistorySamples: 1, HistoryBytes: 10 * SampleBytes, HistoryRetention: 2000 * time.Second}, c)
	r, _ := s.Register(ctx, reg("m"))
	for i := range 20 {
		if _, err := s.Push(ctx, r.Token, push(uint64(i+1), 0)); err != nil {
			t.Fatal(err)
		}
		c.add(50 * time.Second)
	}
	st.mu.Lock()
	n, seq := len(st.samples), st.states[1].Seq
	st.mu.Unlock()
	// 20 pushes over 1000 s, one sample kept per 200 s.
	if n != 5 || seq != 20 {
		t.Fatalf("%d samples kept (want 5), state seq %d (want 20)", n, seq)
	}
	// Per 200 s: the push at +50 s is over the per-interval bound (a hit),
	// those at +100 s and +150 s only over the byte bound.
	if h := s.QuotaHits()[QuotaHistory]; h != 5 {
		t.Fatalf("history hits %d", h)
	}
	if per, bytes := s.HistoryThinned(); per != 5 || bytes != 10 {
		t.Fatalf("thinned %d by interval, %d by bytes", per, bytes)
	}
	if len(s.QuotaDevices()) != 0 {
		t.Fatalf("history thinning listed a device: %+v", s.QuotaDevices())
	}
	if _, err := s.LiftQuota(ctx, 1, time.Time{}, "test"); err != nil {
		t.Fatal(err)
	}
	s.Push(ctx, r.Token, push(21, 0))
	st.mu.Lock()
	n = len(st.samples)
	st.mu.Unlock()
	if n != 6 {
		t.Fatalf("a lifted device's sample was not kept: %d", n)
	}
}

func TestLiftQuotaSurvivesRestart(t *testing.T) {
	ctx := context.Background()
	st, c := newPolStore(), newClock()
	q := QuotaOptions{PushRate: 1, PushBurst: 1}
	s := newQuotaService(t, st, q, c)
	r, _ := s.Register(ctx, reg("m"))
	s.Register(ctx, reg("other"))
	s.Push(ctx, r.Token, push(1, 0))
	_, err := s.Push(ctx, r.Token, push(2, 0))
	wantQuota(t, err, 100*time.Second)
	if _, err := s.LiftQuota(ctx, 99, time.Time{}, ""); !errors.Is(err, ErrNotFound) {
		t.Fatalf("lift of an unknown device: %v", err)
	}
	until := c.now().Add(time.Hour)
	if _, err := s.LiftQuota(ctx, 1, until, "firmware bug"); err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		if _, err := s.Push(ctx, r.Token, push(uint64(3+i), 0)); err != nil {
			t.Fatalf("lifted: %v", err)
		}
	}
	f, err := s.ParseFilter(url.Values{"quota": {"lifted"}})
	if err != nil {
		t.Fatal(err)
	}
	if res, _ := s.Query(Query{Filter: f}); res.Total != 1 || res.Devices[0].ID != 1 {
		t.Fatalf("quota=lifted: %+v", res)
	}
	if _, err := s.ParseFilter(url.Values{"quota": {"nonsense"}}); err == nil {
		t.Fatal("quota=nonsense accepted")
	}

	s2 := newQuotaService(t, st, q, c)
	if h, ok := s2.QuotaOf(1); !ok || !h.Lifted || h.LiftedUntil == nil || !h.LiftedUntil.Equal(until) {
		t.Fatalf("after restart: %+v %v", h, ok)
	}
	for i := range 3 {
		if _, err := s2.Push(ctx, r.Token, push(uint64(20+i), 0)); err != nil {
			t.Fatalf("lifted after restart: %v", err)
		}
	}
	c.add(time.Hour + time.Second) // the lift ends
	s2.Push(ctx, r.Token, push(30, 0))
	if _, err := s2.Push(ctx, r.Token, push(31, 0)); !errors.Is(err, ErrQuota) {
		t.Fatalf("after the lift ended: %v", err)
	}
	if err := s2.RestoreQuota(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if _, ok := s2.QuotaOf(1); ok {
		t.Fatal("restored device still listed")
	}
	if len(st.lifts) != 0 {
		t.Fatalf("stored lifts after restore: %+v", st.lifts)
	}
}

// A wrong token never reaches the policy: no profile for its firmware.
func TestPushWrongTokenCreatesNoProfile(t *testing.T) {
	ctx := context.Background()
	s := newQuotaService(t, newPolStore(), QuotaOptions{}, newClock())
	r, _ := s.Register(ctx, reg("m"))
	p := push(1, 0)
	p.State.Firmware = "9.9.9"
	if _, err := s.Push(ctx, r.Token[:len(r.Token)-2]+"xx", p); !errors.Is(err, ErrUnauthorized) {
		t.Fatal(err)
	}
	if n := len(s.Profiles()); n != 1 {
		t.Fatalf("%d profiles", n)
	}
}

// The push path allocates no more with quotas on than with them off.
func TestPushQuotaAllocations(t *testing.T) {
	ctx := context.Background()
	c := newClock()
	allocs := func(q QuotaOptions) float64 {
		s, _ := New(ctx, Stores{}, nil, Options{EnrollmentSecret: "sesame", Now: c.now, Quotas: q})
		r, _ := s.Register(ctx, reg("m"))
		p := push(1, 0)
		p.State.Firmware = "6.3.5"
		return testing.AllocsPerRun(200, func() {
			c.add(time.Hour)
			if _, err := s.Push(ctx, r.Token, p); err != nil {
				t.Fatal(err)
			}
		})
	}
	off, on := allocs(QuotaOptions{}), allocs(DefaultQuotas())
	if on > off {
		t.Fatalf("push allocates %v times with quotas, %v without", on, off)
	}
}

var _ = protocol.PushRequest{}

// BenchmarkPushQuota is BenchmarkPushMemory with the default quotas on
// (and the firmware reported, as agents do): compare the two for the
// quota's cost on the push path.
func BenchmarkPushQuota(b *testing.B) {
	ctx := context.Background()
	base := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	var tick atomic.Int64
	// Every push advances the clock a second: each of the 10,000 devices
	// pushes every 10,000 s, within its quota.
	now := func() time.Time { return base.Add(time.Duration(tick.Add(1)) * time.Second) }
	s, err := New(ctx, Stores{}, nil, Options{EnrollmentSecret: "sesame", Now: now, Quotas: DefaultQuotas()})
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
	p.State.Firmware = "6.3.5"
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

// asked is a quota test's device: a looping agent must be refused, pushes
// the server asked for never.
type asked struct {
	t     *testing.T
	s     *Service
	token string
	id    uint64
	seq   uint64
	conf  int64 // the configuration version the agent runs
}

// push sends p as the agent's next push, with the configuration it runs.
func (a *asked) push(p protocol.PushRequest) (protocol.PushResponse, error) {
	a.seq++
	p.Seq, p.ConfigVersion = a.seq, a.conf
	return a.s.Push(context.Background(), a.token, p)
}

// mustPush pushes and fails the test on a refusal; it applies a
// configuration the answer carries and reports it at once, as agents do,
// and returns the answer's commands.
func (a *asked) mustPush(what string, p protocol.PushRequest) []protocol.Command {
	a.t.Helper()
	resp, err := a.push(p)
	if err != nil {
		a.t.Fatalf("%s (push %d): %v", what, a.seq, err)
	}
	if resp.Config != nil {
		a.conf = resp.Config.Version
		a.mustPush(what+": the report of the applied configuration", push(0, 0))
	}
	return resp.Commands
}

// The pushes the server asks for (the push after a nudge, a command's
// result, the report of an applied configuration) and the first push after
// a boot or an agent start are never refused and do not count; a device
// that loops is refused all the same, also when it claims a start on
// every push.
func TestPushQuotaCountsOnlyTheDevicesOwnPushes(t *testing.T) {
	ctx := context.Background()
	c := newClock()
	// A 600 s interval at 2 pushes per interval: one push per 300 s, 3 back
	// to back.
	s := newQuotaService(t, newPolStore(), QuotaOptions{PushRate: 2, PushBurst: 3}, c)
	r, _ := s.Register(ctx, reg("m"))
	a := &asked{t: t, s: s, token: r.Token, id: 1}
	slow := 600
	if _, err := s.UpdateProfile(ctx, 1, ProfileUpdate{PushInterval: &slow}); err != nil {
		t.Fatal(err)
	}
	started := push(0, 0)
	started.Started = true
	a.mustPush("the agent's first push", started)

	// Eight commands one after another over the connection: each is a
	// nudge, the push it asks for, and the push with the result.
	for i := range 8 {
		args := []string{"apn", fmt.Sprint(i)}
		j, err := s.SendCommand(ctx, CommandSpec{Kind: protocol.KindSetConfig, Args: args}, Target{DeviceID: a.id})
		if err != nil {
			t.Fatal(err)
		}
		s.Nudged(a.id)
		cmds := a.mustPush(fmt.Sprintf("nudged for command %d", i+1), push(0, 0))
		if len(cmds) != 1 || cmds[0].ID != j.ID {
			t.Fatalf("command %d not delivered: %+v", i+1, cmds)
		}
		c.add(30 * time.Millisecond)
		res := push(0, 0)
		res.Results = []protocol.CommandResult{{ID: j.ID}}
		a.mustPush(fmt.Sprintf("result of command %d", i+1), res)
		c.add(30 * time.Millisecond)
		if got, _ := s.Job(j.ID); got.Counts["succeeded"] != 1 {
			t.Fatalf("command %d: %+v", i+1, got.Counts)
		}
	}
	// Configuration changes, each nudging the device: the push it asks for
	// gets the configuration, the next reports it.
	for i := range 4 {
		if _, err := s.UpdateProfile(ctx, 1, ProfileUpdate{Config: json.RawMessage(fmt.Sprintf(`{"apn":"%d"}`, i))}); err != nil {
			t.Fatal(err)
		}
		s.Nudged(a.id)
		a.mustPush(fmt.Sprintf("configuration change %d", i+1), push(0, 0))
	}
	// Agent restarts and reboots: the first push after each is free, as is
	// the push a connection asks for (the nudge may come before the start's
	// push: that does not take it).
	for i := range 4 {
		c.add(10 * time.Second)
		s.Nudged(a.id)
		a.mustPush(fmt.Sprintf("agent restart %d", i+1), started)
		a.mustPush(fmt.Sprintf("nudged after agent restart %d", i+1), push(0, 0))
		c.add(40 * time.Second)
		rebooted := push(0, 0)
		up := int64(20) // booted 20 s ago, after the last push 40 s ago
		rebooted.State.Uptime = &up
		a.mustPush(fmt.Sprintf("reboot %d", i+1), rebooted)
		s.Nudged(a.id)
		a.mustPush(fmt.Sprintf("nudged after reboot %d", i+1), push(0, 0))
	}
	if hits := s.QuotaDevices(); len(hits) != 0 {
		t.Fatalf("pushes the server asked for made the device an offender: %+v", hits)
	}
	if n := s.QuotaHits()[QuotaPushRate]; n != 0 {
		t.Fatalf("%d pushes refused", n)
	}

	// None of the 41 pushes above counted: the device's own pushes have
	// the whole burst of 3, and the fourth back to back is refused.
	loop := func(what string, p protocol.PushRequest, want int) {
		t.Helper()
		n := 0
		for ; n <= want; n++ {
			if _, err := a.push(p); err != nil {
				if !errors.Is(err, ErrQuota) {
					t.Fatal(err)
				}
				break
			}
		}
		if n != want {
			t.Fatalf("%s: %d pushes back to back accepted, want %d", what, n, want)
		}
	}
	loop("a looping agent", push(0, 0), 3)
	// Over its quota, a start is refused like any push of its own; a loop
	// that claims a start or a reboot on every push earns one free push.
	loop("a start over the quota", started, 0)
	c.add(time.Hour) // a quiet spell: the burst is back
	loop("a loop claiming a start", started, 1+3)
	c.add(time.Hour)
	up := int64(0)
	rebooting := push(0, 0)
	rebooting.State.Uptime = &up
	loop("a loop claiming reboots", rebooting, 3) // after a start: none free
	// A configuration is owed once: an agent that reports an older one and
	// the new one by turns is sent it again, and counted.
	c.add(time.Hour)
	a.conf = 0
	a.mustPush("an older configuration", push(0, 0)) // counted: 1, its report 2
	v := a.conf
	a.conf = 0
	if _, err := a.push(push(0, 0)); err != nil { // 3
		t.Fatal(err)
	}
	a.conf = v
	if _, err := a.push(push(0, 0)); !errors.Is(err, ErrQuota) {
		t.Fatalf("configurations reported by turns: %v", err)
	}
	if h, ok := s.QuotaOf(a.id); !ok || h.Counts[QuotaPushRate] != 5 {
		t.Fatalf("the loops were not listed: %+v", h)
	}
}

// Nudges a device never answers owe it at most maxAsked pushes.
func TestPushQuotaAskedIsBounded(t *testing.T) {
	ctx := context.Background()
	c := newClock()
	s := newQuotaService(t, newPolStore(), QuotaOptions{PushRate: 1, PushBurst: 1}, c)
	r, _ := s.Register(ctx, reg("m"))
	for range 1000 {
		s.Nudged(1)
	}
	n := 0
	for ; n < 1000; n++ {
		if _, err := s.Push(ctx, r.Token, push(uint64(n+1), 0)); err != nil {
			wantQuota(t, err, 100*time.Second)
			break
		}
	}
	if n != maxAsked+1 { // the owed pushes and the burst of one
		t.Fatalf("%d pushes accepted after 1000 nudges", n)
	}
	// Before the body is read, too.
	if _, err := s.CheckPush(r.Token); !errors.Is(err, ErrQuota) {
		t.Fatalf("CheckPush: %v", err)
	}
	s.Nudged(1)
	if _, err := s.CheckPush(r.Token); err != nil {
		t.Fatalf("CheckPush after a nudge: %v", err)
	}
}
