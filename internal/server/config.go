package server

import (
	"errors"
	"fmt"
	"net/url"
	"path/filepath"
	"strings"
	"time"

	"github.com/drover/drover/internal/access"
	"github.com/drover/drover/internal/cluster"
	"github.com/drover/drover/internal/fleet"
	"github.com/drover/drover/internal/protocol"
	"github.com/drover/drover/internal/store"
	"github.com/drover/drover/internal/web"
)

// Config is everything `drover serve` can be told; cmd/drover fills it
// from flags, DROVER_* environment and the config file.
type Config struct {
	DataDir    string
	Listen     string
	HTTPListen string
	TLSCert    string
	TLSKey     string
	// TLSCertCheck is how often TLSCert and TLSKey are checked for a change
	// and reloaded (0: only on SIGHUP).
	TLSCertCheck     time.Duration
	DB               string
	Persistence      string
	FlushInterval    time.Duration
	EnrollmentSecret string
	AdminToken       string
	// The same secrets from files (one line; surrounding white space
	// ignored), kept out of the command line and the environment; a secret
	// and its file are not both given. New reads them (secretfiles.go).
	EnrollmentSecretFile string
	AdminTokenFile       string
	MetricsTokenFile     string
	PushInterval         int
	HistoryRetention     time.Duration
	// AuditRetention is how long audit log rows are kept (0: forever).
	AuditRetention time.Duration
	// OIDC: single sign-on on the dashboard (docs/security.md); off
	// without an issuer. OIDCRoles maps values of the OIDCRoleClaim claim
	// to roles: "drover-admins=admin,drover-ops=operator,staff=viewer".
	OIDCIssuer, OIDCClientID, OIDCClientSecret, OIDCRedirectURL string
	OIDCUserClaim, OIDCRoleClaim, OIDCRoles                     string
	// OIDCClientSecretFile holds OIDCClientSecret (secretfiles.go).
	OIDCClientSecretFile string
	// Per-device quotas (docs/operations.md, "Quotas").
	QuotaPushRate       float64
	QuotaPushBurst      int
	QuotaHistorySamples int
	QuotaHistoryBytes   int64
	// QuotaHold is the longest a push over quota is held before its 429
	// when the connection's last push was refused too (push.go); 0:
	// never held.
	QuotaHold        time.Duration
	MaxPendingWrites int
	// CommitInterval is write-through's least time between the starts of
	// two commits (fleet.WriteThroughOptions.CommitInterval; 0: none).
	CommitInterval time.Duration
	// CommitBatch is how many pending records start a write-through
	// commit before the interval has passed
	// (fleet.WriteThroughOptions.CommitBatch; 0: never).
	CommitBatch int
	MaxInflight int
	// MaxBusyConns is how many connections may be reading or answering a
	// request at once; beyond, the listeners stop accepting (transport.Gate).
	MaxBusyConns    int
	Threads         int
	ShutdownTimeout time.Duration
	LogFormat       string
	LogLevel        string
	DebugListen     string
	// MetricsToken is a bearer token that may read /metrics and nothing
	// else (the admin token may too); "" for none.
	MetricsToken string
	// MetricsListen is a plain-HTTP address serving /metrics to anyone,
	// for a Prometheus on a network devices cannot reach; "" for none.
	MetricsListen string

	// TLS policy of -listen (transport.Policy).
	TLSKeyExchange string
	// TLSMaxVersion caps the listener's TLS version
	// (protocol.TLSMaxVersion): "1.3" or "1.2".
	TLSMaxVersion string
	// TLSTicketKeys names a file of session ticket keys (transport.SetTicketKeys)
	// shared by cluster nodes; "": crypto/tls's own, per process.
	TLSTicketKeys     string
	TLSAllowLegacyCBC bool
	// Device admission and trust (register.go, admission.go,
	// docs/operations.md#security).
	Admission               string
	ClientCA                string
	RequireClientCert       bool
	RegisterRate            float64
	RegisterBurst           int
	RegisterRatePerAddress  float64
	RegisterBurstPerAddress int
	RegisterRateExempt      string
	// SMTPPasswordFile names a file holding the SMTP password, which is
	// then never stored; "" for none.
	SMTPPasswordFile string
	// NodeName names this server in the X-Drover-Node header of every
	// answer (docs/cluster.md); "" sends none. In cluster mode it names
	// the node (default there: the host name, ClusterNode).
	// Cluster mode (docs/cluster.md): this server is one node of several
	// sharing a PostgreSQL database, told of each other's changes through
	// NATS at NATSURL ("": the database alone).
	Cluster  bool
	NATSURL  string
	NodeName string
	// NodeURL is where the other nodes reach this one to relay remote
	// sessions ("": its listener's address, relay.go).
	NodeURL string
	// Firmware (docs/firmware.md): where uploaded files are kept ("":
	// DataDir/firmware), the largest upload, how often rollouts advance and
	// how long a firmware download may take.
	FirmwareDir         string
	FirmwareMaxSize     int64
	RolloutInterval     time.Duration
	FirmwareDownloadMax time.Duration
	// ACME (transport.NewACME): certificates for ACMEDomains (comma-separated; "":
	// off) from the ACME directory ACMEDirectoryURL, kept in ACMECacheDir
	// ("": DataDir/acme), account e-mail ACMEEmail; ACMECACert is a PEM
	// file of the CA that signs the directory's HTTPS certificate (a
	// private ACME CA; "": the system's roots).
	ACMEDomains      string
	ACMEDirectoryURL string
	ACMECacheDir     string
	ACMEEmail        string
	ACMECACert       string
	// Tunnel bounds port forwarding sessions (tunnel.go,
	// docs/remote-access.md), and remote terminals and file transfers
	// as well.
	Tunnel TunnelLimits
	// RemoteAccessLabels, comma-separated, are the labels a device must
	// carry one of for any remote access (tunnels, terminals, files);
	// "": every device (remote.go, docs/remote-access.md).
	RemoteAccessLabels string
	// TerminalRecord keeps every remote terminal's output as an asciinema
	// v2 file in DataDir/recordings, deleted after
	// TerminalRecordRetention.
	TerminalRecord          bool
	TerminalRecordRetention time.Duration
	// RemoteFileMaxSize bounds a file upload to a device through this
	// server (each agent has its own bound, --files-max-size).
	RemoteFileMaxSize int64
}

