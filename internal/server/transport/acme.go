package transport

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	"golang.org/x/crypto/acme"
	"golang.org/x/crypto/acme/autocert"
)

// ACMEProto is the ALPN protocol of the tls-alpn-01 challenge: a listener
// serving ACME certificates offers it next to http/1.1.
const ACMEProto = acme.ALPNProto

// ACME says where certificates of Domains come from.
type ACME struct {
	Domains      []string // lower case, as ParseDomains returns them
	CacheDir     string   // account key and certificates, created 0700
	Email        string   // contact address given to the CA; may be empty
	DirectoryURL string   // the CA's directory (https://)
	CACert       string   // PEM file of CAs trusted for DirectoryURL; "": the system's
}

// ParseDomains reads a comma-separated list of domains (-acme-domains),
// lower-cased, blanks dropped.
func ParseDomains(v string) []string {
	var out []string
	for _, d := range strings.Split(v, ",") {
		if d = strings.ToLower(strings.TrimSpace(d)); d != "" {
			out = append(out, d)
		}
	}
	return out
}

// NewACME is the certificate manager of a's domains, or nil when there is
// none. It answers the tls-alpn-01 challenge on the HTTPS listener and
// http-01 on the plain-HTTP one (HTTPHandler), obtains a certificate at
// the first handshake naming a domain and renews it 30 days before it
// expires.
func NewACME(a ACME) (*autocert.Manager, error) {
	if len(a.Domains) == 0 {
		return nil, nil
	}
	if err := os.MkdirAll(a.CacheDir, 0o700); err != nil {
		return nil, fmt.Errorf("-acme-cache-dir: %w", err)
	}
	hc := &http.Client{Timeout: time.Minute}
	if a.CACert != "" {
		pem, err := os.ReadFile(a.CACert)
		if err != nil {
			return nil, fmt.Errorf("-acme-ca-cert: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("-acme-ca-cert %s: no PEM certificate", a.CACert)
		}
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.TLSClientConfig = &tls.Config{RootCAs: pool}
		hc.Transport = tr
	}
	return &autocert.Manager{
		Prompt:     autocert.AcceptTOS,
		Cache:      autocert.DirCache(a.CacheDir),
		HostPolicy: autocert.HostWhitelist(a.Domains...),
		Email:      a.Email,
		Client:     &acme.Client{DirectoryURL: a.DirectoryURL, HTTPClient: hc, UserAgent: "drover"},
	}, nil
}

// ForACME reports whether a handshake belongs to the ACME manager of
// domains: it names one of them (a certificate or a tls-alpn-01
// challenge). Others (no server name, an IP address, another name) are
// for the static certificate, so that devices configured with an address
// keep working.
func ForACME(domains []string, hello *tls.ClientHelloInfo) bool {
	return slices.Contains(domains, strings.ToLower(strings.TrimSuffix(hello.ServerName, ".")))
}
