package server_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/internal/server"
	"github.com/drover/drover/internal/server/servertest"
)

// sslClient runs `openssl s_client` against addr with args, sends one HTTP
// request, and returns whether the handshake succeeded and what was printed.
func sslClient(t *testing.T, addr string, args ...string) (bool, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "openssl", append([]string{"s_client", "-connect", addr, "-servername", "localhost", "-brief", "-ign_eof"}, args...)...)
	cmd.Stdin = strings.NewReader("GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("openssl s_client %v: timed out: %s", args, out.String())
	}
	return err == nil && strings.Contains(out.String(), "CONNECTION ESTABLISHED"), out.String()
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func needOpenSSL(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("openssl"); err != nil {
		t.Fatal("the TLS policy is tested with openssl s_client: install openssl (scripts/test.sh does)")
	}
}

// permissiveServer answers any TLS 1.0–1.3 client with any suite crypto/tls
// has: the control showing that the client really tries what the policy
// refuses, so that a refusal by the client itself cannot pass as the
// server's.
func permissiveServer(t *testing.T, cert tls.Certificate) string {
	t.Helper()
	var suites []uint16
	for _, s := range append(tls.CipherSuites(), tls.InsecureCipherSuites()...) {
		suites = append(suites, s.ID)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{
		Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS10, CipherSuites: suites,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				c.SetDeadline(time.Now().Add(10 * time.Second))
				buf := make([]byte, 4096)
				c.Read(buf)
				io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 15\r\nConnection: close\r\n\r\n{\"status\":\"ok\"}")
			}()
		}
	}()
	return ln.Addr().String()
}

