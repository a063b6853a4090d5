package storetest

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/drover/drover/internal/fleet"
	"github.com/drover/drover/internal/protocol"
)

type serviceTest struct {
	name string
	fn   func(t *testing.T, e *env)
}

var serviceTests = []serviceTest{
	{"RegisterAndReregister", svcRegister},
	{"PushAndHistory", svcPushAndHistory},
	{"DefaultProfileRace", svcProfileRace},
	{"ProfileUpdate", svcProfileUpdate},
	{"Retention", svcRetention},
	{"ConcurrentWriters", svcConcurrentWriters},
	{"IDsNotReused", svcIDsNotReused},
	{"Commands", svcCommands},
	{"LiveLabels", svcLiveLabels},
	{"ConfigLayers", svcConfigLayers},
}

// env is a fleet.Service on the store under test, in one persistence mode.
type env struct {
	t     testing.TB
	h     *handle
	mode  string
	every time.Duration // write-back flush interval
	mu    sync.Mutex
	now   time.Time
	p     fleet.Persister
	svc   *fleet.Service
	ctx   context.Context
	flush func(context.Context) error
}

func newEnv(t testing.TB, open Opener, mode string) *env {
	return newEnvEvery(t, open, mode, 20*time.Millisecond)
}

func newEnvEvery(t testing.TB, open Opener, mode string, every time.Duration) *env {
	e := &env{t: t, h: newHandle(t, open), mode: mode, every: every, now: time.Now().UTC().Truncate(time.Second), ctx: testCtx(t)}
	e.start()
	t.Cleanup(e.stop)
	return e
}

func (e *env) clock() time.Time {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.now
}

func (e *env) advance(d time.Duration) {
	e.mu.Lock()
	e.now = e.now.Add(d)
	e.mu.Unlock()
}

func (e *env) start() {
	e.t.Helper()
	switch e.mode {
	case "write-through":
		e.p, e.flush = fleet.NewWriteThrough(e.h.store, 0, nil), nil
	case "write-back":
		wb := fleet.NewWriteBack(e.h.store, fleet.WriteBackOptions{FlushInterval: e.every})
		e.p, e.flush = wb, wb.Flush
	default:
		e.t.Fatalf("unknown mode %q", e.mode)
	}
	svc, err := fleet.New(e.ctx, fleet.StoresOf(e.h.store), e.p, fleet.Options{EnrollmentSecret: "s", Now: e.clock})
	if err != nil {
		e.t.Fatalf("fleet.New: %v", err)
	}
	e.svc = svc
}

func (e *env) stop() {
	if e.p != nil {
		if err := e.p.Close(e.ctx); err != nil {
			e.t.Errorf("closing %s persister: %v", e.mode, err)
		}
		e.p = nil
	}
}

// restart stops the service gracefully and starts it again on a reopened
// store.
func (e *env) restart() {
	e.t.Helper()
	e.stop()
	e.h.reopen()
	e.start()
}

// sync makes what was acknowledged visible in the store (write-back only
// stores it at the next flush).
func (e *env) sync() {
	e.t.Helper()
	if e.flush != nil {
		if err := e.flush(e.ctx); err != nil {
			e.t.Fatalf("flush: %v", err)
		}
	}
}

func (e *env) register(machine, typ, fw string) protocol.RegisterResponse {
	e.t.Helper()
	r, err := e.svc.Register(e.ctx, protocol.RegisterRequest{MachineID: machine, DeviceType: typ, Firmware: fw, Serial: "S-" + machine, EnrollmentSecret: "s"})
	if err != nil {
		e.t.Fatalf("register %q: %v", machine, err)
	}
	return r
}

// reregister registers a known device again, proving it with its key.
func (e *env) reregister(machine, typ, fw, key string) protocol.RegisterResponse {
	e.t.Helper()
	r, err := e.svc.Register(e.ctx, protocol.RegisterRequest{MachineID: machine, DeviceType: typ, Firmware: fw, Serial: "S-" + machine,
		EnrollmentSecret: "s", DeviceKey: key})
	if err != nil || r.Token == "" {
		e.t.Fatalf("register %q again: %+v %v", machine, r, err)
	}
	return r
}

