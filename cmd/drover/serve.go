package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"syscall"

	"github.com/drover/drover/cmd/internal/command"
	"github.com/drover/drover/internal/server"
)

// serveFlags binds c's fields to flags of fs.
func serveFlags(fs *flag.FlagSet, c *server.Config) {
	fs.StringVar(&c.DataDir, "data-dir", c.DataDir, "directory for the database, TLS certificate and generated secrets")
	fs.StringVar(&c.NodeName, "node-name", c.NodeName, "this server's name, sent as the X-Drover-Node header of every answer (empty: none); with --cluster the node's name, unique in the cluster (empty there: the host name; docs/cluster.md)")
	fs.StringVar(&c.Listen, "listen", c.Listen, "HTTPS listen address (empty: no HTTPS)")
	fs.StringVar(&c.HTTPListen, "http-listen", c.HTTPListen, "plain-HTTP listen address, for deployments behind a TLS terminator (empty: none)")
	fs.StringVar(&c.TLSCert, "tls-cert", c.TLSCert, "PEM certificate chain (empty: self-signed ECDSA certificate generated in data-dir/tls); SIGHUP reloads it")
	fs.StringVar(&c.TLSKey, "tls-key", c.TLSKey, "PEM private key of -tls-cert")
	fs.DurationVar(&c.TLSCertCheck, "tls-cert-check", c.TLSCertCheck, "how often -tls-cert and -tls-key are checked for a change and reloaded without SIGHUP (0: only on SIGHUP)")
	fs.StringVar(&c.ACMEDomains, "acme-domains", c.ACMEDomains, "comma-separated host names whose certificates come from ACME (Let's Encrypt), obtained at the first handshake and renewed before they expire; other names and bare addresses get the -tls-cert or self-signed one (empty: off; docs/operations.md, ACME)")
	fs.StringVar(&c.ACMEDirectoryURL, "acme-directory-url", c.ACMEDirectoryURL, "ACME directory (Let's Encrypt staging: https://acme-staging-v02.api.letsencrypt.org/directory; a private ACME CA)")
	fs.StringVar(&c.ACMECacheDir, "acme-cache-dir", c.ACMECacheDir, "where ACME account key and certificates are kept (empty: data-dir/acme)")
	fs.StringVar(&c.ACMEEmail, "acme-email", c.ACMEEmail, "contact e-mail of the ACME account (expiry notices; empty: none)")
	fs.StringVar(&c.ACMECACert, "acme-ca-cert", c.ACMECACert, "PEM CA certificate of a private ACME directory's HTTPS (empty: the system's roots)")
	fs.StringVar(&c.TLSKeyExchange, "tls-key-exchange", c.TLSKeyExchange, "TLS key exchanges accepted: classic (X25519, P-256, P-384: the client's key share decides), hybrid (also post-quantum X25519MLKEM768, chosen whenever the client offers it; more CPU per handshake on server and device), x25519, p256 or a comma-separated list (docs/operations.md, TLS)")
	fs.StringVar(&c.TLSTicketKeys, "tls-ticket-keys", c.TLSTicketKeys, "file of TLS session ticket keys, one base64 32-byte key a line, the first encrypting (empty: random keys per process, rotated daily); give every cluster node the same file so that a session resumes on any node; SIGHUP reloads it (docs/operations.md, TLS)")
	fs.StringVar(&c.TLSMaxVersion, "tls-max-version", c.TLSMaxVersion, "highest TLS version of -listen: 1.3, or 1.2 (resumed sessions skip the key exchange: less CPU per new connection, no forward secrecy for them; docs/operations.md, TLS)")
	fs.BoolVar(&c.TLSAllowLegacyCBC, "tls-allow-legacy-cbc", c.TLSAllowLegacyCBC, "also offer the TLS 1.2 ECDHE AES-CBC-SHA1 suites, for old routers without AEAD suites (default off: AES-GCM and ChaCha20-Poly1305 only)")
	fs.StringVar(&c.DB, "db", c.DB, "database DSN: sqlite:PATH, postgres://… or mysql://… (empty: SQLite at data-dir/drover.db)")
	fs.StringVar(&c.Persistence, "persistence", c.Persistence, "memory, write-through or write-back (see docs/persistence.md)")
	fs.DurationVar(&c.FlushInterval, "flush-interval", c.FlushInterval, "write-back: how often dirty devices are flushed")
	fs.StringVar(&c.EnrollmentSecret, "enrollment-secret", c.EnrollmentSecret, "secret devices present to register (empty: generated once, printed once and kept in data-dir/secrets.json; a given one is never printed nor stored)")
	fs.StringVar(&c.AdminToken, "admin-token", c.AdminToken, "bearer token of the operator API (empty: generated once, printed once and kept in data-dir/secrets.json; a given one is never printed nor stored)")
	fs.StringVar(&c.EnrollmentSecretFile, "enrollment-secret-file", c.EnrollmentSecretFile, "file holding -enrollment-secret (one line), instead of the flag; SIGHUP reads it again (rotation without restart)")
	fs.StringVar(&c.AdminTokenFile, "admin-token-file", c.AdminTokenFile, "file holding -admin-token (one line), instead of the flag; SIGHUP reads it again (rotation without restart)")
	fs.IntVar(&c.PushInterval, "push-interval", c.PushInterval, "push interval in seconds of profiles created by default")
	fs.DurationVar(&c.HistoryRetention, "history-retention", c.HistoryRetention, "how long history samples are kept (0: forever)")
	fs.DurationVar(&c.AuditRetention, "audit-retention", c.AuditRetention, "how long audit log rows (every change, docs/security.md) are kept (0: forever)")
	fs.Float64Var(&c.QuotaPushRate, "quota-push-rate", c.QuotaPushRate, "pushes a device may make per push interval of its profile on average; more get 429 (0: no push quota)")
	fs.IntVar(&c.QuotaPushBurst, "quota-push-burst", c.QuotaPushBurst, "pushes a device that has been quiet may make back to back (reboots, configuration changes)")
	fs.IntVar(&c.QuotaHistorySamples, "quota-history-samples", c.QuotaHistorySamples, "history samples kept per device per push interval (0: one per accepted push)")
	fs.Int64Var(&c.QuotaHistoryBytes, "quota-history-bytes", c.QuotaHistoryBytes, "history bytes kept per device over -history-retention, at 192 bytes a sample (0: no byte bound)")
	fs.DurationVar(&c.QuotaHold, "quota-hold", c.QuotaHold, "longest a device's push over quota is held before its 429 when its connection's last push was refused too (0: answer at once)")
	fs.DurationVar(&c.CommitInterval, "commit-interval", c.CommitInterval, "write-through: least time between the starts of two commits; writes arriving meanwhile share the next commit (fewer, larger commits: less CPU per write, up to this much more latency; 0: commit as soon as the last commit ended; at most 1s)")
	fs.IntVar(&c.CommitBatch, "commit-batch", c.CommitBatch, "write-through: pending records (a push is 2) that start a commit without waiting for the rest of -commit-interval (0: always wait)")
	fs.IntVar(&c.MaxPendingWrites, "max-pending-writes", c.MaxPendingWrites, "records waiting for a commit beyond which pushes get 503")
	fs.IntVar(&c.MaxInflight, "max-inflight", c.MaxInflight, "device requests handled at once beyond which they get 503")
	fs.IntVar(&c.MaxBusyConns, "max-busy-connections", c.MaxBusyConns, "connections reading or answering a request at once; beyond, new connections wait in the kernel's accept queue instead of being accepted")
	fs.IntVar(&c.Threads, "threads", c.Threads, "OS threads running Go code, GOMAXPROCS (0: one per CPU)")
	fs.DurationVar(&c.ShutdownTimeout, "shutdown-timeout", c.ShutdownTimeout, "how long SIGTERM waits for in-flight requests and pending writes")
	fs.StringVar(&c.LogFormat, "log-format", c.LogFormat, "text or json")
	fs.StringVar(&c.LogLevel, "log-level", c.LogLevel, "debug, info, warn or error; SIGHUP reloads it")
	fs.StringVar(&c.SMTPPasswordFile, "smtp-password-file", c.SMTPPasswordFile, "file holding the SMTP password (then never stored, and one set in the dashboard or API is ignored); SIGHUP reads it again")
	fs.StringVar(&c.DebugListen, "debug-listen", c.DebugListen, "address serving Go's /debug/pprof/ profiles, unauthenticated: keep it on loopback (empty: off)")
	fs.StringVar(&c.OIDCIssuer, "oidc-issuer", c.OIDCIssuer, "single sign-on on the dashboard: the OpenID Connect provider's issuer URL (empty: off; docs/security.md)")
	fs.StringVar(&c.OIDCClientID, "oidc-client-id", c.OIDCClientID, "single sign-on: this dashboard's client ID at the provider")
	fs.StringVar(&c.OIDCClientSecret, "oidc-client-secret", c.OIDCClientSecret, "single sign-on: the client secret (better in --oidc-client-secret-file, DROVER_OIDC_CLIENT_SECRET or the config file)")
	fs.StringVar(&c.OIDCClientSecretFile, "oidc-client-secret-file", c.OIDCClientSecretFile, "file holding -oidc-client-secret (one line), instead of the flag; a change needs a restart")
	fs.StringVar(&c.OIDCRedirectURL, "oidc-redirect-url", c.OIDCRedirectURL, "single sign-on: https://HOST/ui/oidc/callback, as registered at the provider")
	fs.StringVar(&c.OIDCUserClaim, "oidc-user-claim", c.OIDCUserClaim, "single sign-on: the claim naming the user (empty: preferred_username, then email, then sub)")
	fs.StringVar(&c.OIDCRoleClaim, "oidc-role-claim", c.OIDCRoleClaim, "single sign-on: the claim with the user's groups or roles (empty: groups)")
	fs.StringVar(&c.OIDCRoles, "oidc-roles", c.OIDCRoles, "single sign-on: claim values and the Drover role each gives, e.g. drover-admins=admin,drover-ops=operator,staff=viewer")
	fs.StringVar(&c.MetricsToken, "metrics-token", c.MetricsToken, "bearer token that may read /metrics and nothing else (the admin token may too; empty: admin token only)")
	fs.StringVar(&c.MetricsTokenFile, "metrics-token-file", c.MetricsTokenFile, "file holding -metrics-token (one line), instead of the flag; SIGHUP reads it again (rotation without restart)")
	fs.StringVar(&c.MetricsListen, "metrics-listen", c.MetricsListen, "plain-HTTP address serving /metrics without credentials, for a Prometheus on an operators' network (empty: none)")
	fs.StringVar(&c.Admission, "admission", c.Admission, "admission policy for new machine IDs: open, approve (an operator approves each) or preauthorized (only listed machine IDs)")
	fs.StringVar(&c.ClientCA, "client-ca", c.ClientCA, "PEM CA of device client certificates: a device whose certificate names its machine ID (CN or SAN) registers without the enrollment secret (empty: no client certificates)")
	fs.BoolVar(&c.RequireClientCert, "require-client-cert", c.RequireClientCert, "refuse registrations without a client certificate naming the machine ID (needs --client-ca)")
	fs.Float64Var(&c.RegisterRate, "register-rate", c.RegisterRate, "registrations per second in total beyond which they get 429 (0: unlimited)")
	fs.IntVar(&c.RegisterBurst, "register-burst", c.RegisterBurst, "registrations in total accepted at once above --register-rate")
	fs.Float64Var(&c.RegisterRatePerAddress, "register-rate-per-address", c.RegisterRatePerAddress, "registrations per second per source address (IPv6: per /64) beyond which they get 429 (0: unlimited)")
	fs.IntVar(&c.RegisterBurstPerAddress, "register-burst-per-address", c.RegisterBurstPerAddress, "registrations per address accepted at once above --register-rate-per-address")
	fs.StringVar(&c.FirmwareDir, "firmware-dir", c.FirmwareDir, "directory of uploaded firmware files (empty: data-dir/firmware); see docs/firmware.md")
	fs.Int64Var(&c.FirmwareMaxSize, "firmware-max-size", c.FirmwareMaxSize, "largest firmware file accepted by an upload, in bytes")
	fs.DurationVar(&c.RolloutInterval, "rollout-interval", c.RolloutInterval, "how often rollouts advance (waves, failure checks) and their device states are written")
	fs.DurationVar(&c.FirmwareDownloadMax, "firmware-download-max", c.FirmwareDownloadMax, "how long one firmware download or upload request may take (devices resume with Range after that)")
	fs.StringVar(&c.RegisterRateExempt, "register-rate-exempt", c.RegisterRateExempt, "comma-separated addresses or CIDR prefixes without a per-address registration limit")
	fs.BoolVar(&c.Cluster, "cluster", c.Cluster, "run as one node of a cluster sharing the PostgreSQL --db with other nodes (docs/cluster.md); write-through only")
	fs.StringVar(&c.NodeURL, "node-url", "", "cluster mode: the URL the other nodes reach this node at to relay remote sessions to the devices connected here, e.g. https://10.0.0.11:8443 (empty: this node's HTTPS listener, or its plain HTTP one, with the host name for a wildcard address; docs/remote-access.md)")
	fs.StringVar(&c.NATSURL, "nats-url", c.NATSURL, "cluster mode: NATS server(s) carrying the nodes' news to each other, comma-separated (empty: the database alone, slower)")
	fs.IntVar(&c.Tunnel.PerDevice, "tunnel-max-per-device", c.Tunnel.PerDevice, "remote sessions (port forwarding, terminals, file transfers) open at once per device; more get 429 (docs/remote-access.md)")
	fs.IntVar(&c.Tunnel.Total, "tunnel-max-total", c.Tunnel.Total, "remote sessions open at once on this server; more get 429")
	fs.DurationVar(&c.Tunnel.Idle, "tunnel-idle-timeout", c.Tunnel.Idle, "a remote session without a byte either way for this long is closed")
	fs.DurationVar(&c.Tunnel.MaxDuration, "tunnel-max-duration", c.Tunnel.MaxDuration, "a remote session is closed after this, busy or not")
	fs.StringVar(&c.RemoteAccessLabels, "remote-access-labels", "", "comma-separated labels: only devices carrying one of them may be reached by tunnels, terminals and file transfers; empty: every device (docs/remote-access.md)")
	fs.Int64Var(&c.RemoteFileMaxSize, "remote-file-max-size", c.RemoteFileMaxSize, "largest file upload to a device through this server, in bytes (413 beyond; each agent has its own --files-max-size)")
	fs.BoolVar(&c.TerminalRecord, "terminal-record", false, "record every remote terminal's output as an asciinema v2 file under DATA-DIR/recordings")
	fs.DurationVar(&c.TerminalRecordRetention, "terminal-record-retention", c.TerminalRecordRetention, "terminal recordings older than this are deleted")
	fs.DurationVar(&c.Tunnel.Open, "tunnel-open-timeout", c.Tunnel.Open, "how long a device has to open its tunnel link when asked, and to answer a session's request")
}

