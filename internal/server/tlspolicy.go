package server

import (
	"crypto/tls"
	"fmt"
)

// TLS policy of the HTTPS listener (docs/operations.md, "Security"):
//   - TLS 1.3 preferred; TLS 1.2 only with forward-secret AEAD suites
//     (ECDHE with AES-GCM or ChaCha20-Poly1305). TLS 1.0 and 1.1 never.
//   - tls-allow-legacy-cbc adds the ECDHE AES-CBC-SHA1 suites to TLS 1.2
//     for old routers whose TLS stack knows no AEAD suite (off by default).
//   - tls-key-exchange chooses the key exchanges: "classic" (the default)
//     X25519, P-256 and P-384; "hybrid" also the post-quantum hybrids
//     (X25519MLKEM768, SecP256r1MLKEM768), which crypto/tls then picks
//     whenever the client offers one. BenchmarkTLSHandshake measures the cost.

// Values of Config.TLSKeyExchange.
const (
	KeyExchangeHybrid  = "hybrid"
	KeyExchangeClassic = "classic"
)

// tls12AEADSuites are the TLS 1.2 suites offered by default: ECDHE key
// exchange (forward secrecy) with an AEAD cipher, for ECDSA certificates (the
// generated one) and RSA ones. TLS 1.3 suites are all AEAD and not
// configurable in crypto/tls.
var tls12AEADSuites = []uint16{
	tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
	tls.TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
	tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
	tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
	tls.TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
	tls.TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
}

// tls12LegacyCBCSuites are added by tls-allow-legacy-cbc: still forward
// secret (ECDHE), but CBC with HMAC-SHA1, MAC-then-encrypt.
var tls12LegacyCBCSuites = []uint16{
	tls.TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA,
	tls.TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA,
	tls.TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA,
	tls.TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA,
}

var classicGroups = []tls.CurveID{tls.X25519, tls.CurveP256, tls.CurveP384}

// keyExchangeGroups lists the groups of a tls-key-exchange value. crypto/tls
// picks among them in its own order: a post-quantum hybrid whenever the
// client offers one, else the client's key share.
func keyExchangeGroups(kx string) ([]tls.CurveID, error) {
	switch kx {
	case KeyExchangeHybrid:
		return append([]tls.CurveID{tls.X25519MLKEM768, tls.SecP256r1MLKEM768}, classicGroups...), nil
	case KeyExchangeClassic:
		return classicGroups, nil
	}
	return nil, fmt.Errorf("-tls-key-exchange must be %s or %s, not %q", KeyExchangeHybrid, KeyExchangeClassic, kx)
}

// tlsPolicy sets versions, TLS 1.2 suites and key exchanges on c.
func tlsPolicy(c *tls.Config, allowLegacyCBC bool, keyExchange string) error {
	groups, err := keyExchangeGroups(keyExchange)
	if err != nil {
		return err
	}
	c.MinVersion = tls.VersionTLS12
	c.MaxVersion = tls.VersionTLS13
	c.CipherSuites = append([]uint16(nil), tls12AEADSuites...)
	if allowLegacyCBC {
		c.CipherSuites = append(c.CipherSuites, tls12LegacyCBCSuites...)
	}
	c.CurvePreferences = groups
	return nil
}
