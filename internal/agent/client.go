package agent

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/drover/drover/internal/protocol"
)

// maxAnswer bounds the answers the agent reads.
const maxAnswer = 1 << 20

// client speaks the device protocol to one server.
type client struct {
	base      string // server URL without trailing slash
	http      *http.Client
	files     *http.Client // firmware downloads: no overall time limit
	userAgent string
}

// TLSOptions say how the agent checks the server's certificate.
type TLSOptions struct {
	CACert    string // PEM file of the CA (or the self-signed certificate) to trust; empty: system roots
	PinPubKey string // "sha256//BASE64[;sha256//BASE64...]" of the server's public key, as curl's --pinnedpubkey
	AllowHTTP bool   // allow http:// server URLs (token in clear; only behind a trusted network)
	// KeyExchange lists the key exchanges offered, as --tls-key-exchange
	// (protocol.KeyExchangeGroups): "classic" (X25519 key share, P-256 and
	// P-384 as fallbacks: no post-quantum key share to compute on every
	// handshake), "x25519", "p256" or "hybrid" (X25519MLKEM768 first). Empty
	// means classic.
	KeyExchange string
	// MaxVersion caps the TLS version offered, as --tls-max-version
	// (protocol.TLSMaxVersion): "1.3" or empty, or "1.2", whose resumed
	// sessions skip the key exchange (cheaper for router and server, no
	// forward secrecy for them).
	MaxVersion string
}

func newClient(server string, o TLSOptions, timeout time.Duration) (*client, error) {
	u, err := url.Parse(server)
	if err != nil || u.Host == "" {
		return nil, fmt.Errorf("--server %q is not a URL like https://drover.example.com:8443", server)
	}
	switch u.Scheme {
	case "https":
	case "http":
		if !o.AllowHTTP {
			return nil, errors.New("--server uses http://, which sends the token in clear; use https:// or pass --allow-http")
		}
	default:
		return nil, fmt.Errorf("--server must be an https:// URL, not %q", server)
	}
	tlsCfg, err := o.config()
	if err != nil {
		return nil, err
	}
	tr := &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		TLSClientConfig:       tlsCfg,
		TLSHandshakeTimeout:   20 * time.Second,
		ResponseHeaderTimeout: timeout,
		IdleConnTimeout:       45 * time.Second, // below the server's idle timeout and most cellular NAT timeouts
		MaxIdleConns:          1,
		MaxIdleConnsPerHost:   1,
	}
	return &client{
		base:      strings.TrimRight(server, "/"),
		http:      &http.Client{Transport: tr, Timeout: timeout},
		files:     &http.Client{Transport: tr},
		userAgent: "drover-agent/" + Version(),
	}, nil
}

func (o TLSOptions) config() (*tls.Config, error) {
	kx := o.KeyExchange
	if kx == "" {
		kx = protocol.KeyExchangeClassic
	}
	groups, err := protocol.KeyExchangeGroups(kx)
	if err != nil {
		return nil, err
	}
	// The session cache lets a new connection resume the last TLS session
	// (a ticket from the server): no certificate signature to make or check.
	maxVersion, err := protocol.TLSMaxVersion(o.MaxVersion)
	if err != nil {
		return nil, err
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, MaxVersion: maxVersion, CurvePreferences: groups, ClientSessionCache: tls.NewLRUClientSessionCache(4)}
	if o.CACert != "" {
		pemBytes, err := os.ReadFile(o.CACert)
		if err != nil {
			return nil, fmt.Errorf("--ca-cert: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pemBytes) {
			return nil, fmt.Errorf("--ca-cert %s holds no PEM certificate", o.CACert)
		}
		cfg.RootCAs = pool
	}
	if o.PinPubKey == "" {
		return cfg, nil
	}
	pins, err := parsePins(o.PinPubKey)
	if err != nil {
		return nil, err
	}
	// A pin alone trusts the key whatever signed it or names it (a
	// self-signed certificate reached by any address); with --ca-cert both
	// must hold.
	cfg.InsecureSkipVerify = o.CACert == ""
	cfg.VerifyConnection = func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return errors.New("server sent no certificate")
		}
		if o.CACert != "" && len(cs.VerifiedChains) == 0 {
			return errors.New("server certificate is not verified")
		}
		sum := sha256.Sum256(cs.PeerCertificates[0].RawSubjectPublicKeyInfo)
		for _, p := range pins {
			if p == sum {
				return nil
			}
		}
		return fmt.Errorf("server public key sha256//%s matches no --pin-pubkey", base64.StdEncoding.EncodeToString(sum[:]))
	}
	return cfg, nil
}

