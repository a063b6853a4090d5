package server_test

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"log/slog"
	"math/big"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/drover/drover/internal/server"
	"github.com/drover/drover/internal/server/servertest"
)

func regBody(s *servertest.Server, machine string, extra map[string]string) map[string]string {
	b := map[string]string{"machine_id": machine, "device_type": "ICR-3241", "firmware": "6.3.5", "enrollment_secret": s.EnrollmentSecret}
	for k, v := range extra {
		if v == "" {
			delete(b, k)
		} else {
			b[k] = v
		}
	}
	return b
}

func pushOK(t *testing.T, c *client, token string, seq int) {
	t.Helper()
	st, _, out := c.do("POST", "/api/v1/push", token, []byte(`{"seq":`+itoa(seq)+`,"config_version":0,"state":{}}`))
	if st != 200 {
		t.Fatalf("push %d: %d %v", seq, st, out)
	}
}

func itoa(i int) string { return strconv.Itoa(i) }

func decodeJSON(t *testing.T, resp *http.Response, v any) {
	t.Helper()
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatalf("answer is not JSON: %v", err)
	}
}

func errCode(out map[string]any) string {
	e, _ := out["error"].(map[string]any)
	c, _ := e["code"].(string)
	return c
}

// syncBuf is a log sink for tests.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) { s.mu.Lock(); defer s.mu.Unlock(); return s.b.Write(p) }
func (s *syncBuf) String() string              { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// An attacker with the fleet secret and a known machine ID gets no token;
// the real device keeps working, over real HTTPS and across a restart.
func TestTakeoverRefusedEndToEnd(t *testing.T) {
	dir := t.TempDir()
	logs := &syncBuf{}
	opts := servertest.Options{DataDir: dir, Logger: slog.New(slog.NewTextHandler(logs, nil))}
	s := servertest.Start(t, opts)
	c := &client{t: t, s: s, url: s.URL}
	st, _, real := c.do("POST", "/api/v1/register", "", regBody(s, "m-1", nil))
	if st != 200 || real["token"] == nil || real["device_key"] == nil {
		t.Fatalf("register: %d %v", st, real)
	}
	token, key := real["token"].(string), real["device_key"].(string)
	pushOK(t, c, token, 1)

	st, h, evil := c.do("POST", "/api/v1/register", "", regBody(s, "m-1", nil))
	if st != 202 || h.Get("Retry-After") != "60" || evil["pending"] != true || evil["token"] != "" && evil["token"] != nil {
		t.Fatalf("attacker: %d %v %v", st, h, evil)
	}
	pushOK(t, c, token, 2)
	st, _, out := c.do("POST", "/api/v1/register", "", regBody(s, "m-1", map[string]string{"device_key": evil["device_key"].(string)}))
	if st != 202 {
		t.Fatalf("attacker polls: %d %v", st, out)
	}
	st, h, out = c.do("POST", "/api/v1/register", "", regBody(s, "m-1", nil))
	if st != 409 || errCode(out) != "enrollment_conflict" || h.Get("Retry-After") == "" {
		t.Fatalf("second claimant: %d %v", st, out)
	}
	st, _, list := c.do("GET", "/api/v1/devices?admission=reenroll", s.AdminToken, nil)
	if devs := list["devices"].([]any); st != 200 || len(devs) != 1 {
		t.Fatalf("reenroll filter: %d %v", st, list)
	}
	if got := s.Metric("drover_registrations_total", map[string]string{"outcome": "pending"}); got != 2 {
		t.Fatalf("pending registrations counted %v, want 2", got)
	}
	if got := s.Metric("drover_enrollment_requests", nil); got != 1 {
		t.Fatalf("drover_enrollment_requests %v, want 1", got)
	}
	if got := s.Metric("drover_devices_admission", map[string]string{"admission": "active"}); got != 1 {
		t.Fatalf("drover_devices_admission{active} %v, want 1", got)
	}

	// Restart: the request and the real device's credentials are kept.
	s.Stop()
	s = servertest.Start(t, opts)
	c = &client{t: t, s: s, url: s.URL}
	pushOK(t, c, token, 3)
	st, _, dev := c.do("GET", "/api/v1/devices/1", s.AdminToken, nil)
	if st != 200 || dev["enrollment_request"] == nil || dev["admission"] != "active" {
		t.Fatalf("device after restart: %d %v", st, dev)
	}
	if st, _, out := c.do("POST", "/api/v1/devices/1/reject", s.AdminToken, nil); st != 200 || out["enrollment_request"] != nil {
		t.Fatalf("reject: %d %v", st, out)
	}
	// The real device re-registers with its current token as bearer.
	st, _, r2 := c.do("POST", "/api/v1/register", token, regBody(s, "m-1", nil))
	if st != 200 || r2["token"] == token || r2["device_id"] != "1" {
		t.Fatalf("re-register with bearer: %d %v", st, r2)
	}
	pushOK(t, c, r2["token"].(string), 4)
	// ... and with its device key, without the fleet secret.
	st, _, r3 := c.do("POST", "/api/v1/register", "", regBody(s, "m-1", map[string]string{"enrollment_secret": "", "device_key": key}))
	if st != 200 || r3["token"] == nil {
		t.Fatalf("re-register with key: %d %v", st, r3)
	}
	if st, _, _ := c.do("POST", "/api/v1/push", r2["token"].(string), `{"seq":5,"config_version":0,"state":{}}`); st != 401 {
		t.Fatalf("replaced token: %d", st)
	}
	if !strings.Contains(logs.String(), "msg=\"device admission\" action=reject device_id=1 machine_id=m-1 by=admin-token@127.0.0.1:") {
		t.Fatalf("rejection not logged:\n%s", logs)
	}
}

func TestRegistrationRateLimits(t *testing.T) {
	s := servertest.Start(t, servertest.Options{Configure: func(c *server.Config) {
		c.RegisterRatePerAddress, c.RegisterBurstPerAddress, c.RegisterRateExempt = 0.001, 2, ""
	}})
	c := &client{t: t, s: s, url: s.URL}
	for i := range 2 {
		if st, _, out := c.do("POST", "/api/v1/register", "", regBody(s, "m-"+itoa(i), nil)); st != 200 {
			t.Fatalf("registration %d: %d %v", i, st, out)
		}
	}
	st, h, out := c.do("POST", "/api/v1/register", "", regBody(s, "m-3", nil))
	if st != 429 || errCode(out) != "rate_limited" || h.Get("Retry-After") == "" || h.Get("Retry-After") == "0" {
		t.Fatalf("third registration from one address: %d %v %v", st, h, out)
	}
	if got := s.Metric("drover_registrations_total", map[string]string{"outcome": "rate_limited"}); got != 1 {
		t.Fatalf("rate_limited counted %v", got)
	}
	// Loopback is exempt by default; the total limit still applies.
	s2 := servertest.Start(t, servertest.Options{Configure: func(c *server.Config) {
		c.RegisterRatePerAddress, c.RegisterBurstPerAddress = 0.001, 1
		c.RegisterRate, c.RegisterBurst = 0.001, 3
	}})
	c2 := &client{t: t, s: s2, url: s2.URL}
	for i := range 3 {
		if st, _, out := c2.do("POST", "/api/v1/register", "", regBody(s2, "m-"+itoa(i), nil)); st != 200 {
			t.Fatalf("exempt registration %d: %d %v", i, st, out)
		}
	}
	if st, _, out := c2.do("POST", "/api/v1/register", "", regBody(s2, "m-9", nil)); st != 429 || errCode(out) != "rate_limited" {
		t.Fatalf("over the total limit: %d %v", st, out)
	}
}

// certFiles writes a CA and a client certificate for cn; it returns the CA
// file and the client's TLS certificate.
func certFiles(t *testing.T, dir, cn string) (string, tls.Certificate) {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "drover test CA"}, IsCA: true,
		BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: cn}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		KeyUsage: x509.KeyUsageDigitalSignature, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	return caFile, tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

