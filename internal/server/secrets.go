package server

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/drover/drover/internal/fsutil"
)

// Secrets are the credentials in force. Those the configuration does not
// give (flag, environment, config file or secret file) are generated once
// and kept in data-dir/secrets.json (mode 0600); given ones are never
// written there.
type Secrets struct {
	EnrollmentSecret string `json:"enrollment_secret,omitempty"`
	AdminToken       string `json:"admin_token,omitempty"`
	// SettingsKey (32 bytes, base64) seals secrets the store keeps, such as
	// the SMTP password (docs/operations.md, Secrets at rest). Added to an
	// older file at the next start.
	SettingsKey string `json:"settings_key,omitempty"`
}

// Generated is what a start generated and wrote to secrets.json: the
// only credentials Drover prints (once, at that start).
type Generated struct {
	FirstStart       bool   // secrets.json was created
	EnrollmentSecret string // "": given, or generated at an earlier start
	AdminToken       string
}

// Notice is what `drover serve` prints about the credentials this start
// generated, or "" when it generated none. Secrets the configuration gives
// are never in it.
func (g Generated) Notice(dataDir string) string {
	if g.EnrollmentSecret == "" && g.AdminToken == "" {
		return ""
	}
	var b strings.Builder
	if g.FirstStart {
		b.WriteString("Drover first start: ")
	} else {
		b.WriteString("Drover: ")
	}
	fmt.Fprintf(&b, "generated credentials, kept in %s\n", filepath.Join(dataDir, "secrets.json"))
	if g.EnrollmentSecret != "" {
		fmt.Fprintf(&b, "  enrollment secret: %s\n", g.EnrollmentSecret)
	}
	if g.AdminToken != "" {
		fmt.Fprintf(&b, "  admin token:       %s\n", g.AdminToken)
	}
	return b.String()
}

// settingsKey decodes SettingsKey.
func (s Secrets) settingsKey() []byte {
	k, err := base64.RawURLEncoding.DecodeString(s.SettingsKey)
	if err != nil || len(k) != 32 {
		return nil
	}
	return k
}

func randomString(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

// loadSecrets returns the secrets in force: those given (non-empty fields
// of given) and the others from data-dir/secrets.json. It generates and
// writes there what the file lacks: the settings key always, the
// enrollment secret and the admin token only when not given. Given
// secrets are never written.
func loadSecrets(dir string, given Secrets) (Secrets, Generated, error) {
	path := filepath.Join(dir, "secrets.json")
	var s Secrets
	var gen Generated
	b, err := os.ReadFile(path)
	switch {
	case err == nil:
		if err := json.Unmarshal(b, &s); err != nil || (s.SettingsKey != "" && s.settingsKey() == nil) {
			return s, gen, fmt.Errorf("%s is damaged: remove it to generate new secrets", path)
		}
	case errors.Is(err, os.ErrNotExist):
		gen.FirstStart = true
	default:
		return s, gen, err
	}
	write := gen.FirstStart
	if s.EnrollmentSecret == "" && given.EnrollmentSecret == "" {
		s.EnrollmentSecret = randomString(18)
		gen.EnrollmentSecret, write = s.EnrollmentSecret, true
	}
	if s.AdminToken == "" && given.AdminToken == "" {
		s.AdminToken = randomString(24)
		gen.AdminToken, write = s.AdminToken, true
	}
	if s.SettingsKey == "" {
		s.SettingsKey, write = randomString(32), true
	}
	if write {
		b, _ = json.MarshalIndent(s, "", "  ")
		if err := fsutil.WriteFileAtomic(path, append(b, '\n'), 0o600); err != nil {
			return s, Generated{}, err
		}
	}
	if given.EnrollmentSecret != "" {
		s.EnrollmentSecret = given.EnrollmentSecret
	}
	if given.AdminToken != "" {
		s.AdminToken = given.AdminToken
	}
	return s, gen, nil
}

// loadCertificate returns the operator's certificate, or the self-signed one
// in data-dir/tls, generating it on first start.
func loadCertificate(cfg *Config) (tls.Certificate, bool, error) {
	if cfg.TLSCert != "" {
		c, err := tls.LoadX509KeyPair(cfg.TLSCert, cfg.TLSKey)
		return c, false, err
	}
	dir := filepath.Join(cfg.DataDir, "tls")
	certPath, keyPath := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if c, err := tls.LoadX509KeyPair(certPath, keyPath); err == nil {
		return c, false, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return tls.Certificate{}, false, fmt.Errorf("%s: %w", dir, err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return tls.Certificate{}, false, err
	}
	certPEM, keyPEM, err := selfSigned()
	if err != nil {
		return tls.Certificate{}, false, err
	}
	if err := fsutil.WriteFileAtomic(keyPath, keyPEM, 0o600); err != nil {
		return tls.Certificate{}, false, err
	}
	if err := fsutil.WriteFileAtomic(certPath, certPEM, 0o644); err != nil {
		return tls.Certificate{}, false, err
	}
	c, err := tls.X509KeyPair(certPEM, keyPEM)
	return c, true, err
}

// selfSigned makes a 10-year ECDSA P-256 certificate for this host's names.
func selfSigned() (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		return nil, nil, err
	}
	names := []string{"localhost"}
	if h, err := os.Hostname(); err == nil && h != "" && h != "localhost" {
		names = append(names, h)
	}
	ips := []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && !n.IP.IsLoopback() && !n.IP.IsLinkLocalUnicast() {
				ips = append(ips, n.IP)
			}
		}
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: names[len(names)-1], Organization: []string{"Drover self-signed"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.AddDate(10, 0, 0),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
		DNSNames:              names,
		IPAddresses:           ips,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), nil
}
