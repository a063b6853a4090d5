package agent

import (
	"crypto/tls"
	"net/http"
	"net/http/httptest"
	"testing"
)

// The agent's key exchange follows its setting against a server that offers
// both (crypto/tls defaults: hybrid first).
func TestTLSKeyExchange(t *testing.T) {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	srv.StartTLS()
	defer srv.Close()
	for _, tc := range []struct {
		setting string
		want    tls.CurveID
	}{{"", tls.X25519}, {"classic", tls.X25519}, {"hybrid", tls.X25519MLKEM768}} {
		cfg, err := TLSOptions{KeyExchange: tc.setting}.config()
		if err != nil {
			t.Fatalf("%q: %v", tc.setting, err)
		}
		cfg.RootCAs = srv.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs
		conn, err := tls.Dial("tcp", srv.Listener.Addr().String(), cfg)
		if err != nil {
			t.Fatalf("%q: dial: %v", tc.setting, err)
		}
		got := conn.ConnectionState().CurveID
		conn.Close()
		if got != tc.want {
			t.Errorf("key exchange %q: negotiated %v, want %v", tc.setting, got, tc.want)
		}
	}
	if _, err := (TLSOptions{KeyExchange: "pq"}).config(); err == nil {
		t.Error("an unknown key exchange setting was accepted")
	}
}