func pushReq(t testing.TB, seq uint64, applied int64, extra string) protocol.PushRequest {
	t.Helper()
	body := fmt.Sprintf(`{"seq":%d,"config_version":%d,"state":{"uptime":%d,"cpu":%d.5,"temperature":41.25,`+
		`"interfaces":[{"name":"eth0","rx_bytes":%d,"tx_bytes":7}],"extra":{"note":%q}}}`, seq, applied, seq*60, seq%100, seq*1000, extra)
	p, err := protocol.DecodePush([]byte(body))
	if err != nil {
		t.Fatalf("decode push: %v", err)
	}
	return p
}

func (e *env) push(token string, p protocol.PushRequest) protocol.PushResponse {
	e.t.Helper()
	r, err := e.svc.Push(e.ctx, token, p)
	if err != nil {
		e.t.Fatalf("push seq %d: %v", p.Seq, err)
	}
	return r
}

func (e *env) device(id string) fleet.Device {
	e.t.Helper()
	n, _ := strconv.ParseUint(id, 10, 64)
	d, err := e.svc.Device(e.ctx, n)
	if err != nil {
		e.t.Fatalf("device %s: %v", id, err)
	}
	return d
}

func (e *env) history(id string, q fleet.HistoryQuery) []fleet.Sample {
	e.t.Helper()
	n, _ := strconv.ParseUint(id, 10, 64)
	h, err := e.svc.History(e.ctx, n, q)
	if err != nil {
		e.t.Fatalf("history %s: %v", id, err)
	}
	return h
}

func svcRegister(t *testing.T, e *env) {
	r1 := e.register("m-1", "rut-x11", "7.04")
	if !r1.New || r1.DeviceID == "" || r1.Token == "" {
		t.Fatalf("first registration: %+v", r1)
	}
	e.push(r1.Token, pushReq(t, 1, 0, "a"))
	r2 := e.reregister("m-1", "rut-x11", "7.04", r1.DeviceKey)
	if r2.New || r2.DeviceID != r1.DeviceID || r2.Token == r1.Token {
		t.Fatalf("re-registration: %+v after %+v", r2, r1)
	}
	if _, err := e.svc.Push(e.ctx, r1.Token, pushReq(t, 2, 0, "")); !errors.Is(err, fleet.ErrUnauthorized) {
		t.Fatalf("push with the old token: %v, want ErrUnauthorized", err)
	}
	e.push(r2.Token, pushReq(t, 2, 0, "b"))
	// Machine IDs differing in case, trailing blanks or Unicode normalisation
	// are other devices; U+FFFD is a character like any other.
	others := map[string]string{}
	for _, m := range []string{"M-1", "m-1 ", "m-ü", "m-u\u0308", "m-1\uFFFD"} {
		r := e.register(m, "rut-x11", "7.04")
		if !r.New {
			t.Fatalf("%q registered as existing device %s", m, r.DeviceID)
		}
		others[m] = r.DeviceID
	}

	e.restart()
	if _, err := e.svc.Push(e.ctx, r1.Token, pushReq(t, 3, 0, "")); !errors.Is(err, fleet.ErrUnauthorized) {
		t.Fatalf("after restart, push with the old token: %v, want ErrUnauthorized", err)
	}
	e.push(r2.Token, pushReq(t, 3, 0, "c"))
	if d := e.device(r1.DeviceID); d.MachineID != "m-1" || d.Serial != "S-m-1" || d.Seq != 3 {
		t.Fatalf("after restart: %+v", d)
	}
	for m, id := range others {
		r := e.register(m, "rut-x11", "7.04")
		if r.New || r.DeviceID != id {
			t.Fatalf("after restart %q registered as %s (new %v), want existing %s", m, r.DeviceID, r.New, id)
		}
		if d := e.device(id); d.MachineID != m {
			t.Fatalf("after restart device %s has machine ID %q, registered %q", id, d.MachineID, m)
		}
	}
	r3 := e.register("m-new", "rut-x11", "7.04")
	if want := strconv.Itoa(len(others) + 2); !r3.New || r3.DeviceID != want {
		t.Fatalf("new device after restart got ID %s (new %v), want %s", r3.DeviceID, r3.New, want)
	}
}

