package transport

import (
	"crypto/tls"

	"github.com/drover/drover/internal/protocol"
)

// Policy is the TLS policy of the HTTPS listener (docs/operations.md,
// "Security"):
//   - TLS 1.3 preferred; TLS 1.2 only with forward-secret AEAD suites
//     (ECDHE with AES-GCM or ChaCha20-Poly1305). TLS 1.0 and 1.1 never.
//   - tls-allow-legacy-cbc adds the ECDHE AES-CBC-SHA1 suites to TLS 1.2
//     for old routers whose TLS stack knows no AEAD suite (off by default).
//   - tls-key-exchange lists the key exchanges accepted
//     (protocol.KeyExchangeGroups): "classic" (the default) X25519, P-256
//     and P-384, the client's key share deciding which; "hybrid" also the
//     post-quantum hybrids, which crypto/tls then picks whenever the client
//     offers one; or single groups ("x25519", "p256", ...).
//     BenchmarkTLSHandshake measures the cost of each.
//   - tls-max-version 1.2 caps the listener at TLS 1.2: a resumed session
//     then skips the key exchange (less CPU per new connection, no forward
//     secrecy for resumed sessions).
type Policy struct {
	AllowLegacyCBC bool   // tls-allow-legacy-cbc
	KeyExchange    string // tls-key-exchange: any list protocol.KeyExchangeGroups takes
	MaxVersion     string // tls-max-version: "1.2", "1.3" or "" (protocol.TLSMaxVersion)
}

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

// Apply sets versions, TLS 1.2 suites and key exchanges of p on c.
func (p Policy) Apply(c *tls.Config) error {
	groups, err := protocol.KeyExchangeGroups(p.KeyExchange)
	if err != nil {
		return err
	}
	c.MinVersion = tls.VersionTLS12
	if c.MaxVersion, err = protocol.TLSMaxVersion(p.MaxVersion); err != nil {
		return err
	}
	c.CipherSuites = append([]uint16(nil), tls12AEADSuites...)
	if p.AllowLegacyCBC {
		c.CipherSuites = append(c.CipherSuites, tls12LegacyCBCSuites...)
	}
	c.CurvePreferences = groups
	return nil
}
