package server

// The HTTPS listener's TLS, from the configuration: policy, certificates
// (files, generated, ACME) and their reload, client certificates. The
// mechanisms are in package transport.

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/drover/drover/internal/fsutil"
	"github.com/drover/drover/internal/protocol"
	"github.com/drover/drover/internal/server/transport"
	"golang.org/x/crypto/acme/autocert"
)

// Values of Config.TLSKeyExchange (any list protocol.KeyExchangeGroups takes).
const (
	KeyExchangeHybrid  = protocol.KeyExchangeHybrid
	KeyExchangeClassic = protocol.KeyExchangeClassic
)

// The listener and client certificate setup of listen (server.go).
var (
	listenDevices = transport.Listen
	clientAuth    = transport.ClientAuth
)

type tlsLn struct {
	net.Listener
	cfg *tls.Config
}

// tlsListener serves TLS per the policy of c (transport.Policy) with
// session resumption (tickets, keys rotated by crypto/tls unless
// -tls-ticket-keys gives them) and HTTP/1.1 only: device agents do one
// request per connection or keep-alive, and HTTP/2 only adds cost for them.
func tlsListener(ln net.Listener, getCert func(*tls.ClientHelloInfo) (*tls.Certificate, error), c *Config) (net.Listener, error) {
	cfg := &tls.Config{
		GetCertificate: getCert,
		NextProtos:     []string{"http/1.1"},
	}
	if len(c.acmeDomains()) > 0 {
		cfg.NextProtos = append(cfg.NextProtos, transport.ACMEProto) // tls-alpn-01 challenges
	}
	policy := transport.Policy{AllowLegacyCBC: c.TLSAllowLegacyCBC, KeyExchange: c.TLSKeyExchange, MaxVersion: c.TLSMaxVersion}
	if err := policy.Apply(cfg); err != nil {
		return nil, err
	}
	if c.TLSTicketKeys != "" {
		if err := transport.SetTicketKeys(cfg, c.TLSTicketKeys); err != nil {
			return nil, err
		}
	}
	return &tlsLn{Listener: tls.NewListener(ln, cfg), cfg: cfg}, nil
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
	certPEM, keyPEM, err := transport.SelfSigned()
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

// acmeDomains is Config.ACMEDomains as a list.
func (c *Config) acmeDomains() []string { return transport.ParseDomains(c.ACMEDomains) }

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

// newACME is the certificate manager of cfg's ACME domains, or nil
// (transport.NewACME).
func newACME(cfg *Config) (*autocert.Manager, error) {
	return transport.NewACME(transport.ACME{
		Domains:      cfg.acmeDomains(),
		CacheDir:     cfg.acmeCacheDir(),
		Email:        cfg.ACMEEmail,
		DirectoryURL: cfg.ACMEDirectoryURL,
		CACert:       cfg.ACMECACert,
	})
}

// useACME reports whether a handshake is the ACME manager's
// (transport.ForACME); others get the static certificate.
func (s *Server) useACME(hello *tls.ClientHelloInfo) bool {
	return s.acme != nil && transport.ForACME(s.cfg.acmeDomains(), hello)
}

// loadCert reads a certificate and key and serves them on new
// connections; on error the certificate in use stays.
func (s *Server) loadCert(certPath, keyPath string) error {
	cert, err := transport.LoadKeyPair(certPath, keyPath)
	if err != nil {
		return err
	}
	s.cert.Store(cert)
	s.log.Info("reload: TLS certificate", "path", certPath, "subject", cert.Leaf.Subject.String(), "not_after", cert.Leaf.NotAfter.UTC())
	return nil
}

func (s *Server) getCertificate(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
	if s.useACME(hello) {
		return s.acme.GetCertificate(hello)
	}
	return s.cert.Load(), nil
}

// watchCertFiles reloads -tls-cert and -tls-key when either file changes
// (transport.WatchFiles), so that a renewed certificate is served without
// SIGHUP. A pair that does not load (one file replaced, the other not yet)
// is tried again at the next change or check.
func (s *Server) watchCertFiles(ctx context.Context, interval time.Duration) {
	if interval <= 0 || s.httpsLn == nil || s.cfg.TLSCert == "" {
		return
	}
	transport.WatchFiles(ctx, interval, []string{s.cfg.TLSCert, s.cfg.TLSKey}, func() error {
		err := s.loadCert(s.cfg.TLSCert, s.cfg.TLSKey)
		if err != nil {
			s.log.Warn("tls: changed certificate files do not load; the old certificate stays in use", "err", err)
		}
		return err
	})
}