func svcPushAndHistory(t *testing.T, e *env) {
	r := e.register("m-h", "trb140", "1.0")
	start := e.clock()
	var last protocol.PushRequest
	for seq := uint64(1); seq <= 30; seq++ {
		last = pushReq(t, seq, 0, fmt.Sprintf("push %d ü", seq))
		e.push(r.Token, last)
		e.advance(time.Second)
	}
	check := func(when string) {
		d := e.device(r.DeviceID)
		if d.Seq != 30 || string(d.State) != string(last.RawState) || d.LastSeen == nil || !d.LastSeen.Equal(start.Add(29*time.Second)) {
			t.Fatalf("%s: device seq %d last seen %v state %s; want 30, %v, %s", when, d.Seq, d.LastSeen, d.State, start.Add(29*time.Second), last.RawState)
		}
		h := e.history(r.DeviceID, fleet.HistoryQuery{})
		if len(h) != 30 {
			t.Fatalf("%s: %d samples, want 30", when, len(h))
		}
		for i, m := range h {
			if m.Seq != uint64(i+1) || !m.At.Equal(start.Add(time.Duration(i)*time.Second)) || m.Uptime == nil || *m.Uptime != int64(i+1)*60 ||
				m.RxBytes == nil || *m.RxBytes != uint64(i+1)*1000 || m.Temperature == nil || *m.Temperature != 41.25 {
				t.Fatalf("%s: sample %d: %s", when, i, fmtSample(m))
			}
		}
		part := e.history(r.DeviceID, fleet.HistoryQuery{From: start.Add(10 * time.Second), To: start.Add(20 * time.Second), Limit: 5})
		if len(part) != 5 || part[0].Seq != 11 || part[4].Seq != 15 {
			t.Fatalf("%s: from/to/limit gave %d samples", when, len(part))
		}
	}
	e.sync()
	check("before restart")
	e.restart()
	check("after restart")
}

// svcProfileRace registers 1000 devices of a new (type, firmware) at once:
// exactly one default profile may come out, in memory and in the store.
func svcProfileRace(t *testing.T, e *env) {
	const n = 1000
	var wg sync.WaitGroup
	ids := make([]string, n)
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := e.svc.Register(e.ctx, protocol.RegisterRequest{MachineID: fmt.Sprintf("race-%d", i), DeviceType: "racer", Firmware: "9.9", EnrollmentSecret: "s"})
			if err != nil {
				errs <- err
				return
			}
			ids[i] = r.DeviceID
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("register: %v", err)
	}
	check := func(when string) {
		var racers []fleet.Profile
		for _, p := range e.svc.Profiles() {
			if p.DeviceType == "racer" && p.Firmware == "9.9" {
				racers = append(racers, p)
			}
		}
		if len(racers) != 1 {
			t.Fatalf("%s: %d profiles for racer/9.9, want 1", when, len(racers))
		}
		for _, id := range ids {
			if d := e.device(id); d.ProfileID != racers[0].ID {
				t.Fatalf("%s: device %s has profile %d, want %d", when, id, d.ProfileID, racers[0].ID)
			}
		}
	}
	check("before restart")
	e.restart()
	check("after restart")
	l := load(t, e.h.store)
	stored := 0
	for _, p := range l.res.Profiles {
		if p.DeviceType == "racer" && p.Firmware == "9.9" {
			stored++
		}
	}
	if stored != 1 || len(l.devices) != n {
		t.Fatalf("store holds %d racer profiles and %d devices, want 1 and %d", stored, len(l.devices), n)
	}
}