// DefaultCommitInterval is the default -commit-interval (docs/performance.md,
// "Commit interval and commit batch").
const DefaultCommitInterval = 5 * time.Millisecond

// DefaultCommitBatch is the default -commit-batch, in records (a push is
// two: its state and its history sample); docs/performance.md, "Commit
// interval and commit batch".
const DefaultCommitBatch = 64

// MaxCommitInterval is the largest -commit-interval: every write-through
// request may wait that long for its commit to start.
const MaxCommitInterval = time.Second

// DefaultConfig is the zero-configuration setup: SQLite under ./drover-data,
// HTTPS on :8443 with a generated certificate, write-through.
func DefaultConfig() Config {
	return Config{
		DataDir:             "drover-data",
		Listen:              ":8443",
		Persistence:         "write-through",
		TLSKeyExchange:      KeyExchangeClassic, // docs/performance.md, "TLS handshake CPU"
		TLSMaxVersion:       "1.3",
		FlushInterval:       5 * time.Second,
		TLSCertCheck:        time.Minute,
		ACMEDirectoryURL:    "https://acme-v02.api.letsencrypt.org/directory",
		PushInterval:        200,
		HistoryRetention:    7 * 24 * time.Hour,
		AuditRetention:      400 * 24 * time.Hour,
		QuotaPushRate:       fleet.DefaultQuotas().PushRate,
		QuotaPushBurst:      fleet.DefaultQuotas().PushBurst,
		QuotaHistorySamples: fleet.DefaultQuotas().HistorySamples,
		QuotaHistoryBytes:   fleet.DefaultQuotas().HistoryBytes,
		QuotaHold:           10 * time.Second,
		MaxPendingWrites:    50000,
		CommitInterval:      DefaultCommitInterval,
		CommitBatch:         DefaultCommitBatch,
		MaxInflight:         8192,
		MaxBusyConns:        1024,
		ShutdownTimeout:     30 * time.Second,
		LogFormat:           "text",
		LogLevel:            "info",
		Admission:           "open",
		// Above what one server registers per second (13,000/s measured on
		// 2 cores): a registration storm from three or more addresses
		// never waits; see docs/operations.md#registration-rate-limits.
		RegisterRate:            20000,
		RegisterBurst:           20000,
		RegisterRatePerAddress:  5000,
		RegisterBurstPerAddress: 20000,
		RegisterRateExempt:      "127.0.0.0/8,::1",
		FirmwareMaxSize:         1 << 30,
		RolloutInterval:         2 * time.Second,
		FirmwareDownloadMax:     6 * time.Hour,
		NATSURL:                 cluster.DefaultConfig().NATSURL,
		Tunnel:                  DefaultTunnelLimits(),
		TerminalRecordRetention: 90 * 24 * time.Hour,
		RemoteFileMaxSize:       1 << 30,
	}
}

