package alert_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/drover/drover/internal/alert"
	"github.com/drover/drover/internal/alert/alerttest"
	"github.com/drover/drover/internal/fleet"
	"github.com/drover/drover/internal/protocol"
)

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

// env is a fleet in memory with an engine fed by its pushes.
type env struct {
	t      *testing.T
	ctx    context.Context
	clk    *clock
	fleet  *fleet.Service
	eng    *alert.Engine
	store  *alert.MemStore
	tokens map[string]string
	ids    map[string]uint64
	seq    map[string]uint64
}

func newEnv(t *testing.T, store *alert.MemStore, opts alert.Options) *env {
	t.Helper()
	ctx := context.Background()
	clk := &clock{t: time.Date(2026, 5, 6, 7, 8, 9, 0, time.UTC)}
	fl, err := fleet.New(ctx, fleet.Stores{}, nil, fleet.Options{EnrollmentSecret: "s", DefaultPushInterval: 60, Now: clk.now})
	if err != nil {
		t.Fatal(err)
	}
	if store == nil {
		store = alert.NewMemStore()
	}
	opts.Fleet, opts.Store, opts.Now = fl, store, clk.now
	eng, err := alert.New(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	return &env{t: t, ctx: ctx, clk: clk, fleet: fl, eng: eng, store: store, tokens: map[string]string{}, ids: map[string]uint64{}, seq: map[string]uint64{}}
}

func (e *env) register(machine, devType string) {
	e.t.Helper()
	r, err := e.fleet.Register(e.ctx, protocol.RegisterRequest{MachineID: machine, DeviceType: devType, Firmware: "1.0", EnrollmentSecret: "s"})
	if err != nil {
		e.t.Fatal(err)
	}
	e.tokens[machine] = r.Token
	var id uint64
	fmt.Sscan(r.DeviceID, &id)
	e.ids[machine] = id
}

// push sends a state given as JSON.
func (e *env) push(machine string, applied int64, stateJSON string) {
	e.t.Helper()
	e.seq[machine]++
	body := fmt.Sprintf(`{"seq":%d,"config_version":%d,"state":%s}`, e.seq[machine], applied, stateJSON)
	req, err := protocol.DecodePush([]byte(body))
	if err != nil {
		e.t.Fatal(err)
	}
	if _, err := e.fleet.Push(e.ctx, e.tokens[machine], req); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) rule(r alert.Rule) alert.Rule {
	e.t.Helper()
	r, err := e.eng.CreateRule(e.ctx, r)
	if err != nil {
		e.t.Fatal(err)
	}
	return r
}

// active returns "rule/machine" of every active alert.
func (e *env) active() []string {
	evs, _ := e.eng.Active(0, 0)
	var out []string
	for _, ev := range evs {
		m := ""
		for k, id := range e.ids {
			if id == ev.DeviceID {
				m = k
			}
		}
		out = append(out, ev.Rule+"/"+m)
	}
	return out
}

func (e *env) wantActive(want ...string) {
	e.t.Helper()
	got := e.active()
	if strings.Join(sorted(got), " ") != strings.Join(sorted(want), " ") {
		e.t.Fatalf("active alerts %v, want %v", got, want)
	}
}

func sorted(v []string) []string {
	out := append([]string(nil), v...)
	for i := range out {
		for j := i + 1; j < len(out); j++ {
			if out[j] < out[i] {
				out[i], out[j] = out[j], out[i]
			}
		}
	}
	return out
}

func TestMetricRulesRaiseAndClear(t *testing.T) {
	e := newEnv(t, nil, alert.Options{})
	e.register("a", "ICR-3241")
	e.register("b", "ICR-4000")
	e.rule(alert.Rule{Name: "hot", Kind: alert.TemperatureAbove, Threshold: 80})
	e.rule(alert.Rule{Name: "busy", Kind: alert.CPUAbove, Threshold: 90, Pushes: 3, DeviceType: "ICR-4000"})
	e.rule(alert.Rule{Name: "full", Kind: alert.DiskFreeBelow, Threshold: 10})

	e.push("a", 0, `{"temperature":85,"cpu":95,"disk_total":1000,"disk_used":950}`)
	e.wantActive("hot/a", "full/a") // busy targets ICR-4000 only
	e.push("b", 0, `{"cpu":95}`)
	e.push("b", 0, `{"cpu":96}`)
	e.wantActive("hot/a", "full/a")
	e.push("b", 0, `{}`) // not measured: the count stands
	e.push("b", 0, `{"cpu":97}`)
	e.wantActive("hot/a", "full/a", "busy/b")
	e.push("a", 0, `{"temperature":70,"disk_total":1000,"disk_used":500}`)
	e.wantActive("busy/b")
	e.push("b", 0, `{"cpu":10}`)
	e.wantActive()
	e.push("b", 0, `{"cpu":99}`) // the count restarted
	e.wantActive()

	evs, err := e.eng.Events(e.ctx, alert.EventQuery{Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 3 {
		t.Fatalf("%d events stored: %+v", len(evs), evs)
	}
	for _, ev := range evs {
		if ev.State != alert.Cleared || ev.ClearedAt == nil || ev.ClearReason != "condition no longer holds" {
			t.Fatalf("event not cleared: %+v", ev)
		}
		if ev.Rule == "busy" && (ev.Value != 97 || !strings.Contains(ev.Message, "for 3 pushes")) {
			t.Fatalf("busy event %+v", ev)
		}
		if ev.Rule == "full" && (ev.Value != 5 || ev.DeviceType != "ICR-3241") {
			t.Fatalf("full event %+v", ev)
		}
	}
	if n := e.eng.ActiveCount(); n != 0 {
		t.Fatalf("ActiveCount %d", n)
	}
}

func TestLabelTargetRebootAndOffline(t *testing.T) {
	e := newEnv(t, nil, alert.Options{})
	for _, m := range []string{"a", "b", "c"} {
		e.register(m, "ICR")
	}
	e.rule(alert.Rule{Name: "north-hot", Kind: alert.TemperatureAbove, Threshold: 50, Label: "north"})
	e.rule(alert.Rule{Name: "reboot", Kind: alert.Reboot, Seconds: 600})
	e.rule(alert.Rule{Name: "silent", Kind: alert.Offline, Seconds: 900})

	e.push("a", 0, `{"temperature":60,"uptime":1000}`)
	e.wantActive() // the label does not exist yet
	if _, err := e.fleet.AssignLabel(e.ctx, "north", fleet.Filter{Text: "a"}, false); err != nil {
		t.Fatal(err)
	}
	e.push("a", 0, `{"temperature":61,"uptime":1060}`)
	e.push("b", 0, `{"temperature":99,"uptime":50}`)
	e.wantActive("north-hot/a")

	e.clk.add(time.Minute)
	e.push("b", 0, `{"uptime":3}`) // rebooted
	e.wantActive("north-hot/a", "reboot/b")
	e.clk.add(5 * time.Minute)
	e.push("b", 0, `{"uptime":303}`)
	e.eng.Check(e.clk.now())
	e.wantActive("north-hot/a", "reboot/b") // 5 min after the reboot: still raised
	e.clk.add(5 * time.Minute)
	e.push("b", 0, `{"uptime":603}`)
	e.eng.Check(e.clk.now())
	e.wantActive("north-hot/a") // 10 min after the reboot: cleared; a silent for 11 min
	e.clk.add(5 * time.Minute)
	e.push("b", 0, `{"uptime":903}`)
	e.eng.Check(e.clk.now())
	e.wantActive("north-hot/a", "silent/a") // a silent for 16 min; c never pushed

	e.push("a", 0, `{"temperature":20,"uptime":1800}`)
	e.wantActive()
	evs, _ := e.eng.Events(e.ctx, alert.EventQuery{Limit: 100})
	reasons := map[string]string{}
	for _, ev := range evs {
		reasons[ev.Rule] = ev.ClearReason
	}
	if reasons["reboot"] != "no reboot since" || reasons["silent"] != "device pushed again" {
		t.Fatalf("clear reasons %v", reasons)
	}
}

func TestRestartKeepsActiveAlertsAndRuleChanges(t *testing.T) {
	store := alert.NewMemStore()
	e := newEnv(t, store, alert.Options{})
	e.register("a", "ICR")
	hot := e.rule(alert.Rule{Name: "hot", Kind: alert.TemperatureAbove, Threshold: 80})
	e.push("a", 0, `{"temperature":90}`)
	e.wantActive("hot/a")
	if err := e.eng.Flush(e.ctx); err != nil {
		t.Fatal(err)
	}

	// A new engine on the same store (the fleet is new too, so device IDs
	// start over at 1 as they would after loading).
	e2 := newEnv(t, store, alert.Options{})
	e2.register("a", "ICR")
	e2.wantActive("hot/a")
	// A rename keeps the alert; a new threshold clears it.
	hot.Name = "very hot"
	if _, err := e2.eng.UpdateRule(e2.ctx, hot.ID, hot); err != nil {
		t.Fatal(err)
	}
	e2.wantActive("hot/a")
	e2.push("a", 0, `{"temperature":70}`)
	e2.wantActive()
	e2.push("a", 0, `{"temperature":90}`)
	e2.wantActive("very hot/a")
	hot.Threshold = 95
	if _, err := e2.eng.UpdateRule(e2.ctx, hot.ID, hot); err != nil {
		t.Fatal(err)
	}
	e2.wantActive()
	e2.push("a", 0, `{"temperature":96}`)
	e2.wantActive("very hot/a")
	if err := e2.eng.DeleteRule(e2.ctx, hot.ID); err != nil {
		t.Fatal(err)
	}
	e2.wantActive()
	evs, _ := e2.eng.Events(e2.ctx, alert.EventQuery{Active: true})
	if len(evs) != 0 {
		t.Fatalf("stored active events after delete: %+v", evs)
	}
	if _, err := e2.eng.CreateRule(e2.ctx, alert.Rule{Name: "x", Kind: "nonsense"}); err == nil {
		t.Fatal("invalid rule accepted")
	}
	e2.rule(alert.Rule{Name: "dup", Kind: alert.Offline})
	if _, err := e2.eng.CreateRule(e2.ctx, alert.Rule{Name: "dup", Kind: alert.Reboot}); err != alert.ErrDuplicateName {
		t.Fatalf("duplicate name: %v", err)
	}
}

func TestSyncHistory(t *testing.T) {
	e := newEnv(t, nil, alert.Options{})
	e.register("a", "ICR")
	e.push("a", 0, `{}`)
	e.push("a", 0, `{}`)
	p := e.fleet.Profiles()[0]
	if _, err := e.fleet.UpdateProfile(e.ctx, p.ID, fleet.ProfileUpdate{Config: json.RawMessage(`{"apn":"x"}`)}); err != nil {
		t.Fatal(err)
	}
	e.push("a", 0, `{}`)
	e.seq["a"]++
	req, _ := protocol.DecodePush([]byte(fmt.Sprintf(`{"seq":%d,"config_version":0,"config_error":"bad apn","state":{}}`, e.seq["a"])))
	e.fleet.Push(e.ctx, e.tokens["a"], req)
	e.push("a", 1, `{}`)
	e.push("a", 1, `{}`)
	h, err := e.eng.SyncHistory(e.ctx, e.ids["a"], 10)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, s := range h {
		got = append(got, fmt.Sprintf("%s %d/%d %s", s.State, s.Applied, s.Desired, s.Error))
	}
	want := []string{"synchronized 1/1 ", "sync_error 0/1 bad apn", "sync_pending 0/1 ", "synchronized 0/0 "}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("sync history\n got %q\nwant %q", got, want)
	}
}

func TestMemStore(t *testing.T) {
	alerttest.Run(t, alert.NewMemStore())
}

func TestStoreFailureKeepsEventsQueued(t *testing.T) {
	store := alert.NewMemStore()
	e := newEnv(t, store, alert.Options{})
	e.register("a", "ICR")
	e.rule(alert.Rule{Name: "hot", Kind: alert.TemperatureAbove, Threshold: 80})
	store.Fail = fmt.Errorf("disk on fire")
	e.push("a", 0, `{"temperature":90}`)
	if err := e.eng.Flush(e.ctx); err == nil {
		t.Fatal("flush to a failing store succeeded")
	}
	store.Fail = nil
	evs, err := e.eng.Events(e.ctx, alert.EventQuery{})
	if err != nil || len(evs) != 1 || evs[0].State != alert.Raised {
		t.Fatalf("after recovery: %+v %v", evs, err)
	}
}

func BenchmarkOnPush(b *testing.B) {
	ctx := context.Background()
	fl, _ := fleet.New(ctx, fleet.Stores{}, nil, fleet.Options{EnrollmentSecret: "s"})
	const n = 10000
	for i := range n {
		fl.Register(ctx, protocol.RegisterRequest{MachineID: fmt.Sprint(i), DeviceType: "ICR", Firmware: "1", EnrollmentSecret: "s"})
	}
	eng, _ := alert.New(ctx, alert.Options{Fleet: fl})
	for _, r := range []alert.Rule{
		{Name: "hot", Kind: alert.TemperatureAbove, Threshold: 80},
		{Name: "busy", Kind: alert.CPUAbove, Threshold: 90, Pushes: 3},
		{Name: "disk", Kind: alert.DiskFreeBelow, Threshold: 5},
		{Name: "reboot", Kind: alert.Reboot},
		{Name: "offline", Kind: alert.Offline},
	} {
		if _, err := eng.CreateRule(ctx, r); err != nil {
			b.Fatal(err)
		}
	}
	req, _ := protocol.DecodePush([]byte(`{"seq":1,"config_version":0,"state":{"uptime":100,"cpu":12,"temperature":45,"disk_total":100,"disk_used":50}}`))
	b.ReportAllocs()
	b.ResetTimer()
	var i atomic.Uint64
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			id := i.Add(1)%n + 1
			eng.OnPush(fleet.PushEvent{DeviceID: id, DeviceType: "ICR", At: time.Now(), State: &req.State})
		}
	})
}