func TestClientCertificates(t *testing.T) {
	dir := t.TempDir()
	caFile, cert := certFiles(t, dir, "m-cert")
	s := servertest.Start(t, servertest.Options{Configure: func(c *server.Config) {
		c.ClientCA, c.RequireClientCert, c.Admission = caFile, true, "approve"
	}})
	plain := &client{t: t, s: s, url: s.URL}
	if st, _, out := plain.do("POST", "/api/v1/register", "", regBody(s, "m-cert", nil)); st != 403 || errCode(out) != "certificate_required" {
		t.Fatalf("without a certificate: %d %v", st, out)
	}
	// The operator API needs no client certificate.
	if st, _, _ := plain.do("GET", "/api/v1/devices", s.AdminToken, nil); st != 200 {
		t.Fatalf("operator API without a client certificate: %d", st)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(s.CACertPEM)
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}}}}
	do := func(body string) (int, map[string]any) {
		resp, err := hc.Post(s.URL+"/api/v1/register", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out map[string]any
		decodeJSON(t, resp, &out)
		return resp.StatusCode, out
	}
	st, out := do(`{"machine_id":"m-cert","device_type":"t","firmware":"f"}`)
	if st != 200 || out["token"] == nil {
		t.Fatalf("with a certificate and no secret (approve policy): %d %v", st, out)
	}
	if st, out := do(`{"machine_id":"m-other","device_type":"t","firmware":"f","enrollment_secret":"` + s.EnrollmentSecret + `"}`); st != 403 ||
		errCode(out) != "certificate_required" {
		t.Fatalf("certificate of another machine: %d %v", st, out)
	}
	if st, out := do(`{"machine_id":"m-cert","device_type":"t","firmware":"f"}`); st != 200 || out["device_id"] != "1" {
		t.Fatalf("re-registration with the certificate: %d %v", st, out)
	}
}
