package server

import (
	"path/filepath"
	"reflect"
	"strings"

	"github.com/drover/drover/internal/server/transport"
)

// Reload applies what can change while the server runs: the secret files
// (enrollment secret, admin token, metrics token, SMTP password) are read
// again and a secret rotated in its file, or changed in the configuration,
// replaces the one in force; the TLS certificate and key are read again
// from disk (the files cfg names, or the generated pair in the data
// directory). On error nothing changes: the secrets and the certificate in
// use stay. Other fields of cfg that differ from the running configuration
// are logged as needing a restart. The log level belongs to the logger's
// owner.
func (s *Server) Reload(cfg Config) error {
	s.reloadMu.Lock()
	defer s.reloadMu.Unlock()
	if err := cfg.readSecretFiles(); err != nil {
		return err
	}
	if err := cfg.validateSecrets(); err != nil {
		return err
	}
	smtpPassword, err := readSMTPPassword(cfg.SMTPPasswordFile)
	if err != nil {
		return err
	}
	s.reloadSecrets(cfg, smtpPassword)
	if changed := restartNeeded(s.live, cfg); len(changed) > 0 {
		s.log.Warn("reload: changes that take effect only after a restart", "fields", strings.Join(changed, ","))
	}
	if s.httpsLn == nil {
		return nil
	}
	if cfg.TLSTicketKeys != "" {
		if err := transport.SetTicketKeys(s.httpsLn.(*tlsLn).cfg, cfg.TLSTicketKeys); err != nil {
			return err
		}
		s.log.Info("reload: TLS session ticket keys", "path", cfg.TLSTicketKeys)
	}
	certPath, keyPath := cfg.TLSCert, cfg.TLSKey
	if certPath == "" {
		dir := filepath.Join(s.cfg.DataDir, "tls")
		certPath, keyPath = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	}
	return s.loadCert(certPath, keyPath)
}

// reloadSecrets puts in force the secrets of next that differ from the
// live ones and notes them in s.live. A secret given at the start and
// given no more (the generated one would take its place) needs a restart,
// as does a password file for SMTP added or removed: those stay and
// restartNeeded names them.
func (s *Server) reloadSecrets(next Config, smtpPassword string) {
	live := &s.live
	live.EnrollmentSecretFile, live.AdminTokenFile, live.MetricsTokenFile = next.EnrollmentSecretFile, next.AdminTokenFile, next.MetricsTokenFile
	// The OIDC client secret needs a restart when it changes (its file
	// rotated too): restartNeeded names OIDCClientSecret.
	live.OIDCClientSecretFile = next.OIDCClientSecretFile
	if next.EnrollmentSecret != "" && next.EnrollmentSecret != live.EnrollmentSecret {
		s.fleet.SetEnrollmentSecret(next.EnrollmentSecret)
		live.EnrollmentSecret = next.EnrollmentSecret
		s.log.Info("reload: enrollment secret replaced", "from", secretSource(next.EnrollmentSecretFile))
	}
	if next.AdminToken != "" && next.AdminToken != live.AdminToken {
		s.acc.SetAdminToken(next.AdminToken)
		live.AdminToken = next.AdminToken
		s.log.Info("reload: admin token replaced", "from", secretSource(next.AdminTokenFile))
	}
	if next.MetricsToken != live.MetricsToken {
		s.api.setMetricsToken(next.MetricsToken)
		live.MetricsToken = next.MetricsToken
		s.log.Info("reload: metrics token replaced", "from", secretSource(next.MetricsTokenFile), "set", next.MetricsToken != "")
	}
	if live.SMTPPasswordFile != "" && next.SMTPPasswordFile != "" {
		live.SMTPPasswordFile = next.SMTPPasswordFile
		if smtpPassword != s.smtpPassword && s.alerts != nil {
			s.alerts.SetSMTPPassword(smtpPassword)
			s.smtpPassword = smtpPassword
			s.log.Info("reload: SMTP password replaced", "from", next.SMTPPasswordFile)
		}
	}
}

// secretSource names where a secret came from, for the log (never the
// secret itself).
func secretSource(file string) string {
	if file != "" {
		return file
	}
	return "configuration"
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
