package transport

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
)

// ClientAuth makes the HTTPS listener of cfg ask for client certificates
// signed by the CA of caFile ("": none asked). Certificates are verified
// when given; whether one is required is the fleet's rule
// (-require-client-cert), so that the operator API and dashboard keep
// working without one.
func ClientAuth(cfg *tls.Config, caFile string) error {
	if caFile == "" {
		return nil
	}
	pemBytes, err := os.ReadFile(caFile)
	if err != nil {
		return fmt.Errorf("client CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pemBytes) {
		return fmt.Errorf("client CA %s: no PEM certificate in it", caFile)
	}
	cfg.ClientCAs, cfg.ClientAuth = pool, tls.VerifyClientCertIfGiven
	return nil
}