// serveConfig reads serve's configuration: flags, environment, config file.
func serveConfig(args []string, env command.Env) (server.Config, error) {
	cfg := server.DefaultConfig()
	fs := flag.NewFlagSet("drover serve", flag.ContinueOnError)
	serveFlags(fs, &cfg)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: drover serve [flags]\n\nRuns the Drover server. Every flag can also be set as DROVER_<NAME> in the\n"+
			"environment or as <name> in the --config file. SIGTERM and SIGINT drain and stop it;\n"+
			"SIGHUP reloads the TLS certificate, the log level and the secret files (*-file);\n"+
			"SIGUSR2 starts the binary again on the listening sockets and drains this process\n"+
			"(an upgrade that refuses no connection).\n\nflags:\n")
		fs.PrintDefaults()
	}
	if err := command.Load(fs, args, env); err != nil {
		return cfg, err
	}
	if err := command.NoArgs(fs); err != nil {
		return cfg, err
	}
	return cfg, command.Usage(cfg.Validate())
}

// errHandedOver ends serving once a new process took the sockets.
var errHandedOver = errors.New("handed over to a new process")

// fileOr is w when it is a file (a process started by a handover shares
// it), else def.
func fileOr(w io.Writer, def *os.File) *os.File {
	if f, ok := w.(*os.File); ok {
		return f
	}
	return def
}