// The HTTPS listener's policy, tried with a real client (openssl s_client):
// TLS 1.3, and TLS 1.2 with ECDHE and AEAD only; CBC suites only with
// -tls-allow-legacy-cbc; TLS 1.0 and 1.1 never.
func TestTLSPolicyOpenSSL(t *testing.T) {
	needOpenSSL(t)
	def := servertest.Start(t, servertest.Options{})
	legacy := servertest.Start(t, servertest.Options{Configure: func(c *server.Config) { c.TLSAllowLegacyCBC = true }})
	hybrid := servertest.Start(t, servertest.Options{Configure: func(c *server.Config) { c.TLSKeyExchange = server.KeyExchangeHybrid }})
	cert, err := tls.X509KeyPair(def.CACertPEM, mustRead(t, def.Config.DataDir+"/tls/key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	control := permissiveServer(t, cert)
	addr := func(s *servertest.Server) string { return strings.TrimPrefix(s.URL, "https://") }

	// OpenSSL's own configuration (Debian: SECLEVEL=2, TLS 1.2 minimum)
	// would refuse TLS 1.0/1.1 and SHA-1 suites by itself: lower it so that
	// only the server decides.
	low := "@SECLEVEL=0"
	cases := []struct {
		name                  string
		args                  []string
		def, legacy, hybrid   bool
		protocol, cipher, kex string // expected in the accepted output
	}{
		{"TLS 1.3", []string{"-tls1_3"}, true, true, true, "TLSv1.3", "", ""},
		{"TLS 1.3 ChaCha20", []string{"-tls1_3", "-ciphersuites", "TLS_CHACHA20_POLY1305_SHA256"}, true, true, true, "TLSv1.3", "TLS_CHACHA20_POLY1305_SHA256", ""},
		{"TLS 1.3 X25519", []string{"-tls1_3", "-groups", "X25519"}, true, true, true, "TLSv1.3", "", "X25519"},
		{"TLS 1.3 P-256", []string{"-tls1_3", "-groups", "P-256"}, true, true, true, "TLSv1.3", "", "ECDH, prime256v1"},
		{"TLS 1.3 P-521 only", []string{"-tls1_3", "-groups", "P-521"}, false, false, false, "", "", ""},
		{"AES128-GCM", []string{"-tls1_2", "-cipher", "ECDHE-ECDSA-AES128-GCM-SHA256"}, true, true, true, "TLSv1.2", "ECDHE-ECDSA-AES128-GCM-SHA256", ""},
		{"AES256-GCM", []string{"-tls1_2", "-cipher", "ECDHE-ECDSA-AES256-GCM-SHA384"}, true, true, true, "TLSv1.2", "ECDHE-ECDSA-AES256-GCM-SHA384", ""},
		{"ChaCha20", []string{"-tls1_2", "-cipher", "ECDHE-ECDSA-CHACHA20-POLY1305"}, true, true, true, "TLSv1.2", "ECDHE-ECDSA-CHACHA20-POLY1305", ""},
		{"CBC-SHA1 AES128", []string{"-tls1_2", "-cipher", "ECDHE-ECDSA-AES128-SHA" + low}, false, true, false, "TLSv1.2", "ECDHE-ECDSA-AES128-SHA", ""},
		{"CBC-SHA1 AES256", []string{"-tls1_2", "-cipher", "ECDHE-ECDSA-AES256-SHA" + low}, false, true, false, "TLSv1.2", "ECDHE-ECDSA-AES256-SHA", ""},
		{"CBC-SHA256", []string{"-tls1_2", "-cipher", "ECDHE-ECDSA-AES128-SHA256" + low}, false, false, false, "", "", ""},
		{"TLS 1.1", []string{"-tls1_1", "-cipher", "DEFAULT" + low}, false, false, false, "", "", ""},
		{"TLS 1.0", []string{"-tls1", "-cipher", "DEFAULT" + low}, false, false, false, "", "", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if ok, out := sslClient(t, control, c.args...); !ok {
				t.Fatalf("control: openssl cannot do %v even with a permissive server: %s", c.args, out)
			}
			for _, srv := range []struct {
				name string
				s    *servertest.Server
				want bool
			}{{"default", def, c.def}, {"tls-allow-legacy-cbc", legacy, c.legacy}, {"tls-key-exchange=hybrid", hybrid, c.hybrid}} {
				ok, out := sslClient(t, addr(srv.s), c.args...)
				if ok != srv.want {
					t.Fatalf("%s: handshake %v, want %v:\n%s", srv.name, ok, srv.want, out)
				}
				if !ok {
					continue
				}
				for _, want := range []string{"Protocol version: " + c.protocol, "Ciphersuite: " + c.cipher, "Server Temp Key: " + c.kex, `"status":"ok"`} {
					if !strings.Contains(out, want) {
						t.Fatalf("%s: %q missing:\n%s", srv.name, want, out)
					}
				}
			}
		})
	}
}

// tls-key-exchange: hybrid agrees on X25519MLKEM768 with a client offering
// it (Go's default, the Go agent's); classic never does; a list of groups
// limits the server to them.
func TestTLSKeyExchangeSetting(t *testing.T) {
	for _, c := range []struct {
		kx          string
		want        tls.CurveID
		pqOnlyWorks bool
	}{
		{server.KeyExchangeHybrid, tls.X25519MLKEM768, true},
		{server.KeyExchangeClassic, tls.X25519, false},
		{"p256", tls.CurveP256, false}, // after a HelloRetryRequest: Go's client sends X25519 shares
		{"p384, x25519", tls.X25519, false},
	} {
		s := servertest.Start(t, servertest.Options{Configure: func(cfg *server.Config) { cfg.TLSKeyExchange = c.kx }})
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(s.CACertPEM)
		addr := strings.TrimPrefix(s.URL, "https://")
		dial := func(groups ...tls.CurveID) (*tls.Conn, error) {
			d := &net.Dialer{Timeout: 10 * time.Second}
			return tls.DialWithDialer(d, "tcp", addr, &tls.Config{RootCAs: pool, ServerName: "localhost", CurvePreferences: groups})
		}
		conn, err := dial()
		if err != nil {
			t.Fatalf("%s: %v", c.kx, err)
		}
		if got := conn.ConnectionState().CurveID; got != c.want {
			t.Errorf("%s: key exchange %v, want %v", c.kx, got, c.want)
		}
		conn.Close()
		conn, err = dial(tls.X25519MLKEM768)
		if (err == nil) != c.pqOnlyWorks {
			t.Errorf("%s: client offering only X25519MLKEM768: err = %v", c.kx, err)
		}
		if conn != nil {
			conn.Close()
		}
	}
	cfg := server.DefaultConfig()
	cfg.TLSKeyExchange = "quantum"
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "tls-key-exchange") {
		t.Fatalf("bad -tls-key-exchange: %v", err)
	}
}