// Validate checks values that flags cannot.
func (c *Config) Validate() error {
	if _, err := c.oidc(); err != nil {
		return err
	}
	switch c.Persistence {
	case "memory", "write-through", "write-back":
	default:
		return fmt.Errorf("-persistence must be memory, write-through or write-back, not %q", c.Persistence)
	}
	if c.Listen == "" && c.HTTPListen == "" {
		return errors.New("nothing to listen on: set -listen or -http-listen")
	}
	if (c.TLSCert == "") != (c.TLSKey == "") {
		return errors.New("-tls-cert and -tls-key go together")
	}
	if err := c.checkACME(); err != nil {
		return err
	}
	if _, err := protocol.KeyExchangeGroups(c.TLSKeyExchange); err != nil {
		return err
	}
	if _, err := protocol.TLSMaxVersion(c.TLSMaxVersion); err != nil {
		return err
	}
	if err := fleet.CheckPushInterval(c.PushInterval); err != nil {
		return fmt.Errorf("-push-interval %d: %w", c.PushInterval, err)
	}
	if c.QuotaPushRate < 0 || c.QuotaPushRate > 1000 {
		return fmt.Errorf("-quota-push-rate must be 0..1000 pushes per interval, not %g", c.QuotaPushRate)
	}
	if c.QuotaPushBurst < 1 || c.QuotaPushBurst > 100 {
		return fmt.Errorf("-quota-push-burst must be 1..100, not %d", c.QuotaPushBurst)
	}
	if c.QuotaHistorySamples < 0 || c.QuotaHistorySamples > 1000 {
		return fmt.Errorf("-quota-history-samples must be 0..1000, not %d", c.QuotaHistorySamples)
	}
	if c.QuotaHold < 0 || c.QuotaHold > time.Minute {
		return fmt.Errorf("-quota-hold must be 0..1m, not %v", c.QuotaHold)
	}
	if c.QuotaHistoryBytes < 0 {
		return errors.New("-quota-history-bytes must not be negative")
	}
	if c.FirmwareMaxSize < 1 {
		return errors.New("-firmware-max-size must be positive")
	}
	if c.RolloutInterval < 100*time.Millisecond || c.FirmwareDownloadMax < time.Minute {
		return errors.New("-rollout-interval must be at least 100ms and -firmware-download-max at least 1m")
	}
	if c.FlushInterval <= 0 {
		return errors.New("-flush-interval must be positive")
	}
	if c.CommitInterval < 0 || c.CommitInterval > MaxCommitInterval {
		return fmt.Errorf("-commit-interval must be 0..%v, not %v", MaxCommitInterval, c.CommitInterval)
	}
	if c.CommitBatch < 0 {
		return fmt.Errorf("-commit-batch must be 0 or more, not %d", c.CommitBatch)
	}
	if c.MaxInflight < 1 || c.MaxPendingWrites < 1 || c.MaxBusyConns < 1 {
		return errors.New("-max-inflight, -max-busy-connections and -max-pending-writes must be positive")
	}
	if c.LogFormat != "text" && c.LogFormat != "json" {
		return fmt.Errorf("-log-format must be text or json, not %q", c.LogFormat)
	}
	if err := c.Tunnel.check(); err != nil {
		return err
	}
	if c.TerminalRecordRetention < time.Hour {
		return errors.New("-terminal-record-retention must be at least 1h")
	}
	if c.RemoteFileMaxSize < 0 {
		return errors.New("-remote-file-max-size must not be negative")
	}
	if err := c.validateSecrets(); err != nil {
		return err
	}
	if c.DataDir == "" {
		return errors.New("-data-dir must not be empty")
	}
	if !validNodeName(c.NodeName) {
		return fmt.Errorf("-node-name %q: at most 64 of A-Z a-z 0-9 . _ -", c.NodeName)
	}
	if err := c.validateCluster(); err != nil {
		return err
	}
	return c.validateTrust()
}

