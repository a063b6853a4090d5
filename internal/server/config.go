package server

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
	"github.com/drover/drover/internal/fleet"
)

// Config is everything `drover serve` can be told. Each field is a flag;
// the same name works in the config file (TOML) and, upper-cased with
// DROVER_ prefix and '-' as '_', in the environment. Precedence: flag,
// environment, config file, default.
type Config struct {
	DataDir          string
	Listen           string
	HTTPListen       string
	TLSCert          string
	TLSKey           string
	DB               string
	Persistence      string
	FlushInterval    time.Duration
	EnrollmentSecret string
	AdminToken       string
	PushInterval     int
	HistoryRetention time.Duration
	MaxPendingWrites int
	MaxInflight      int
	Threads          int
	ShutdownTimeout  time.Duration
	LogFormat        string
	LogLevel         string
	DebugListen      string
	// MetricsToken is a bearer token that may read /metrics and nothing
	// else (the admin token may too); "" for none.
	MetricsToken string
	// MetricsListen is a plain-HTTP address serving /metrics to anyone,
	// for a Prometheus on a network devices cannot reach; "" for none.
	MetricsListen string
}

// DefaultConfig is the zero-configuration setup: SQLite under ./drover-data,
// HTTPS on :8443 with a generated certificate, write-through.
func DefaultConfig() Config {
	return Config{
		DataDir:          "drover-data",
		Listen:           ":8443",
		Persistence:      "write-through",
		FlushInterval:    5 * time.Second,
		PushInterval:     200,
		HistoryRetention: 7 * 24 * time.Hour,
		MaxPendingWrites: 50000,
		MaxInflight:      8192,
		ShutdownTimeout:  30 * time.Second,
		LogFormat:        "text",
		LogLevel:         "info",
	}
}

func (c *Config) flags(fs *flag.FlagSet) *string {
	fs.StringVar(&c.DataDir, "data-dir", c.DataDir, "directory for the database, TLS certificate and generated secrets")
	fs.StringVar(&c.Listen, "listen", c.Listen, "HTTPS listen address (empty: no HTTPS)")
	fs.StringVar(&c.HTTPListen, "http-listen", c.HTTPListen, "plain-HTTP listen address, for deployments behind a TLS terminator (empty: none)")
	fs.StringVar(&c.TLSCert, "tls-cert", c.TLSCert, "PEM certificate chain (empty: self-signed ECDSA certificate generated in data-dir/tls)")
	fs.StringVar(&c.TLSKey, "tls-key", c.TLSKey, "PEM private key of -tls-cert")
	fs.StringVar(&c.DB, "db", c.DB, "database DSN: sqlite:PATH, postgres://… or mysql://… (empty: SQLite at data-dir/drover.db)")
	fs.StringVar(&c.Persistence, "persistence", c.Persistence, "memory, write-through or write-back (see docs/persistence.md)")
	fs.DurationVar(&c.FlushInterval, "flush-interval", c.FlushInterval, "write-back: how often dirty devices are flushed")
	fs.StringVar(&c.EnrollmentSecret, "enrollment-secret", c.EnrollmentSecret, "secret devices present to register (empty: generated once, kept in data-dir/secrets.json)")
	fs.StringVar(&c.AdminToken, "admin-token", c.AdminToken, "bearer token of the operator API (empty: generated once, kept in data-dir/secrets.json)")
	fs.IntVar(&c.PushInterval, "push-interval", c.PushInterval, "push interval in seconds of profiles created by default")
	fs.DurationVar(&c.HistoryRetention, "history-retention", c.HistoryRetention, "how long history samples are kept (0: forever)")
	fs.IntVar(&c.MaxPendingWrites, "max-pending-writes", c.MaxPendingWrites, "records waiting for a commit beyond which pushes get 503")
	fs.IntVar(&c.MaxInflight, "max-inflight", c.MaxInflight, "device requests handled at once beyond which they get 503")
	fs.IntVar(&c.Threads, "threads", c.Threads, "OS threads running Go code, GOMAXPROCS (0: one per CPU)")
	fs.DurationVar(&c.ShutdownTimeout, "shutdown-timeout", c.ShutdownTimeout, "how long SIGTERM waits for in-flight requests and pending writes")
	fs.StringVar(&c.LogFormat, "log-format", c.LogFormat, "text or json")
	fs.StringVar(&c.LogLevel, "log-level", c.LogLevel, "debug, info, warn or error")
	fs.StringVar(&c.DebugListen, "debug-listen", c.DebugListen, "address serving Go's /debug/pprof/ profiles, unauthenticated: keep it on loopback (empty: off)")
	fs.StringVar(&c.MetricsToken, "metrics-token", c.MetricsToken, "bearer token that may read /metrics and nothing else (the admin token may too; empty: admin token only)")
	fs.StringVar(&c.MetricsListen, "metrics-listen", c.MetricsListen, "plain-HTTP address serving /metrics without credentials, for a Prometheus on an operators' network (empty: none)")
	return fs.String("config", "", "TOML config file with the same keys as these flags (e.g. data-dir = \"/var/lib/drover\")")
}

