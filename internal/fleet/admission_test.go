package fleet

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/drover/drover/internal/protocol"
)

func newPolicyService(t *testing.T, st *recStore, o Options) (*Service, *clock) {
	t.Helper()
	c := &clock{t: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
	o.EnrollmentSecret, o.Now = "sesame", c.now
	s, err := New(context.Background(), Stores{Devices: st}, NewWriteThrough(st, 0, nil), o)
	if err != nil {
		t.Fatal(err)
	}
	return s, c
}

func mustPush(t *testing.T, s *Service, token string, seq uint64) {
	t.Helper()
	if _, err := s.Push(context.Background(), token, push(seq, 0)); err != nil {
		t.Fatalf("push %d: %v", seq, err)
	}
}

// An attacker who knows the fleet secret and a device's machine ID gets no
// token; the real device keeps working and proves itself with its key.
func TestTakeoverRefused(t *testing.T) {
	ctx := context.Background()
	st := newRecStore()
	s, _ := newPolicyService(t, st, Options{})
	real, err := s.Register(ctx, reg("m-1"))
	if err != nil || real.Token == "" || real.DeviceKey == "" || real.Pending {
		t.Fatalf("first registration: %+v %v", real, err)
	}
	mustPush(t, s, real.Token, 1)

	evil, err := s.RegisterWith(ctx, reg("m-1"), Proof{Source: "203.0.113.9:4444"})
	if err != nil || !evil.Pending || evil.Token != "" || evil.DeviceKey == "" || evil.New {
		t.Fatalf("attacker's registration: %+v %v", evil, err)
	}
	mustPush(t, s, real.Token, 2) // still works
	d, _ := s.Device(ctx, 1)
	if d.EnrollRequest == nil || d.EnrollRequest.From != "203.0.113.9:4444" || d.Admission != "active" {
		t.Fatalf("device shows %+v", d)
	}
	// The attacker polls with its request key: still pending, no token.
	poll := reg("m-1")
	poll.DeviceKey = evil.DeviceKey
	if r, err := s.Register(ctx, poll); err != nil || !r.Pending || r.Token != "" {
		t.Fatalf("poll: %+v %v", r, err)
	}
	// A second claimant is refused while the first request waits.
	if _, err := s.Register(ctx, reg("m-1")); !errors.Is(err, ErrEnrollConflict) {
		t.Fatalf("second claimant: %v", err)
	}
	// The operator rejects; the real device re-registers with its key.
	if _, err := s.Admit(ctx, 1, Reject, "test"); err != nil {
		t.Fatal(err)
	}
	if r, err := s.Register(ctx, poll); err != nil || r.Token != "" || !r.Pending {
		t.Fatalf("rejected requester asks again (a new request): %+v %v", r, err)
	}
	again := reg("m-1")
	again.DeviceKey = real.DeviceKey
	r2, err := s.Register(ctx, again)
	if err != nil || r2.Token == "" || r2.DeviceID != "1" || r2.DeviceKey != "" {
		t.Fatalf("re-registration with the key: %+v %v", r2, err)
	}
	if _, err := s.Push(ctx, real.Token, push(3, 0)); !errors.Is(err, ErrUnauthorized) {
		t.Fatalf("old token after re-registration: %v", err)
	}
	mustPush(t, s, r2.Token, 3)
	if d, _ := s.Device(ctx, 1); d.EnrollRequest != nil {
		t.Fatalf("a proven re-registration leaves the request: %+v", d.EnrollRequest)
	}
	// The current token as bearer proves the device too.
	r3, err := s.RegisterWith(ctx, reg("m-1"), Proof{Token: r2.Token})
	if err != nil || r3.Token == "" {
		t.Fatalf("re-registration with the token: %+v %v", r3, err)
	}
	// Another device's token proves nothing about m-1.
	other, _ := s.Register(ctx, reg("m-2"))
	if r, err := s.RegisterWith(ctx, reg("m-1"), Proof{Token: other.Token}); err != nil || r.Token != "" || !r.Pending {
		t.Fatalf("another device's token: %+v %v", r, err)
	}
}

// A device that really lost its credentials files a request; once an
// operator approves it, the requester (and only it) gets a token.
func TestReenrollApproved(t *testing.T) {
	ctx := context.Background()
	s, _ := newPolicyService(t, newRecStore(), Options{})
	first, _ := s.Register(ctx, reg("m-1"))
	req, err := s.Register(ctx, reg("m-1"))
	if err != nil || !req.Pending {
		t.Fatalf("request: %+v %v", req, err)
	}
	if _, err := s.Admit(ctx, 1, Approve, "alice"); err != nil {
		t.Fatal(err)
	}
	mustPush(t, s, first.Token, 1) // approval alone revokes nothing
	poll := reg("m-1")
	poll.DeviceKey = req.DeviceKey
	r, err := s.Register(ctx, poll)
	if err != nil || r.Token == "" || r.Pending {
		t.Fatalf("approved poll: %+v %v", r, err)
	}
	if _, err := s.Push(ctx, first.Token, push(2, 0)); !errors.Is(err, ErrUnauthorized) {
		t.Fatalf("old token: %v", err)
	}
	mustPush(t, s, r.Token, 2)
	// The request's key is now the device key.
	if r, err := s.Register(ctx, poll); err != nil || r.Token == "" {
		t.Fatalf("key after approval: %+v %v", r, err)
	}
	if _, err := s.Admit(ctx, 1, Approve, "alice"); !errors.Is(err, ErrNothingToDo) {
		t.Fatalf("approve with nothing waiting: %v", err)
	}
}

func TestPolicyApprove(t *testing.T) {
	ctx := context.Background()
	st := newRecStore()
	s, _ := newPolicyService(t, st, Options{Admission: PolicyApprove})
	r, err := s.Register(ctx, reg("m-1"))
	if err != nil || !r.Pending || !r.New || r.Token != "" || r.DeviceKey == "" || r.RetryAfter != PendingRetry {
		t.Fatalf("new device: %+v %v", r, err)
	}
	pending := Pending
	if p, err := s.Query(Query{Filter: Filter{Admission: AdmissionFilter{Admission: &pending}}}); err != nil || len(p.Devices) != 1 {
		t.Fatalf("pending filter: %+v", p)
	}
	poll := reg("m-1")
	poll.DeviceKey = r.DeviceKey
	if r, err := s.Register(ctx, poll); err != nil || !r.Pending {
		t.Fatalf("poll: %+v %v", r, err)
	}
	if _, err := s.Register(ctx, reg("m-1")); !errors.Is(err, ErrEnrollConflict) {
		t.Fatalf("claimant without the key: %v", err)
	}
	if _, err := s.Admit(ctx, 1, Approve, "alice"); err != nil {
		t.Fatal(err)
	}
	ok, err := s.Register(ctx, poll)
	if err != nil || ok.Token == "" || ok.Pending {
		t.Fatalf("after approval: %+v %v", ok, err)
	}
	mustPush(t, s, ok.Token, 1)

	// Rejecting a pending device forgets it; its ID is not reused.
	r2, _ := s.Register(ctx, reg("m-2"))
	if _, err := s.Admit(ctx, 2, Reject, "alice"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Device(ctx, 2); !errors.Is(err, ErrNotFound) {
		t.Fatalf("rejected device: %v", err)
	}
	r3, _ := s.Register(ctx, reg("m-2"))
	if r3.DeviceID != "3" || !r3.Pending || r3.DeviceKey == r2.DeviceKey {
		t.Fatalf("after rejection: %+v", r3)
	}
}

func TestPolicyPreauthorized(t *testing.T) {
	ctx := context.Background()
	st := newRecStore()
	s, _ := newPolicyService(t, st, Options{Admission: PolicyPreauthorized})
	if _, err := s.Register(ctx, reg("m-1")); !errors.Is(err, ErrNotPreauthorized) {
		t.Fatalf("unlisted: %v", err)
	}
	if len(st.devices) != 0 || len(st.profiles) != 0 {
		t.Fatalf("an unlisted device was stored: %v %v", st.devices, st.profiles)
	}
	if n, err := s.AddPreauthorized(ctx, []string{"m-1", "m-1", "m-2"}, "alice"); err != nil || n != 2 {
		t.Fatalf("add: %d %v", n, err)
	}
	if _, err := s.AddPreauthorized(ctx, []string{"bad\x01"}, "alice"); !errors.Is(err, ErrInvalid) {
		t.Fatalf("invalid machine ID: %v", err)
	}
	r, err := s.Register(ctx, reg("m-1"))
	if err != nil || r.Token == "" {
		t.Fatalf("listed: %+v %v", r, err)
	}
	ids := s.PreauthorizedIDs()
	if len(ids) != 2 || ids[0].MachineID != "m-1" || ids[0].DeviceID != 1 || ids[1].DeviceID != 0 {
		t.Fatalf("list: %+v", ids)
	}
	if err := s.RemovePreauthorized(ctx, "m-2", "alice"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Register(ctx, reg("m-2")); !errors.Is(err, ErrNotPreauthorized) {
		t.Fatalf("removed: %v", err)
	}
}

func TestBlockDecommissionDelete(t *testing.T) {
	ctx := context.Background()
	st := newRecStore()
	s, _ := newPolicyService(t, st, Options{})
	r, _ := s.Register(ctx, reg("m-1"))
	mustPush(t, s, r.Token, 1)
	if d, err := s.Admit(ctx, 1, Block, "alice"); err != nil || d.Admission != "blocked" {
		t.Fatalf("block: %+v %v", d, err)
	}
	samples := len(st.samples)
	if _, err := s.Push(ctx, r.Token, push(2, 0)); !errors.Is(err, ErrBlocked) {
		t.Fatalf("push when blocked: %v", err)
	}
	key := reg("m-1")
	key.DeviceKey = r.DeviceKey
	for _, rq := range []protocol.RegisterRequest{reg("m-1"), key} {
		if _, err := s.Register(ctx, rq); !errors.Is(err, ErrBlocked) {
			t.Fatalf("register when blocked: %v", err)
		}
	}
	if len(st.samples) != samples || st.states[1].Seq != 1 {
		t.Fatalf("a blocked device's push was stored")
	}
	if _, err := s.Admit(ctx, 1, Decommission, "alice"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Push(ctx, r.Token, push(2, 0)); !errors.Is(err, ErrDecommissioned) {
		t.Fatalf("push when decommissioned: %v", err)
	}
	if _, err := s.Admit(ctx, 1, Approve, "alice"); err != nil {
		t.Fatal(err)
	}
	mustPush(t, s, r.Token, 2) // re-admitted with its credentials
	if _, err := s.Admit(ctx, 1, Delete, "alice"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Push(ctx, r.Token, push(3, 0)); !errors.Is(err, ErrUnauthorized) {
		t.Fatalf("push when deleted: %v", err)
	}
	if _, err := s.Admit(ctx, 1, Block, "alice"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("action on a deleted device: %v", err)
	}
	if n, err := s.Query(Query{}); err != nil || len(n.Devices) != 0 {
		t.Fatalf("deleted device listed: %+v", n)
	}
	r2, err := s.Register(ctx, reg("m-1"))
	if err != nil || !r2.New || r2.DeviceID != "2" {
		t.Fatalf("machine ID after deletion: %+v %v", r2, err)
	}
}

func TestEnrollmentTokens(t *testing.T) {
	ctx := context.Background()
	s, c := newPolicyService(t, newRecStore(), Options{Admission: PolicyPreauthorized})
	tok, et, err := s.CreateEnrollmentToken(ctx, "m-1", time.Hour, "factory line 3", "alice")
	if err != nil || et.ID != 1 || et.MachineID != "m-1" {
		t.Fatalf("create: %q %+v %v", tok, et, err)
	}
	withToken := func(machine, token string) protocol.RegisterRequest {
		r := reg(machine)
		r.EnrollmentSecret, r.EnrollmentToken = "", token
		return r
	}
	if _, err := s.Register(ctx, withToken("m-2", tok)); !errors.Is(err, ErrEnrollmentToken) {
		t.Fatalf("token for another machine: %v", err)
	}
	for _, bad := range []string{"et-1.x", tok + "x", "et-9." + tok[5:], "xx"} {
		if _, err := s.Register(ctx, withToken("m-1", bad)); !errors.Is(err, ErrEnrollmentToken) {
			t.Fatalf("token %q: %v", bad, err)
		}
	}
	r, err := s.Register(ctx, withToken("m-1", tok))
	if err != nil || r.Token == "" || r.DeviceKey == "" {
		t.Fatalf("with token (preauthorized policy, no secret): %+v %v", r, err)
	}
	if _, err := s.Register(ctx, withToken("m-1", tok)); !errors.Is(err, ErrEnrollmentToken) {
		t.Fatalf("second use: %v", err)
	}
	if l := s.EnrollmentTokens(); len(l) != 1 || l[0].UsedAt == nil || l[0].DeviceID != 1 {
		t.Fatalf("list: %+v", l)
	}
	// An unbound token re-keys a known device that lost everything.
	tok2, _, _ := s.CreateEnrollmentToken(ctx, "", time.Hour, "", "alice")
	r2, err := s.Register(ctx, withToken("m-1", tok2))
	if err != nil || r2.Token == "" || r2.DeviceKey == "" || r2.DeviceKey == r.DeviceKey {
		t.Fatalf("re-key with a token: %+v %v", r2, err)
	}
	if _, err := s.Push(ctx, r.Token, push(1, 0)); !errors.Is(err, ErrUnauthorized) {
		t.Fatalf("old token: %v", err)
	}
	// Expired and revoked tokens are refused.
	tok3, _, _ := s.CreateEnrollmentToken(ctx, "", time.Minute, "", "alice")
	c.add(2 * time.Minute)
	if _, err := s.Register(ctx, withToken("m-3", tok3)); !errors.Is(err, ErrEnrollmentToken) {
		t.Fatalf("expired: %v", err)
	}
	tok4, et4, _ := s.CreateEnrollmentToken(ctx, "", time.Hour, "", "alice")
	if _, err := s.RevokeEnrollmentToken(ctx, et4.ID, "alice"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Register(ctx, withToken("m-4", tok4)); !errors.Is(err, ErrEnrollmentToken) {
		t.Fatalf("revoked: %v", err)
	}
	for _, bad := range []struct {
		m   string
		ttl time.Duration
	}{{"a\x00", time.Hour}, {"", time.Second}, {"", 400 * 24 * time.Hour}} {
		if _, _, err := s.CreateEnrollmentToken(ctx, bad.m, bad.ttl, "", "alice"); !errors.Is(err, ErrInvalid) {
			t.Fatalf("create %+v: %v", bad, err)
		}
	}
}

func TestCertificates(t *testing.T) {
	ctx := context.Background()
	s, _ := newPolicyService(t, newRecStore(), Options{Admission: PolicyApprove, RequireCertificate: true})
	noSecret := reg("m-1")
	noSecret.EnrollmentSecret = ""
	if _, err := s.Register(ctx, reg("m-1")); !errors.Is(err, ErrCertificateRequired) {
		t.Fatalf("without a certificate: %v", err)
	}
	if _, err := s.RegisterWith(ctx, noSecret, Proof{CertNames: []string{"m-2"}}); !errors.Is(err, ErrCertificateRequired) {
		t.Fatalf("another machine's certificate: %v", err)
	}
	r, err := s.RegisterWith(ctx, noSecret, Proof{CertNames: []string{"x", "m-1"}})
	if err != nil || r.Token == "" || r.Pending {
		t.Fatalf("with a certificate (approve policy, no secret): %+v %v", r, err)
	}
	r2, err := s.RegisterWith(ctx, noSecret, Proof{CertNames: []string{"m-1"}})
	if err != nil || r2.Token == "" || r2.DeviceID != r.DeviceID {
		t.Fatalf("again with a certificate: %+v %v", r2, err)
	}
}

// Admission state, keys, requests, tokens and preauthorized IDs survive a
// restart through a TrustStore (here the in-memory one of memTrust).
func TestTrustRestart(t *testing.T) {
	ctx := context.Background()
	st := &trustRecStore{recStore: newRecStore(), mem: newMemTrust()}
	open := func() *Service {
		s, err := New(ctx, Stores{Devices: st, Trust: st}, NewWriteThrough(st, 0, nil), Options{EnrollmentSecret: "sesame", Admission: PolicyApprove})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	s := open()
	p1, _ := s.Register(ctx, reg("m-1"))
	s.Admit(ctx, 1, Approve, "a")
	poll := reg("m-1")
	poll.DeviceKey = p1.DeviceKey
	a1, _ := s.Register(ctx, poll)
	s.Register(ctx, reg("m-2"))
	s.Register(ctx, reg("m-3"))
	s.Admit(ctx, 3, Block, "a")
	req, _ := s.Register(ctx, reg("m-1")) // re-enrollment request on device 1
	s.Register(ctx, reg("m-4"))
	s.Admit(ctx, 4, Delete, "a")
	tok, _, _ := s.CreateEnrollmentToken(ctx, "m-9", time.Hour, "n", "a")
	s.AddPreauthorized(ctx, []string{"m-8"}, "a")

	s = open()
	mustPush(t, s, a1.Token, 1)
	if d, _ := s.Device(ctx, 2); d.Admission != "pending" {
		t.Fatalf("device 2 after restart: %+v", d)
	}
	if d, _ := s.Device(ctx, 3); d.Admission != "blocked" {
		t.Fatalf("device 3 after restart: %+v", d)
	}
	if d, _ := s.Device(ctx, 1); d.EnrollRequest == nil {
		t.Fatalf("request lost: %+v", d)
	}
	poll2 := reg("m-1")
	poll2.DeviceKey = req.DeviceKey
	if r, err := s.Register(ctx, poll2); err != nil || !r.Pending {
		t.Fatalf("request key after restart: %+v %v", r, err)
	}
	if r, err := s.Register(ctx, poll); err != nil || r.Token == "" {
		t.Fatalf("device key after restart: %+v %v", r, err)
	}
	r5, _ := s.Register(ctx, reg("m-5"))
	if r5.DeviceID != "5" {
		t.Fatalf("new device after deleting 4 got %s", r5.DeviceID)
	}
	withToken := reg("m-9")
	withToken.EnrollmentToken = tok
	if r, err := s.Register(ctx, withToken); err != nil || r.Token == "" {
		t.Fatalf("enrollment token after restart: %+v %v", r, err)
	}
	if ids := s.PreauthorizedIDs(); len(ids) != 1 || ids[0].MachineID != "m-8" {
		t.Fatalf("preauthorized after restart: %+v", ids)
	}
}

// memTrust is an in-memory TrustStore for tests.
type memTrust struct {
	records    map[uint64]TrustRecord
	tokens     map[uint64]EnrollmentToken
	preauth    map[string]time.Time
	maxDeleted uint64
}

func newMemTrust() *memTrust {
	return &memTrust{records: map[uint64]TrustRecord{}, tokens: map[uint64]EnrollmentToken{}, preauth: map[string]time.Time{}}
}

type trustRecStore struct {
	*recStore
	mem *memTrust
}

func (s *trustRecStore) Commit(ctx context.Context, b *Batch) error {
	if err := s.recStore.Commit(ctx, b); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, t := range b.Trust {
		if t.Deleted {
			delete(s.devices, t.DeviceID)
			delete(s.states, t.DeviceID)
			delete(s.mem.records, t.DeviceID)
			s.mem.maxDeleted = max(s.mem.maxDeleted, t.DeviceID)
			continue
		}
		s.mem.records[t.DeviceID] = t
	}
	return nil
}

func (s *trustRecStore) LoadTrust(ctx context.Context, each func(TrustRecord) error) (TrustState, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range s.mem.records {
		if err := each(r); err != nil {
			return TrustState{}, err
		}
	}
	st := TrustState{MaxDeletedDeviceID: s.mem.maxDeleted}
	for _, t := range s.mem.tokens {
		st.Tokens = append(st.Tokens, t)
	}
	for id, at := range s.mem.preauth {
		st.Preauthorized = append(st.Preauthorized, Preauthorized{MachineID: id, AddedAt: at})
	}
	return st, nil
}

func (s *trustRecStore) SaveEnrollmentToken(ctx context.Context, t EnrollmentToken) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.mem.tokens[t.ID] = t
	return nil
}

func (s *trustRecStore) AddPreauthorized(ctx context.Context, ids []string, at time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, id := range ids {
		s.mem.preauth[id] = at
	}
	return nil
}

func (s *trustRecStore) DeletePreauthorized(ctx context.Context, id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.mem.preauth, id)
	return nil
}
