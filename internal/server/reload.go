package server

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"path/filepath"
	"reflect"
	"strings"
)

// Reload applies what can change while the server runs: the TLS
// certificate and key are read again from disk (the files cfg names, or
// the generated pair in the data directory). On error the certificate in
// use stays. Other fields of cfg that differ from the running
// configuration are logged as needing a restart. The log level belongs to
// the logger's owner.
func (s *Server) Reload(cfg Config) error {
	if changed := restartNeeded(s.cfg, cfg); len(changed) > 0 {
		s.log.Warn("reload: changes that take effect only after a restart", "fields", strings.Join(changed, ","))
	}
	if s.httpsLn == nil {
		return nil
	}
	if cfg.TLSTicketKeys != "" {
		if err := setTicketKeys(s.httpsLn.(*tlsLn).cfg, cfg.TLSTicketKeys); err != nil {
			return err
		}
		s.log.Info("reload: TLS session ticket keys", "path", cfg.TLSTicketKeys)
	}
	certPath, keyPath := cfg.TLSCert, cfg.TLSKey
	if certPath == "" {
		dir := filepath.Join(s.cfg.DataDir, "tls")
		certPath, keyPath = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	}
	cert, err := tls.LoadX509KeyPair(certPath, keyPath)
	if err != nil {
		return fmt.Errorf("tls: %w", err)
	}
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	if err != nil {
		return fmt.Errorf("tls: %s: %w", certPath, err)
	}
	cert.Leaf = leaf
	s.cert.Store(&cert)
	s.log.Info("reload: TLS certificate", "path", certPath, "subject", leaf.Subject.String(), "not_after", leaf.NotAfter.UTC())
	return nil
}

func (s *Server) getCertificate(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
	if s.useACME(hello) {
		return s.acme.GetCertificate(hello)
	}
	return s.cert.Load(), nil
}

// restartNeeded names the fields of next that differ from cur and that
// Reload cannot apply.
func restartNeeded(cur, next Config) []string {
	reloadable := map[string]bool{"TLSCert": true, "TLSKey": true, "TLSTicketKeys": true, "LogLevel": true}
	var out []string
	a, b := reflect.ValueOf(cur), reflect.ValueOf(next)
	for i := range a.NumField() {
		name := a.Type().Field(i).Name
		if !reloadable[name] && !reflect.DeepEqual(a.Field(i).Interface(), b.Field(i).Interface()) {
			out = append(out, name)
		}
	}
	return out
}
