package agent

import (
	"crypto/tls"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/drover/drover/internal/server"
	"github.com/drover/drover/internal/server/servertest"
)

// The agent's key exchange follows its setting against a server that offers
// both (crypto/tls defaults: hybrid first).
func TestTLSKeyExchange(t *testing.T) {
	t.Parallel()
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	srv.StartTLS()
	defer srv.Close()
	for _, tc := range []struct {
		setting string
		want    tls.CurveID
	}{{"", tls.X25519}, {"classic", tls.X25519}, {"x25519", tls.X25519}, {"p256", tls.CurveP256}, {"hybrid", tls.X25519MLKEM768}} {
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

// Against the real server (default setting: classic, and hybrid): the
// agent's key exchange and version settings are the ones negotiated, and
// its second connection resumes the first one's TLS session from the
// server's ticket (at TLS 1.2 too, where --tls-max-version 1.2 on either
// side lands).
func TestTLSKeyExchangeAndResumptionWithServer(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		server, agent       string
		serverMax, agentMax string
		want                tls.CurveID
		wantVersion         uint16
	}{
		{"classic", "", "", "", tls.X25519, tls.VersionTLS13},
		{"classic", "x25519", "", "", tls.X25519, tls.VersionTLS13},
		{"classic", "p256", "", "", tls.CurveP256, tls.VersionTLS13},
		{"hybrid", "hybrid", "", "", tls.X25519MLKEM768, tls.VersionTLS13},
		{"hybrid", "classic", "", "", tls.X25519, tls.VersionTLS13},
		{"p256", "classic", "", "", tls.CurveP256, tls.VersionTLS13}, // the server's one group, after a HelloRetryRequest
		{"classic", "classic", "1.3", "1.2", tls.X25519, tls.VersionTLS12},
		{"classic", "classic", "1.2", "1.3", tls.X25519, tls.VersionTLS12},
	} {
		t.Run(tc.server+"/"+tc.agent+"/"+tc.serverMax+"/"+tc.agentMax, func(t *testing.T) {
			s := servertest.Start(t, servertest.Options{Configure: func(c *server.Config) {
				c.TLSKeyExchange = tc.server
				if tc.serverMax != "" {
					c.TLSMaxVersion = tc.serverMax
				}
			}})
			ca := filepath.Join(t.TempDir(), "ca.pem")
			if err := os.WriteFile(ca, s.CACertPEM, 0o644); err != nil {
				t.Fatal(err)
			}
			c, err := newClient(s.URL, TLSOptions{CACert: ca, KeyExchange: tc.agent, MaxVersion: tc.agentMax}, 10*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			var resumed []bool
			for range 3 {
				resp, err := c.http.Get(s.URL + "/healthz")
				if err != nil {
					t.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				// (A TLS 1.2 resumption reports the first session's group.)
				if got := resp.TLS.CurveID; got != tc.want {
					t.Errorf("key exchange %v, want %v", got, tc.want)
				}
				if resp.TLS.Version != tc.wantVersion {
					t.Errorf("TLS version %x, want %x", resp.TLS.Version, tc.wantVersion)
				}
				resumed = append(resumed, resp.TLS.DidResume)
				// The next push opens a new connection, as after the idle timeout.
				c.http.CloseIdleConnections()
			}
			if !slices.Equal(resumed, []bool{false, true, true}) {
				t.Fatalf("resumed %v, want [false true true]", resumed)
			}
		})
	}
}