// firmwareDir is where uploaded firmware files are kept.
func (c *Config) firmwareDir() string {
	if c.FirmwareDir != "" {
		return c.FirmwareDir
	}
	return filepath.Join(c.DataDir, "firmware")
}

// acmeCacheDir is where the ACME account and certificates are kept.
func (c *Config) acmeCacheDir() string {
	if c.ACMECacheDir != "" {
		return c.ACMECacheDir
	}
	return filepath.Join(c.DataDir, "acme")
}

// DSN is the database the server opens: DB, or SQLite in DataDir.
func (c *Config) DSN() string { return c.dbDSN() }

func (c *Config) dbDSN() string {
	if c.DB != "" {
		return c.DB
	}
	return "sqlite:" + filepath.Join(c.DataDir, "drover.db")
}

// validNodeName: empty, or 1–64 of [A-Za-z0-9._-] (a safe header value).
func validNodeName(n string) bool {
	if len(n) > 64 {
		return false
	}
	for i := 0; i < len(n); i++ {
		c := n[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// validateCluster checks the cluster mode's settings.
func (c *Config) validateCluster() error {
	if !c.Cluster {
		return nil
	}
	if c.Persistence != "write-through" {
		return fmt.Errorf("-cluster needs -persistence write-through (the nodes share what they commit), not %q", c.Persistence)
	}
	if backend, _, err := store.Parse(c.dbDSN()); err != nil || backend != store.Postgres {
		return errors.New("-cluster needs a PostgreSQL -db (postgres://…): SQLite and MariaDB serve one server; see docs/cluster.md")
	}
	if !validNodeName(c.ClusterNode()) {
		return fmt.Errorf("cluster mode names the node by its host name %q, which is no valid -node-name: set -node-name", c.ClusterNode())
	}
	if c.NodeURL != "" {
		if u, err := url.Parse(c.NodeURL); err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || (u.Path != "" && u.Path != "/") {
			return fmt.Errorf("-node-url %q: an http:// or https:// URL of this node, host and port only", c.NodeURL)
		}
	}
	return nil
}

// ClusterNode is the node's name in cluster mode: NodeName, or the host
// name.
func (c *Config) ClusterNode() string {
	if c.NodeName != "" {
		return c.NodeName
	}
	return cluster.DefaultConfig().Node
}

// oidc is the dashboard's single sign-on configuration; nil: off.
func (c *Config) oidc() (*web.OIDC, error) {
	if c.OIDCIssuer == "" {
		return nil, nil
	}
	if c.OIDCClientID == "" || c.OIDCRedirectURL == "" {
		return nil, errors.New("-oidc-issuer needs -oidc-client-id and -oidc-redirect-url (https://HOST/ui/oidc/callback)")
	}
	o := &web.OIDC{Issuer: c.OIDCIssuer, ClientID: c.OIDCClientID, ClientSecret: c.OIDCClientSecret, RedirectURL: c.OIDCRedirectURL,
		UserClaim: c.OIDCUserClaim, RoleClaim: c.OIDCRoleClaim, Roles: map[string]access.Role{}}
	for _, kv := range strings.Split(c.OIDCRoles, ",") {
		if kv = strings.TrimSpace(kv); kv == "" {
			continue
		}
		v, role, ok := strings.Cut(kv, "=")
		r, err := access.ParseRole(role)
		if !ok || v == "" || err != nil {
			return nil, fmt.Errorf("-oidc-roles: %q is not CLAIM-VALUE=admin|operator|viewer", kv)
		}
		o.Roles[v] = r
	}
	if len(o.Roles) == 0 {
		return nil, errors.New("-oidc-roles must map at least one claim value to a role, e.g. drover-admins=admin")
	}
	return o, nil
}
