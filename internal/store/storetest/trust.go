package storetest

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/drover/drover/internal/fleet"
	"github.com/drover/drover/internal/protocol"
	"github.com/drover/drover/internal/store/contract"
)

// Trust (fleet.TrustStore) is part of the contract: every backend keeps
// admission states, device keys, requests, enrollment tokens, preauthorized
// machine IDs and deleted device IDs.
func init() {
	storeTests = append(storeTests, storeTest{"Trust", testTrust})
	serviceTests = append(serviceTests, serviceTest{"Admission", svcAdmission})
}

func trustStore(t testing.TB, s contract.Store) fleet.TrustStore {
	return s
}

type trustLoaded struct {
	recs map[uint64]fleet.TrustRecord
	st   fleet.TrustState
}

func loadTrust(t testing.TB, s contract.Store) trustLoaded {
	t.Helper()
	l := trustLoaded{recs: map[uint64]fleet.TrustRecord{}}
	var err error
	l.st, err = trustStore(t, s).LoadTrust(testCtx(t), func(r fleet.TrustRecord) error {
		l.recs[r.DeviceID] = r
		return nil
	})
	if err != nil {
		t.Fatalf("load trust: %v", err)
	}
	return l
}

func sameTrust(a, b fleet.TrustRecord) bool {
	if a.DeviceID != b.DeviceID || a.Admission != b.Admission || !bytes.Equal(a.KeyHash, b.KeyHash) || (a.Request == nil) != (b.Request == nil) {
		return false
	}
	if a.Request == nil {
		return true
	}
	x, y := a.Request, b.Request
	return bytes.Equal(x.KeyHash, y.KeyHash) && x.At.Equal(y.At) && x.From == y.From && x.Approved == y.Approved
}

