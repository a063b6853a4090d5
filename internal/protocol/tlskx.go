package protocol

import (
	"crypto/tls"
	"fmt"
	"slices"
	"strings"
)

// TLS key exchange settings (--tls-key-exchange of serve, agent and emulate;
// docs/operations.md, TLS): a comma-separated list of the names below. The
// server accepts the union of the listed groups, a client offers it. Order
// is crypto/tls's own: a server picks a post-quantum hybrid whenever both
// sides have one, else a group the client sent a key share for; a client
// sends a key share for the first group in Go's order (X25519MLKEM768,
// X25519, P-256, P-384) and, with a hybrid, one for X25519 too.
const (
	KeyExchangeClassic = "classic" // X25519, P-256, P-384
	KeyExchangeHybrid  = "hybrid"  // the post-quantum hybrids and classic
	KeyExchangeX25519  = "x25519"
	KeyExchangeP256    = "p256"
)

var keyExchanges = map[string][]tls.CurveID{
	KeyExchangeClassic:  {tls.X25519, tls.CurveP256, tls.CurveP384},
	KeyExchangeHybrid:   {tls.X25519MLKEM768, tls.SecP256r1MLKEM768, tls.X25519, tls.CurveP256, tls.CurveP384},
	KeyExchangeX25519:   {tls.X25519},
	KeyExchangeP256:     {tls.CurveP256},
	"p384":              {tls.CurveP384},
	"x25519mlkem768":    {tls.X25519MLKEM768},
	"secp256r1mlkem768": {tls.SecP256r1MLKEM768},
}

// KeyExchangeGroups returns the groups of a --tls-key-exchange value.
func KeyExchangeGroups(setting string) ([]tls.CurveID, error) {
	var groups []tls.CurveID
	for name := range strings.SplitSeq(setting, ",") {
		g, ok := keyExchanges[strings.ToLower(strings.TrimSpace(name))]
		if !ok {
			return nil, fmt.Errorf("--tls-key-exchange %q: want a comma-separated list of classic, hybrid, x25519, p256, p384, x25519mlkem768, secp256r1mlkem768", setting)
		}
		for _, c := range g {
			if !slices.Contains(groups, c) {
				groups = append(groups, c)
			}
		}
	}
	return groups, nil
}

// TLSMaxVersion returns crypto/tls's constant for a --tls-max-version value
// (serve, agent and emulate): "1.3" (or empty) or "1.2". At TLS 1.2 a
// resumed session skips the key exchange, and with it forward secrecy
// (docs/operations.md, TLS).
func TLSMaxVersion(setting string) (uint16, error) {
	switch strings.TrimSpace(setting) {
	case "", "1.3":
		return tls.VersionTLS13, nil
	case "1.2":
		return tls.VersionTLS12, nil
	}
	return 0, fmt.Errorf("--tls-max-version %q: want 1.2 or 1.3", setting)
}
