package fleet

import (
	"context"
	"errors"
	"testing"
)

// TestRefusedPushSelectsNoProfile: a push that is refused (its device is
// blocked) is refused before its firmware selects a profile: nothing of
// it is kept, not even a profile created for the new firmware.
func TestRefusedPushSelectsNoProfile(t *testing.T) {
	ctx := context.Background()
	s, _, _ := newService(t, newRecStore())
	r, err := s.Register(ctx, reg("m-1"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Admit(ctx, 1, Block, "alice"); err != nil {
		t.Fatal(err)
	}
	before := len(s.Profiles())
	p := push(1, 0)
	p.State.Firmware = "9.9.9"
	if _, err := s.Push(ctx, r.Token, p); !errors.Is(err, ErrBlocked) {
		t.Fatalf("push when blocked: %v", err)
	}
	if got := s.Profiles(); len(got) != before {
		t.Fatalf("a blocked device's push made %d profiles into %d: %+v", before, len(got), got)
	}
}

// TestPushAuthOnContext: the authentication CheckPush made before the body
// was read is used by Push for the same token only; Push authenticates any
// other token itself.
func TestPushAuthOnContext(t *testing.T) {
	ctx := context.Background()
	s, _, _ := newService(t, newRecStore())
	a, _ := s.Register(ctx, reg("m-a"))
	b, _ := s.Register(ctx, reg("m-b"))
	auth, err := s.CheckPush(a.Token)
	if err != nil || auth.Token() != a.Token {
		t.Fatalf("CheckPush: %q %v", auth.Token(), err)
	}
	actx := WithPushAuth(ctx, auth)
	if _, err := s.Push(actx, a.Token, push(1, 0)); err != nil {
		t.Fatalf("push with its authentication: %v", err)
	}
	if _, err := s.Push(actx, b.Token, push(1, 0)); err != nil {
		t.Fatalf("push of b with a's authentication on the context: %v", err)
	}
	if d, _ := s.Device(ctx, 2); d.Seq != 1 {
		t.Fatalf("b's push not recorded as b's: %+v", d)
	}
	if _, err := s.Push(actx, a.Token+"x", push(2, 0)); !errors.Is(err, ErrUnauthorized) {
		t.Fatalf("a wrong token with a's authentication on the context: %v", err)
	}
	wrong, err := s.CheckPush(a.Token + "x")
	if !errors.Is(err, ErrUnauthorized) {
		t.Fatalf("CheckPush of a wrong token: %v", err)
	}
	if _, err := s.Push(WithPushAuth(ctx, wrong), a.Token+"x", push(2, 0)); !errors.Is(err, ErrUnauthorized) {
		t.Fatalf("a wrong token's authentication was accepted: %v", err)
	}
}
