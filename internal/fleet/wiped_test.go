package fleet

import (
	"context"
	"errors"
	"testing"
	"time"
)

// A device whose agent state was wiped registers again with the same
// machine ID (derived from its hardware) but without token or key. It is
// held as a re-enrollment request, never a second device; approved, or
// with an enrollment token, it is the same device with its history, and
// the old token is refused.
func TestWipedDeviceComesBackWithHistory(t *testing.T) {
	ctx := context.Background()
	st := newRecStore()
	s, c := newPolicyService(t, st, Options{})
	first, err := s.Register(ctx, reg("hw-1"))
	if err != nil {
		t.Fatal(err)
	}
	for seq := uint64(1); seq <= 3; seq++ {
		mustPush(t, s, first.Token, seq)
		c.add(5 * time.Minute)
	}
	count := func() int {
		_, _, n := s.Counts()
		return n
	}

	wiped, err := s.RegisterWith(ctx, reg("hw-1"), Proof{Source: "198.51.100.7:5000"})
	if err != nil || !wiped.Pending || wiped.Token != "" || wiped.New || wiped.DeviceID != first.DeviceID || wiped.DeviceKey == "" {
		t.Fatalf("wiped device's registration: %+v %v", wiped, err)
	}
	if n := count(); n != 1 {
		t.Fatalf("%d devices after the wiped registration", n)
	}
	poll := reg("hw-1")
	poll.DeviceKey = wiped.DeviceKey
	if r, err := s.Register(ctx, poll); err != nil || !r.Pending || r.Token != "" {
		t.Fatalf("poll before approval: %+v %v", r, err)
	}
	if _, err := s.Admit(ctx, 1, Approve, "alice"); err != nil {
		t.Fatal(err)
	}
	back, err := s.Register(ctx, poll)
	if err != nil || back.Token == "" || back.DeviceID != first.DeviceID || back.New {
		t.Fatalf("after approval: %+v %v", back, err)
	}
	if _, err := s.Push(ctx, first.Token, push(4, 0)); !errors.Is(err, ErrUnauthorized) {
		t.Fatalf("the old token after re-enrollment: %v", err)
	}
	mustPush(t, s, back.Token, 1) // a wiped agent counts from 1 again
	if h, err := s.History(ctx, 1, HistoryQuery{}); err != nil || len(h) != 4 {
		t.Fatalf("history: %d samples, %v; want the 3 before the wipe and 1 after", len(h), err)
	}

	// Wiped again; the operator made an enrollment token for its machine
	// ID: the same device at once, without the fleet secret.
	tok, _, err := s.CreateEnrollmentToken(ctx, "hw-1", time.Hour, "", "alice")
	if err != nil {
		t.Fatal(err)
	}
	withToken := reg("hw-1")
	withToken.EnrollmentSecret, withToken.EnrollmentToken = "", tok
	again, err := s.Register(ctx, withToken)
	if err != nil || again.Token == "" || again.DeviceID != first.DeviceID || again.DeviceKey == "" {
		t.Fatalf("with an enrollment token: %+v %v", again, err)
	}
	if _, err := s.Push(ctx, back.Token, push(2, 0)); !errors.Is(err, ErrUnauthorized) {
		t.Fatalf("the token before the second wipe: %v", err)
	}
	// Neither secret nor token: refused, not a request.
	bare := reg("hw-1")
	bare.EnrollmentSecret = ""
	if _, err := s.Register(ctx, bare); !errors.Is(err, ErrEnrollment) {
		t.Fatalf("without any credential: %v", err)
	}
	if n := count(); n != 1 {
		t.Fatalf("%d devices at the end", n)
	}
}