func testTrust(t *testing.T, h *handle) {
	ctx := testCtx(t)
	s := h.store
	b := &fleet.Batch{Profiles: []fleet.Profile{profile(1, "rut-x11", "7.04.2")}}
	for i, m := range trickyMachineIDs[:4] {
		b.Devices = append(b.Devices, device(uint64(i+1), m))
	}
	req := &fleet.EnrollRequest{KeyHash: tokenHash(90), At: t0.Add(1234567891), From: "[2001:db8::1]:443 'x'", Approved: true}
	want := []fleet.TrustRecord{
		{DeviceID: 1, Admission: fleet.Active, KeyHash: tokenHash(50)},
		{DeviceID: 2, Admission: fleet.Pending, KeyHash: tokenHash(51)},
		{DeviceID: 3, Admission: fleet.Blocked, Request: req},
		{DeviceID: 4, Admission: fleet.Decommissioned, KeyHash: tokenHash(53)},
	}
	b.Trust = append(b.Trust, want...)
	// Within a batch the later record of a device wins.
	b.Trust = append(b.Trust, fleet.TrustRecord{DeviceID: 1, Admission: fleet.Active, KeyHash: tokenHash(60)})
	want[0].KeyHash = tokenHash(60)
	commit(t, s, b)
	ts := trustStore(t, s)
	used := t0.Add(2 * time.Hour)
	tokens := []fleet.EnrollmentToken{
		{ID: 1, MachineID: "ü-ñ-日本-😀", Note: "line 3 'q'", CreatedAt: t0, ExpiresAt: t0.Add(time.Hour), Hash: tokenHash(70)},
		{ID: 2, CreatedAt: t0, ExpiresAt: t0.Add(24 * time.Hour), Hash: tokenHash(71)},
	}
	for _, tk := range tokens {
		if err := ts.SaveEnrollmentToken(ctx, tk); err != nil {
			t.Fatal(err)
		}
	}
	tokens[1].UsedAt, tokens[1].DeviceID, tokens[1].Revoked = &used, 4, true
	if err := ts.SaveEnrollmentToken(ctx, tokens[1]); err != nil {
		t.Fatal(err)
	}
	if err := ts.AddPreauthorized(ctx, []string{"M-ABC", "m-abc", "m-abc "}, t0); err != nil {
		t.Fatal(err)
	}
	if err := ts.AddPreauthorized(ctx, []string{"m-abc", "x"}, t0.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if err := ts.DeletePreauthorized(ctx, "M-ABC"); err != nil {
		t.Fatal(err)
	}

	check := func(s contract.Store, deleted uint64) {
		t.Helper()
		l := loadTrust(t, s)
		for _, w := range want {
			if w.DeviceID == deleted {
				if _, ok := l.recs[w.DeviceID]; ok {
					t.Errorf("deleted device %d still has a trust record", w.DeviceID)
				}
				continue
			}
			if got := l.recs[w.DeviceID]; !sameTrust(got, w) {
				t.Errorf("trust of device %d: got %+v (request %+v), want %+v (request %+v)", w.DeviceID, got, got.Request, w, w.Request)
			}
		}
		if len(l.st.Tokens) != 2 {
			t.Fatalf("tokens: %+v", l.st.Tokens)
		}
		for i, got := range l.st.Tokens {
			w := tokens[i]
			if got.ID != w.ID || got.MachineID != w.MachineID || got.Note != w.Note || !got.CreatedAt.Equal(w.CreatedAt) ||
				!got.ExpiresAt.Equal(w.ExpiresAt) || !bytes.Equal(got.Hash, w.Hash) || got.Revoked != w.Revoked ||
				got.DeviceID != w.DeviceID || (got.UsedAt == nil) != (w.UsedAt == nil) || (w.UsedAt != nil && !got.UsedAt.Equal(*w.UsedAt)) {
				t.Errorf("token %d: got %+v, want %+v", w.ID, got, w)
			}
		}
		pre := map[string]time.Time{}
		for _, p := range l.st.Preauthorized {
			pre[p.MachineID] = p.AddedAt
		}
		if len(pre) != 3 || !pre["m-abc"].Equal(t0) || !pre["m-abc "].Equal(t0) || !pre["x"].Equal(t0.Add(time.Hour)) {
			t.Errorf("preauthorized: %+v", l.st.Preauthorized)
		}
		if l.st.MaxDeletedDeviceID != deleted {
			t.Errorf("max deleted device ID %d, want %d", l.st.MaxDeletedDeviceID, deleted)
		}
	}
	check(s, 0)

	// Deleting device 3 removes it with its state, also what the same batch
	// wrote; its ID stays taken. (Its samples are left to retention.)
	commit(t, s, &fleet.Batch{
		States:  []fleet.StateRecord{state(3, 1, t0.Add(time.Hour))},
		Samples: []fleet.Sample{sample(3, 1, t0.Add(time.Hour)), sample(2, 1, t0.Add(time.Hour))},
		Trust:   []fleet.TrustRecord{{DeviceID: 3, Deleted: true}},
	})
	commit(t, s, &fleet.Batch{Trust: []fleet.TrustRecord{{DeviceID: 1, Deleted: true}}}) // a lower ID keeps the highest
	want = want[1:]
	s = h.reopen()
	check(s, 3)
	l := load(t, s)
	if _, ok := l.devices[3]; ok || len(l.devices) != 2 {
		t.Fatalf("devices after deletion: %v", l.devices)
	}
	if got := history(t, s, 2, fleet.HistoryQuery{}); len(got) != 1 {
		t.Fatalf("history of device 2: %v", got)
	}
}

// svcAdmission: the fleet's admission survives restarts on the backend.
func svcAdmission(t *testing.T, e *env) {
	real := e.register("m-1", "rut-x11", "7.04")
	e.push(real.Token, pushReq(t, 1, 0, "a"))
	// Someone with the fleet secret claims m-1: a request, no token.
	claim, err := e.svc.RegisterWith(e.ctx, protocol.RegisterRequest{MachineID: "m-1", DeviceType: "rut-x11", Firmware: "7.04",
		EnrollmentSecret: "s"}, fleet.Proof{Source: "192.0.2.1:1"})
	if err != nil || !claim.Pending || claim.Token != "" {
		t.Fatalf("claim: %+v %v", claim, err)
	}
	other := e.register("m-2", "rut-x11", "7.04")
	gone := e.register("m-3", "rut-x11", "7.04")
	if _, err := e.svc.Admit(e.ctx, 2, fleet.Block, "test"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.svc.Admit(e.ctx, 3, fleet.Delete, "test"); err != nil {
		t.Fatal(err)
	}
	tok, _, err := e.svc.CreateEnrollmentToken(e.ctx, "m-9", time.Hour, "", "test")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.svc.AddPreauthorized(e.ctx, []string{"m-8"}, "test"); err != nil {
		t.Fatal(err)
	}

	e.restart()
	e.push(real.Token, pushReq(t, 2, 0, "b"))
	if d := e.device(real.DeviceID); d.EnrollRequest == nil || d.EnrollRequest.From != "192.0.2.1:1" {
		t.Fatalf("request after restart: %+v", d.EnrollRequest)
	}
	if _, err := e.svc.Push(e.ctx, other.Token, pushReq(t, 1, 0, "")); !errors.Is(err, fleet.ErrBlocked) {
		t.Fatalf("blocked device after restart: %v", err)
	}
	if _, err := e.svc.Push(e.ctx, gone.Token, pushReq(t, 1, 0, "")); !errors.Is(err, fleet.ErrUnauthorized) {
		t.Fatalf("deleted device after restart: %v", err)
	}
	// The real device proves itself with its key: new token, request gone.
	r2, err := e.svc.Register(e.ctx, protocol.RegisterRequest{MachineID: "m-1", DeviceType: "rut-x11", Firmware: "7.04", DeviceKey: real.DeviceKey})
	if err != nil || r2.Token == "" || r2.DeviceID != real.DeviceID {
		t.Fatalf("re-registration with the key after restart: %+v %v", r2, err)
	}
	r9, err := e.svc.Register(e.ctx, protocol.RegisterRequest{MachineID: "m-9", DeviceType: "rut-x11", Firmware: "7.04", EnrollmentToken: tok})
	if err != nil || r9.Token == "" || r9.DeviceID != "4" {
		t.Fatalf("enrollment token after restart: %+v %v (ID 3 was deleted: the next is 4)", r9, err)
	}
	if ids := e.svc.PreauthorizedIDs(); len(ids) != 1 || ids[0].MachineID != "m-8" {
		t.Fatalf("preauthorized after restart: %+v", ids)
	}

	e.restart()
	if d := e.device(real.DeviceID); d.EnrollRequest != nil {
		t.Fatalf("request still there after a proven re-registration and a restart: %+v", d.EnrollRequest)
	}
	e.push(r2.Token, pushReq(t, 3, 0, "c"))
	if _, err := e.svc.Register(e.ctx, protocol.RegisterRequest{MachineID: "m-9", DeviceType: "rut-x11", Firmware: "7.04", EnrollmentToken: tok}); !errors.Is(err, fleet.ErrEnrollmentToken) {
		t.Fatalf("used enrollment token after restart: %v", err)
	}
	if r := e.register("m-10", "rut-x11", "7.04"); r.DeviceID != "5" {
		t.Fatalf("new device got ID %s, want 5", r.DeviceID)
	}
}