// ParseConfig reads flags, environment and an optional config file.
func ParseConfig(args []string, getenv func(string) string, stderr io.Writer) (Config, error) {
	cfg := DefaultConfig()
	fs := flag.NewFlagSet("drover serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	configFile := cfg.flags(fs)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: drover serve [flags]\n\nRuns the Drover server. Every flag can also be set as DROVER_<NAME> in the\nenvironment or as <name> in the -config file.\n\nflags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if getenv == nil {
		getenv = os.Getenv
	}
	if *configFile == "" {
		*configFile = getenv("DROVER_CONFIG")
	}
	fileValues := map[string]any{}
	if *configFile != "" {
		if _, err := toml.DecodeFile(*configFile, &fileValues); err != nil {
			return cfg, fmt.Errorf("config file %s: %w", *configFile, err)
		}
	}
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		if set[f.Name] || f.Name == "config" {
			return
		}
		env := "DROVER_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if v := getenv(env); v != "" {
			if err := f.Value.Set(v); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", env, err))
			}
			return
		}
		if v, ok := fileValues[f.Name]; ok {
			delete(fileValues, f.Name)
			if err := f.Value.Set(fmt.Sprint(v)); err != nil {
				errs = append(errs, fmt.Errorf("config file %s: %s: %w", *configFile, f.Name, err))
			}
		}
	})
	delete(fileValues, "config")
	for k := range fileValues {
		if fs.Lookup(k) == nil {
			errs = append(errs, fmt.Errorf("config file %s: unknown key %q", *configFile, k))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return cfg, err
	}
	return cfg, cfg.Validate()
}

// Validate checks values that flags cannot.
func (c *Config) Validate() error {
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
	if err := fleet.CheckPushInterval(c.PushInterval); err != nil {
		return fmt.Errorf("-push-interval %d: %w", c.PushInterval, err)
	}
	if c.FlushInterval <= 0 {
		return errors.New("-flush-interval must be positive")
	}
	if c.MaxInflight < 1 || c.MaxPendingWrites < 1 {
		return errors.New("-max-inflight and -max-pending-writes must be positive")
	}
	if c.LogFormat != "text" && c.LogFormat != "json" {
		return fmt.Errorf("-log-format must be text or json, not %q", c.LogFormat)
	}
	if c.MetricsToken != "" && len(c.MetricsToken) < 16 {
		return errors.New("-metrics-token must be at least 16 characters")
	}
	if c.MetricsToken != "" && c.MetricsToken == c.AdminToken {
		return errors.New("-metrics-token must differ from -admin-token")
	}
	if c.DataDir == "" {
		return errors.New("-data-dir must not be empty")
	}
	return nil
}

// dbDSN is the database to open.
func (c *Config) dbDSN() string {
	if c.DB != "" {
		return c.DB
	}
	return "sqlite:" + filepath.Join(c.DataDir, "drover.db")
}