// serveKeys are serve's config keys, which other commands' config files may
// hold (one file for the installation).
func serveKeys() []string {
	cfg := server.DefaultConfig()
	fs := flag.NewFlagSet("", flag.ContinueOnError)
	serveFlags(fs, &cfg)
	return command.Names(fs)
}

// serveGCPercent is the server's GOGC unless the environment sets one.
const serveGCPercent = 75

func serve(ctx context.Context, args []string, env command.Env) error {
	cfg, err := serveConfig(args, env)
	if err != nil {
		return err
	}
	log, level, err := command.NewLogger(env.Stderr, cfg.LogFormat, cfg.LogLevel)
	if err != nil {
		return err
	}
	if cfg.Threads > 0 {
		runtime.GOMAXPROCS(cfg.Threads)
	}
	if env.Var("GOGC") == "" && env.Var("GOMEMLIMIT") == "" {
		// The fleet is the live heap (about 380 bytes per device) and the
		// resident size follows the heap target: 75 instead of Go's 100
		// takes about 70 bytes per device off (docs/operations.md, Memory).
		debug.SetGCPercent(serveGCPercent)
	}
	// SIGUSR2 hands the listening sockets over to a new process of the
	// binary (docs/operations.md, Upgrades); registered before the load, so
	// that an early one waits instead of killing the process.
	usr2 := make(chan os.Signal, 1)
	signal.Notify(usr2, syscall.SIGUSR2)
	defer signal.Stop(usr2)
	srv, err := server.New(ctx, cfg, log)
	if err != nil {
		if ctx.Err() != nil {
			// SIGTERM or SIGINT while starting: no push was accepted yet,
			// so stopping here is a clean stop.
			log.Info("stopped before serving", "reason", "signal", "err", err)
			return nil
		}
		return err
	}
	ctx, handedOver := context.WithCancelCause(ctx)
	defer handedOver(nil)
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-usr2:
			}
			exe, err := os.Executable()
			if err == nil {
				err = srv.Handover(ctx, exe, os.Args[1:], fileOr(env.Stdout, os.Stdout), fileOr(env.Stderr, os.Stderr))
			}
			if err != nil {
				log.Error("SIGUSR2: handover failed; this process keeps serving", "err", err)
				continue
			}
			handedOver(errHandedOver)
			return
		}
	}()
	// Only what Drover generated, once; secrets given by flag, environment,
	// config file or secret file are never printed.
	fmt.Fprint(env.Stdout, srv.Generated.Notice(cfg.DataDir))
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-env.Reload:
			}
			// The configuration is read again as at the start; what cannot
			// change while serving is kept and said so.
			next, err := serveConfig(args, env)
			if err != nil {
				log.Error("SIGHUP: configuration not reloaded", "err", err)
				continue
			}
			if err := command.SetLevel(level, next.LogLevel); err != nil {
				log.Error("SIGHUP: log level not changed", "err", err)
			} else {
				log.Info("SIGHUP: log level", "level", level.Level().String())
			}
			if err := srv.Reload(next); err != nil {
				log.Error("SIGHUP: reload failed; the old TLS certificate stays in use", "err", err)
			}
		}
	}()
	return srv.Serve(ctx)
}
