package main

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// dataSecrets are the secrets a first start generated into a data
// directory's secrets.json (empty where they were given instead).
type dataSecrets struct {
	Enroll string `json:"enrollment_secret"`
	Admin  string `json:"admin_token"`
}

// readSecrets reads dataDir/secrets.json; it fails the test unless the
// admin token is there.
func readSecrets(t *testing.T, dataDir string) dataSecrets {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(dataDir, "secrets.json"))
	if err != nil {
		t.Fatal(err)
	}
	var s dataSecrets
	if err := json.Unmarshal(raw, &s); err != nil || s.Admin == "" {
		t.Fatalf("secrets.json: %v %q", err, raw)
	}
	return s
}

// caFile is the self-signed certificate a server made in dataDir.
func caFile(dataDir string) string { return filepath.Join(dataDir, "tls", "cert.pem") }

// trustingClient is an HTTPS client that trusts the certificate of the
// server whose data directory is dataDir; its idle connections close with
// the test.
func trustingClient(t *testing.T, dataDir string, timeout time.Duration) *http.Client {
	t.Helper()
	certPEM, err := os.ReadFile(caFile(dataDir))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(certPEM) {
		t.Fatalf("no certificate in %s", caFile(dataDir))
	}
	c := &http.Client{Timeout: timeout, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	t.Cleanup(c.CloseIdleConnections)
	return c
}
