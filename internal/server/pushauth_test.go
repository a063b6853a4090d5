package server

import (
	"context"
	"net/http/httptest"
	"testing"

	"github.com/drover/drover/internal/fleet"
	"github.com/drover/drover/internal/protocol"
)

// The quota check's token lookup is handed to the push on the same
// connection only for the same token, and only once.
func TestTakePushAuth(t *testing.T) {
	ctx := context.Background()
	f, err := fleet.New(ctx, fleet.Stores{}, nil, fleet.Options{EnrollmentSecret: "s"})
	if err != nil {
		t.Fatal(err)
	}
	reg := func(m string) string {
		resp, err := f.Register(ctx, protocol.RegisterRequest{MachineID: m, DeviceType: "t", Firmware: "f", EnrollmentSecret: "s"})
		if err != nil {
			t.Fatal(err)
		}
		return resp.Token
	}
	a, b := reg("m-a"), reg("m-b")
	r := httptest.NewRequest("POST", protocol.PathPush, nil)
	r = r.WithContext(withConnState(ctx, nil))
	cs := r.Context().Value(connKey{}).(*connState)

	if _, ok := takePushAuth(r, a); ok {
		t.Fatal("a PushAuth before any quota check")
	}
	auth, err := f.CheckPush(a)
	if err != nil {
		t.Fatal(err)
	}
	cs.push = auth
	if _, ok := takePushAuth(r, b); ok {
		t.Fatal("token b got token a's PushAuth")
	}
	cs.push = auth
	got, ok := takePushAuth(r, a)
	if !ok || got.Token() != a {
		t.Fatalf("token a: %v %q", ok, got.Token())
	}
	if _, ok := takePushAuth(r, a); ok {
		t.Fatal("a PushAuth used twice")
	}
	if _, err := f.PushChecked(ctx, got, protocol.PushRequest{RawState: []byte(`{}`)}); err != nil {
		t.Fatalf("push with the PushAuth: %v", err)
	}
	if _, err := f.PushChecked(ctx, f.LookUpToken(a+"x"), protocol.PushRequest{RawState: []byte(`{}`)}); err == nil {
		t.Fatal("a wrong token's PushAuth was accepted")
	}
}
