package server_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/letsencrypt/challtestsrv"
	"github.com/letsencrypt/pebble/v2/ca"
	"github.com/letsencrypt/pebble/v2/db"
	"github.com/letsencrypt/pebble/v2/va"
	"github.com/letsencrypt/pebble/v2/wfe"

	"github.com/drover/drover/internal/server"
	"github.com/drover/drover/internal/server/servertest"
	"github.com/drover/drover/internal/testwait"
)

// --acme-domains against Pebble, Let's Encrypt's ACME test server, run in
// this process (with its test DNS server): the first handshake naming the domain obtains a
// certificate through a real ACME exchange (account, order, tls-alpn-01
// challenge validated by Pebble connecting back to the server's HTTPS
// port, finalize), signed by Pebble's CA; a handshake without that name
// still gets the self-signed certificate; a restart takes the certificate
// from the cache directory without asking the CA again.
func TestACMECertificateFromPebble(t *testing.T) {
	t.Setenv("PEBBLE_VA_NOSLEEP", "1")
	t.Setenv("PEBBLE_WFE_NONCEREJECT", "0")
	logger := log.New(testWriter{t}, "pebble ", 0)
	var handler atomic.Value // the WFE, made once the server's port is known
	var requests atomic.Int64
	acmeSrv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		handler.Load().(http.Handler).ServeHTTP(w, r)
	}))
	defer acmeSrv.Close()
	dir := t.TempDir()
	caFile := filepath.Join(dir, "acme-ca.pem")
	os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: acmeSrv.Certificate().Raw}), 0o600)
	cacheDir := filepath.Join(dir, "acme-cache")
	configure := func(c *server.Config) {
		c.ACMEDomains = "fleet.drover.test"
		c.ACMEDirectoryURL = acmeSrv.URL + wfe.DirectoryPath
		c.ACMECACert = caFile
		c.ACMECacheDir = cacheDir
		c.ACMEEmail = "ops@example.org"
	}
	slogger := slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	s := servertest.Start(t, servertest.Options{DataDir: filepath.Join(dir, "data"), Configure: configure, Logger: slogger})
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(s.URL, "https://"))
	tlsPort, _ := strconv.Atoi(port)
	store := db.NewMemoryStore()
	pebbleCA := ca.New(logger, store, "", "ecdsa", 0, 1, map[string]ca.Profile{"default": {Description: "default"}})
	// Pebble's validator resolves fleet.drover.test with its own test DNS
	// server (every name: 127.0.0.1).
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dnsAddr := l.Addr().String()
	l.Close()
	dns, err := challtestsrv.New(challtestsrv.Config{DNSAddrs: []string{dnsAddr}, Log: logger})
	if err != nil {
		t.Fatal(err)
	}
	dns.SetDefaultDNSIPv4("127.0.0.1")
	dns.SetDefaultDNSIPv6("")
	dns.Run()
	defer dns.Shutdown()
	waitForDNS(t, dnsAddr)
	pebbleVA := va.New(logger, 0, tlsPort, false, dnsAddr, store)
	w := wfe.New(logger, store, pebbleVA, pebbleCA, nil, false, false, 3, 5)
	handler.Store(w.Handler())

	roots := x509.NewCertPool()
	roots.AddCert(pebbleCA.GetRootCert(0).Cert)
	dial := func(addr, name string, roots *x509.CertPool) (*x509.Certificate, error) {
		conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 90 * time.Second}, "tcp", addr,
			&tls.Config{ServerName: name, RootCAs: roots, InsecureSkipVerify: roots == nil})
		if err != nil {
			return nil, err
		}
		defer conn.Close()
		return conn.ConnectionState().PeerCertificates[0], nil
	}
	addr := strings.TrimPrefix(s.URL, "https://")
	cert, err := dial(addr, "fleet.drover.test", roots)
	if err != nil {
		t.Fatalf("handshake for localhost (certificate verified against Pebble's root): %v", err)
	}
	if len(cert.DNSNames) != 1 || cert.DNSNames[0] != "fleet.drover.test" {
		t.Errorf("ACME certificate names %v, want [fleet.drover.test]", cert.DNSNames)
	}
	if cert.NotAfter.Before(time.Now().Add(24 * time.Hour)) {
		t.Errorf("ACME certificate expires %v", cert.NotAfter)
	}
	// A handshake by address (no server name) gets the static certificate.
	static, err := dial(addr, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	if static.Equal(cert) || static.Issuer.String() == cert.Issuer.String() {
		t.Errorf("a handshake without server name got the ACME certificate (issuer %s)", static.Issuer)
	}
	if _, err := os.Stat(filepath.Join(cacheDir, "fleet.drover.test")); err != nil {
		t.Errorf("certificate not in the cache directory: %v", err)
	}
	// The device API is served over the ACME certificate too.
	hc := &http.Client{Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: roots},
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, addr)
		},
	}}
	resp, err := hc.Get("https://fleet.drover.test:" + port + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("/healthz over the ACME certificate: %d", resp.StatusCode)
	}

	s.Stop()
	before := requests.Load()
	s2 := servertest.Start(t, servertest.Options{DataDir: filepath.Join(dir, "data"), Configure: configure})
	again, err := dial(strings.TrimPrefix(s2.URL, "https://"), "fleet.drover.test", roots)
	if err != nil {
		t.Fatal(err)
	}
	if !again.Equal(cert) {
		t.Error("after a restart the server did not serve the cached certificate")
	}
	if n := requests.Load() - before; n != 0 {
		t.Errorf("after a restart the server asked the ACME directory %d time(s); the certificate is cached", n)
	}
}

func TestACMEConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		set  func(*server.Config)
		want string
	}{
		{func(c *server.Config) { c.ACMEDomains, c.TLSCert, c.TLSKey = "a.example", "c.pem", "k.pem" }, "exclude each other"},
		{func(c *server.Config) { c.ACMEDomains, c.Listen, c.HTTPListen = "a.example", "", ":0" }, "needs -listen"},
		{func(c *server.Config) { c.ACMEDomains, c.ACMEDirectoryURL = "a.example", "http://acme.local/dir" }, "https://"},
	} {
		cfg := server.DefaultConfig()
		tc.set(&cfg)
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc, err, tc.want)
		}
	}
}

// waitForDNS returns once the test DNS server answers over UDP and TCP:
// challtestsrv's Run starts its listeners in goroutines, and a validation
// that queries before they are up marks the authorization invalid.
func waitForDNS(t *testing.T, addr string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for _, network := range []string{"udp", "tcp"} {
		r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, addr)
		}}
		var ips []string
		var err error
		if !testwait.Until(time.Until(deadline), func() bool {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			ips, err = r.LookupHost(ctx, "fleet.drover.test")
			return err == nil && len(ips) > 0 && ips[0] == "127.0.0.1"
		}) {
			t.Fatalf("test DNS server on %s (%s) not answering: %v %v", addr, network, ips, err)
		}
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}
