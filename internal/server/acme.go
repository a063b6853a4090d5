package server

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	"golang.org/x/crypto/acme"
	"golang.org/x/crypto/acme/autocert"
)

// acmeDomains is Config.ACMEDomains as a list.
func (c *Config) acmeDomains() []string {
	var out []string
	for _, d := range strings.Split(c.ACMEDomains, ",") {
		if d = strings.ToLower(strings.TrimSpace(d)); d != "" {
			out = append(out, d)
		}
	}
	return out
}

func (c *Config) checkACME() error {
	if len(c.acmeDomains()) == 0 {
		return nil
	}
	switch {
	case c.TLSCert != "":
		return errors.New("-acme-domains and -tls-cert exclude each other: certificates come from ACME or from files")
	case c.Listen == "":
		return errors.New("-acme-domains needs -listen: the certificates are served there (and the tls-alpn-01 challenge answered)")
	case !strings.HasPrefix(c.ACMEDirectoryURL, "https://"):
		return fmt.Errorf("-acme-directory-url %q: want an https:// URL", c.ACMEDirectoryURL)
	}
	return nil
}

// newACME is the certificate manager of cfg's ACME domains, or nil. It
// answers the tls-alpn-01 challenge on the HTTPS listener and http-01 on
// the plain-HTTP one (HTTPHandler), obtains a certificate at the first
// handshake naming a domain and renews it 30 days before it expires.
func newACME(cfg *Config) (*autocert.Manager, error) {
	domains := cfg.acmeDomains()
	if len(domains) == 0 {
		return nil, nil
	}
	dir := cfg.acmeCacheDir()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("-acme-cache-dir: %w", err)
	}
	hc := &http.Client{Timeout: time.Minute}
	if cfg.ACMECACert != "" {
		pem, err := os.ReadFile(cfg.ACMECACert)
		if err != nil {
			return nil, fmt.Errorf("-acme-ca-cert: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("-acme-ca-cert %s: no PEM certificate", cfg.ACMECACert)
		}
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.TLSClientConfig = &tls.Config{RootCAs: pool}
		hc.Transport = tr
	}
	return &autocert.Manager{
		Prompt:     autocert.AcceptTOS,
		Cache:      autocert.DirCache(dir),
		HostPolicy: autocert.HostWhitelist(domains...),
		Email:      cfg.ACMEEmail,
		Client:     &acme.Client{DirectoryURL: cfg.ACMEDirectoryURL, HTTPClient: hc, UserAgent: "drover"},
	}, nil
}

// useACME reports whether a handshake is the ACME manager's: it names one
// of the ACME domains (a certificate or a tls-alpn-01 challenge). Others
// (no server name, an IP address, another name) get the static
// certificate, so that devices configured with an address keep working.
func (s *Server) useACME(hello *tls.ClientHelloInfo) bool {
	return s.acme != nil && slices.Contains(s.cfg.acmeDomains(), strings.ToLower(strings.TrimSuffix(hello.ServerName, ".")))
}
