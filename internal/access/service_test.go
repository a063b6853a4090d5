package access_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/drover/drover/internal/access"
	"golang.org/x/crypto/bcrypt"
)

// countingStore counts the writes of last use.
type countingStore struct {
	*access.Mem
	touches atomic.Int32
}

func (c *countingStore) TouchToken(ctx context.Context, id string, at time.Time) error {
	c.touches.Add(1)
	return c.Mem.TouchToken(ctx, id, at)
}

// A token acts with its user's role; its last use is written once a
// minute, not per request; a change made in the store by another server
// (a revocation) is seen within CacheTTL; an expired token, a deleted
// user's token and anything not a token are refused.
func TestAuthenticate(t *testing.T) {
	ctx := context.Background()
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	st := &countingStore{Mem: access.NewMem()}
	svc := access.New(access.Options{Store: st, AdminToken: "bootstrap-token", Now: func() time.Time { return now }, BcryptCost: bcrypt.MinCost})
	if who, err := svc.Authenticate(ctx, "bootstrap-token"); err != nil || who != access.Bootstrap {
		t.Fatalf("admin token: %+v %v", who, err)
	}
	for _, bad := range []string{"", "bootstrap-toke", "drv_", "drv_00", "something"} {
		if _, err := svc.Authenticate(ctx, bad); !errors.Is(err, access.ErrUnauthorized) {
			t.Errorf("%q: %v", bad, err)
		}
	}
	if _, err := svc.AddUser(ctx, "otto", access.Operator, ""); err != nil {
		t.Fatal(err)
	}
	tk, secret, err := svc.CreateToken(ctx, "otto", "ci", now.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	for range 5 {
		who, err := svc.Authenticate(ctx, secret)
		if err != nil || who.Name != "otto" || who.Role != access.Operator || who.Credential != "token:ci" {
			t.Fatalf("token: %+v %v", who, err)
		}
	}
	if n := st.touches.Load(); n != 1 {
		t.Fatalf("%d last-use writes for 5 uses within a minute, want 1", n)
	}
	now = now.Add(61 * time.Second)
	svc.Authenticate(ctx, secret)
	if n := st.touches.Load(); n != 2 {
		t.Fatalf("%d last-use writes after a minute, want 2", n)
	}

	// Another server revokes it in the shared store.
	revoked := tk
	revoked.RevokedAt = now
	if err := st.SaveToken(ctx, revoked); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Authenticate(ctx, secret); err != nil {
		t.Fatalf("within the cache's 2 s the token may still pass: %v", err)
	}
	now = now.Add(2*time.Second + time.Millisecond)
	if _, err := svc.Authenticate(ctx, secret); !errors.Is(err, access.ErrUnauthorized) {
		t.Fatalf("revoked elsewhere, after the cache's TTL: %v", err)
	}

	_, s2, _ := svc.CreateToken(ctx, "otto", "short", now.Add(time.Minute))
	if _, err := svc.Authenticate(ctx, s2); err != nil {
		t.Fatal(err)
	}
	now = now.Add(time.Minute)
	if _, err := svc.Authenticate(ctx, s2); !errors.Is(err, access.ErrUnauthorized) {
		t.Fatalf("expired: %v", err)
	}
	_, s3, _ := svc.CreateToken(ctx, "otto", "third", time.Time{})
	if err := svc.DeleteUser(ctx, "otto"); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Authenticate(ctx, s3); !errors.Is(err, access.ErrUnauthorized) {
		t.Fatalf("deleted user's token: %v", err)
	}
	if _, _, err := svc.CreateToken(ctx, "otto", "x", time.Time{}); !errors.Is(err, access.ErrNotFound) {
		t.Fatalf("token for nobody: %v", err)
	}
}

// Passwords: the user's, or the admin token for "admin"; a user without a
// password (tokens or single sign-on only) cannot log in with one; a
// session follows the user's current role and ends with the user.
func TestLoginAndSession(t *testing.T) {
	ctx := context.Background()
	svc := access.New(access.Options{AdminToken: "bootstrap-token", BcryptCost: bcrypt.MinCost})
	if who, err := svc.Login(ctx, "admin", "bootstrap-token"); err != nil || who.SessionName() != "" {
		t.Fatalf("bootstrap login: %+v %v", who, err)
	}
	if _, err := svc.AddUser(ctx, "ann", access.Viewer, "short"); !errors.Is(err, access.ErrInvalid) {
		t.Fatalf("short password: %v", err)
	}
	svc.AddUser(ctx, "ann", access.Viewer, "ann-password")
	svc.AddUser(ctx, "sso", access.Viewer, "")
	for _, c := range []struct{ user, pw string }{{"ann", "wrong-password"}, {"bob", "ann-password"}, {"sso", "anything-at-all"}, {"", "ann-password"}, {"ann", ""}} {
		if _, err := svc.Login(ctx, c.user, c.pw); !errors.Is(err, access.ErrUnauthorized) {
			t.Errorf("login %q/%q: %v", c.user, c.pw, err)
		}
	}
	who, err := svc.Login(ctx, "ann", "ann-password")
	if err != nil || who.Role != access.Viewer || who.SessionName() != "ann" {
		t.Fatalf("login: %+v %v", who, err)
	}
	op := access.Operator
	if _, err := svc.UpdateUser(ctx, "ann", access.UserChange{Role: &op}); err != nil {
		t.Fatal(err)
	}
	if who, err := svc.Session(ctx, "ann", "password"); err != nil || who.Role != access.Operator {
		t.Fatalf("session after the role change: %+v %v", who, err)
	}
	svc.DeleteUser(ctx, "ann")
	if _, err := svc.Session(ctx, "ann", "password"); !errors.Is(err, access.ErrUnauthorized) {
		t.Fatalf("session of a deleted user: %v", err)
	}
	if who, err := svc.ExternalLogin(ctx, "sso", access.Admin, "oidc"); err != nil || who.Role != access.Admin {
		t.Fatalf("external login: %+v %v", who, err)
	}
	svc.AddUser(ctx, "local", access.Viewer, "local-password")
	if _, err := svc.ExternalLogin(ctx, "local", access.Admin, "oidc"); !errors.Is(err, access.ErrExists) {
		t.Fatalf("external login as a local user: %v", err)
	}
}