func svcProfileUpdate(t *testing.T, e *env) {
	r := e.register("m-p", "rut", "2.0")
	pid := e.device(r.DeviceID).ProfileID
	p, err := e.svc.UpdateProfile(e.ctx, pid, fleet.ProfileUpdate{Config: []byte(`{"ntp":"pool.ntp.org","ü":[1,2]}`), PushInterval: ptr(90)})
	if err != nil || p.Version != 1 {
		t.Fatalf("update profile: %+v, %v", p, err)
	}
	if resp := e.push(r.Token, pushReq(t, 1, 0, "")); resp.Config == nil || resp.Config.Version != 1 || resp.PushInterval != 90 {
		t.Fatalf("push behind the profile: %+v", resp)
	}
	e.restart()
	got, ok := e.svc.Profile(pid)
	if !ok || got.Version != 1 || string(got.Config) != `{"ntp":"pool.ntp.org","ü":[1,2]}` || got.PushInterval != 90 {
		t.Fatalf("profile after restart: %+v (config %s)", got, got.Config)
	}
	if resp := e.push(r.Token, pushReq(t, 2, 1, "")); resp.Config != nil || resp.PushInterval != 90 {
		t.Fatalf("push in sync after restart: %+v", resp)
	}
	e.restart()
	if d := e.device(r.DeviceID); d.SyncState != fleet.Synchronized.String() || d.AppliedVersion != 1 {
		t.Fatalf("device after second restart: sync %s applied %d", d.SyncState, d.AppliedVersion)
	}
}

func svcRetention(t *testing.T, e *env) {
	r := e.register("m-r", "rut", "2.0")
	for seq := uint64(1); seq <= 10; seq++ {
		e.push(r.Token, pushReq(t, seq, 0, ""))
		e.advance(time.Minute)
	}
	e.sync()
	// Now is 10 minutes after the first push; keep 5 minutes and a half.
	n, err := e.svc.PruneHistory(e.ctx, 5*time.Minute+30*time.Second)
	if err != nil || n != 5 {
		t.Fatalf("pruned %d, %v; want 5", n, err)
	}
	h := e.history(r.DeviceID, fleet.HistoryQuery{})
	if len(h) != 5 || h[0].Seq != 6 {
		t.Fatalf("after prune: %d samples, first seq %d", len(h), h[0].Seq)
	}
	e.restart()
	if h := e.history(r.DeviceID, fleet.HistoryQuery{}); len(h) != 5 {
		t.Fatalf("after restart: %d samples", len(h))
	}
}

// svcConcurrentWriters has devices register and push concurrently; after a
// restart every device has its last acknowledged push and full history.
func svcConcurrentWriters(t *testing.T, e *env) {
	const devices, pushes = 48, 25
	var wg sync.WaitGroup
	ids := make([]string, devices)
	last := make([]protocol.PushRequest, devices)
	errs := make(chan error, devices)
	for i := range devices {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := e.svc.Register(e.ctx, protocol.RegisterRequest{MachineID: fmt.Sprintf("cw-%d", i), DeviceType: fmt.Sprintf("t%d", i%3), Firmware: "1", EnrollmentSecret: "s"})
			if err != nil {
				errs <- err
				return
			}
			ids[i] = r.DeviceID
			for seq := uint64(1); seq <= pushes; seq++ {
				p := pushReq(t, seq, 0, fmt.Sprintf("d%d s%d", i, seq))
				if _, err := e.svc.Push(e.ctx, r.Token, p); err != nil {
					errs <- fmt.Errorf("device %d push %d: %w", i, seq, err)
					return
				}
				last[i] = p
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	e.restart()
	for i, id := range ids {
		d := e.device(id)
		if d.Seq != pushes || string(d.State) != string(last[i].RawState) {
			t.Fatalf("device %s after restart: seq %d state %s; want %d %s", id, d.Seq, d.State, pushes, last[i].RawState)
		}
		if h := e.history(id, fleet.HistoryQuery{}); len(h) != pushes {
			t.Fatalf("device %s: %d samples, want %d", id, len(h), pushes)
		}
	}
}