func parsePins(v string) ([][32]byte, error) {
	var pins [][32]byte
	for _, p := range strings.Split(v, ";") {
		p = strings.TrimSpace(p)
		if p == "" {
			continue
		}
		b64, ok := strings.CutPrefix(p, "sha256//")
		raw, err := base64.StdEncoding.DecodeString(b64)
		if !ok || err != nil || len(raw) != sha256.Size {
			return nil, fmt.Errorf("--pin-pubkey %q is not sha256//<base64 of 32 bytes>", p)
		}
		pins = append(pins, [32]byte(raw))
	}
	if len(pins) == 0 {
		return nil, errors.New("--pin-pubkey is empty")
	}
	return pins, nil
}

// PinOf returns the --pin-pubkey value of the first certificate in a PEM
// file.
func PinOf(pemBytes []byte) (string, error) {
	for {
		var b *pem.Block
		b, pemBytes = pem.Decode(pemBytes)
		if b == nil {
			return "", errors.New("no PEM certificate found")
		}
		if b.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return "", err
		}
		sum := sha256.Sum256(c.RawSubjectPublicKeyInfo)
		return "sha256//" + base64.StdEncoding.EncodeToString(sum[:]), nil
	}
}

// apiError is an answer other than 200.
type apiError struct {
	status     int
	code, msg  string
	retryAfter time.Duration // from Retry-After; 0 when absent
}

func (e *apiError) Error() string {
	if e.code != "" {
		return fmt.Sprintf("server answered %d %s: %s", e.status, e.code, e.msg)
	}
	return fmt.Sprintf("server answered %d %s", e.status, http.StatusText(e.status))
}

func statusOf(err error) int {
	var ae *apiError
	if errors.As(err, &ae) {
		return ae.status
	}
	return 0
}

// post sends v as JSON and decodes a 200 answer into out.
func (c *client) post(ctx context.Context, path, token string, v, out any) error {
	body, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if len(body) > protocol.MaxBodyBytes {
		return fmt.Errorf("request of %d bytes exceeds the protocol limit of %d", len(body), protocol.MaxBodyBytes)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", c.userAgent)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer+1))
	if err != nil {
		return fmt.Errorf("reading the answer: %w", err)
	}
	if len(raw) > maxAnswer {
		return fmt.Errorf("answer exceeds %d bytes", maxAnswer)
	}
	if resp.StatusCode != http.StatusOK && (resp.StatusCode != http.StatusAccepted || path != protocol.PathRegister) {
		e := &apiError{status: resp.StatusCode, retryAfter: parseRetryAfter(resp.Header.Get("Retry-After"), time.Now())}
		var eb protocol.ErrorBody
		if json.Unmarshal(raw, &eb) == nil {
			e.code, e.msg = eb.Error.Code, eb.Error.Message
		}
		return e
	}
	if err := json.Unmarshal(raw, out); err != nil {
		return fmt.Errorf("answer is not the expected JSON: %w", err)
	}
	if resp.StatusCode == http.StatusAccepted {
		return &pendingError{retryAfter: parseRetryAfter(resp.Header.Get("Retry-After"), time.Now())}
	}
	return nil
}

// pendingError is a 202 to a registration: an operator must approve it.
type pendingError struct{ retryAfter time.Duration }

func (e *pendingError) Error() string { return "registration pending approval" }

// parseRetryAfter reads seconds or an HTTP date, capped at one hour.
func parseRetryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	var d time.Duration
	if n, err := strconv.Atoi(v); err == nil {
		d = time.Duration(n) * time.Second
	} else if t, err := http.ParseTime(v); err == nil {
		d = t.Sub(now)
	}
	return min(max(d, 0), time.Hour)
}

// register sends a registration; token (the device's last one, or "")
// goes as bearer to prove the device.
func (c *client) register(ctx context.Context, r *protocol.RegisterRequest, token string) (protocol.RegisterResponse, error) {
	var out protocol.RegisterResponse
	err := c.post(ctx, protocol.PathRegister, token, r, &out)
	if err == nil && (out.DeviceID == "" || out.Token == "") {
		err = errors.New("registration answer lacks device_id or token")
	}
	return out, err
}

func (c *client) push(ctx context.Context, token string, p *pushBody) (protocol.PushResponse, error) {
	var out protocol.PushResponse
	err := c.post(ctx, protocol.PathPush, token, p, &out)
	return out, err
}

// pushBody is what the agent sends; protocol.PushRequest carries the state
// as raw JSON for the server's sake.
type pushBody struct {
	Seq           uint64                   `json:"seq"`
	ConfigVersion int64                    `json:"config_version"`
	ConfigError   string                   `json:"config_error,omitempty"`
	State         protocol.State           `json:"state"`
	Results       []protocol.CommandResult `json:"results,omitempty"`
	// FirmwareUpdate reports the firmware update under way (firmware.go).
	FirmwareUpdate *protocol.FirmwareReport `json:"firmware_update,omitempty"`
	// Started until a push was accepted since the agent started.
	Started bool `json:"started,omitempty"`
}
