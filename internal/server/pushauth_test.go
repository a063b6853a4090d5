package server

import (
	"context"
	"net/http/httptest"
	"testing"

	"github.com/drover/drover/internal/fleet"
	"github.com/drover/drover/internal/protocol"
	"github.com/drover/drover/internal/server/transport"
)

// The push's authentication, checked before the body is read, travels on
// the request's context to the push handler: the request admitPush
// returns carries it, for its own token only; the connection keeps
// nothing of it for the next request.
func TestPushAuthOnRequestContext(t *testing.T) {
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
	api := &api{fleet: f, m: newMetrics(), log: discardLogger()}
	conn := transport.WithConn(ctx, nil)
	request := func(token string) *httptest.ResponseRecorder {
		t.Helper()
		w := httptest.NewRecorder()
		r := httptest.NewRequest("POST", protocol.PathPush, nil).WithContext(conn)
		r.Header.Set("Authorization", "Bearer "+token)
		r2, refused := api.admitPush(w, r)
		if refused {
			t.Fatalf("token %q refused: %d %s", token, w.Code, w.Body)
		}
		if r2 == r || transport.ConnOf(r2.Context()) == nil {
			t.Fatal("the admitted request is not r with the connection's context and the authentication")
		}
		if _, err := f.Push(r2.Context(), token, protocol.PushRequest{RawState: []byte(`{}`)}); err != nil {
			t.Fatalf("push with its authentication: %v", err)
		}
		if _, err := f.Push(r2.Context(), token+"x", protocol.PushRequest{RawState: []byte(`{}`)}); err == nil {
			t.Fatal("a wrong token was accepted with another token's authentication")
		}
		return w
	}
	request(a)
	request(b) // same connection, another token
	if transport.ConnOf(conn).Refused.Load() {
		t.Fatal("connection marked refused")
	}
}