// Disabling a rule clears its alerts as deleting it does, with the reason
// docs/alerts.md names; a changed condition says "rule changed".
func TestClearReasonsOfRuleChanges(t *testing.T) {
	e := newEnv(t, nil, alert.Options{})
	e.register("a", "ICR")
	hot := e.rule(alert.Rule{Name: "hot", Kind: alert.TemperatureAbove, Threshold: 80})
	warm := e.rule(alert.Rule{Name: "warm", Kind: alert.TemperatureAbove, Threshold: 60})
	mild := e.rule(alert.Rule{Name: "mild", Kind: alert.TemperatureAbove, Threshold: 40})
	e.push("a", 0, `{"temperature":90}`)
	e.wantActive("hot/a", "warm/a", "mild/a")

	hot.Disabled = true
	if _, err := e.eng.UpdateRule(e.ctx, hot.ID, hot); err != nil {
		t.Fatal(err)
	}
	if err := e.eng.DeleteRule(e.ctx, warm.ID); err != nil {
		t.Fatal(err)
	}
	mild.Threshold = 45
	if _, err := e.eng.UpdateRule(e.ctx, mild.ID, mild); err != nil {
		t.Fatal(err)
	}
	e.wantActive()
	evs, err := e.eng.Events(e.ctx, alert.EventQuery{Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, ev := range evs {
		got[ev.Rule] = ev.ClearReason
	}
	want := map[string]string{"hot": "rule deleted or disabled", "warm": "rule deleted or disabled", "mild": "rule changed"}
	for rule, reason := range want {
		if got[rule] != reason {
			t.Errorf("rule %s cleared with %q, want %q (all: %v)", rule, got[rule], reason, got)
		}
	}

	// Enabling it again raises anew at the next push.
	hot.Disabled = false
	if _, err := e.eng.UpdateRule(e.ctx, hot.ID, hot); err != nil {
		t.Fatal(err)
	}
	e.push("a", 0, `{"temperature":91}`)
	e.wantActive("hot/a", "mild/a")
}

// docs/alerts.md lists exactly the clear reasons the engine gives.
func TestClearReasonsDocumented(t *testing.T) {
	doc, err := os.ReadFile("../../docs/alerts.md")
	if err != nil {
		t.Fatal(err)
	}
	text := strings.Join(strings.Fields(string(doc)), " ")
	_, list, ok := strings.Cut(text, "`clear_reason`, one of: ")
	if !ok {
		t.Fatal("docs/alerts.md: no list of clear_reason values")
	}
	list, _, _ = strings.Cut(list, ". ")
	var documented []string
	for i, part := range strings.Split(list, "`") {
		if i%2 == 1 {
			documented = append(documented, part)
		}
	}
	slices.Sort(documented)
	code := slices.Sorted(slices.Values(alert.ClearReasons))
	if !slices.Equal(documented, code) {
		t.Fatalf("docs/alerts.md lists clear reasons %q, the engine gives %q", documented, code)
	}
	if strings.Contains(text, "(reason `rule deleted`)") {
		t.Error("docs/alerts.md still names the reason `rule deleted`")
	}
}
