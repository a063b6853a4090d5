// Package servertest runs a real Drover server in-process for tests: real
// TLS on loopback, real store in a temp dir.
package servertest

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/internal/server"
)

// Options adjust the server; zero values take the defaults of `drover serve`
// except that it listens on free loopback ports and has no per-device
// quotas (tests push in loops) unless Quotas is set.
type Options struct {
	DataDir     string // default: t.TempDir()
	Persistence string // default: write-through
	DB          string // default: SQLite in DataDir
	HTTP        bool   // also serve plain HTTP
	Quotas      bool   // keep the default per-device quotas
	Configure   func(*server.Config)
	Logger      *slog.Logger
	// NoOpenAPICheck: Client does not check requests and answers against
	// the OpenAPI document (it does, except in benchmarks).
	NoOpenAPICheck bool
}

// Server is a running test server.
type Server struct {
	URL              string // https://127.0.0.1:port
	HTTPURL          string // http://127.0.0.1:port, when Options.HTTP
	EnrollmentSecret string
	AdminToken       string
	CACertPEM        []byte
	Config           server.Config
	Srv              *server.Server

	t      testing.TB
	cancel context.CancelFunc
	done   chan error
	client *http.Client
}

// Start starts a server and stops it when the test ends.
func Start(t testing.TB, opts Options) *Server {
	t.Helper()
	cfg := server.DefaultConfig()
	cfg.DataDir = opts.DataDir
	if cfg.DataDir == "" {
		cfg.DataDir = t.TempDir()
	}
	cfg.Listen = "127.0.0.1:0"
	if opts.HTTP {
		cfg.HTTPListen = "127.0.0.1:0"
	}
	if opts.Persistence != "" {
		cfg.Persistence = opts.Persistence
	}
	cfg.DB = opts.DB
	cfg.ShutdownTimeout = 10 * time.Second
	if !opts.Quotas {
		cfg.QuotaPushRate, cfg.QuotaHistorySamples, cfg.QuotaHistoryBytes = 0, 0, 0
	}
	if opts.Configure != nil {
		opts.Configure(&cfg)
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	srv, err := server.New(context.Background(), cfg, log)
	if err != nil {
		t.Fatalf("servertest: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{
		URL: "https://" + srv.HTTPSAddr(), EnrollmentSecret: srv.Secrets.EnrollmentSecret,
		AdminToken: srv.Secrets.AdminToken, CACertPEM: srv.CertPEM, Config: cfg, Srv: srv,
		t: t, cancel: cancel, done: make(chan error, 1),
	}
	if opts.HTTP {
		s.HTTPURL = "http://" + srv.HTTPAddr()
	}
	go func() { s.done <- srv.Serve(ctx) }()
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(s.CACertPEM)
	var tr http.RoundTripper = &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool}, MaxIdleConnsPerHost: 64,
	}
	if _, bench := t.(*testing.B); !bench && !opts.NoOpenAPICheck {
		check := &checkTransport{base: tr, t: t, hosts: []string{srv.HTTPSAddr()}}
		if opts.HTTP {
			check.hosts = append(check.hosts, srv.HTTPAddr())
		}
		t.Cleanup(check.close) // after Stop
		tr = check
	}
	s.client = &http.Client{Timeout: 30 * time.Second, Transport: tr}
	t.Cleanup(func() { s.Stop() })
	return s
}

// Stop shuts the server down gracefully (idempotent) and returns Serve's error.
func (s *Server) Stop() error {
	if s.cancel == nil {
		return nil
	}
	s.cancel()
	s.cancel = nil
	s.client.CloseIdleConnections()
	select {
	case err := <-s.done:
		return err
	case <-time.After(30 * time.Second):
		return fmt.Errorf("servertest: server did not stop within 30 s")
	}
}

// Client is an HTTP client that trusts the server's certificate; it checks
// requests and answers against the OpenAPI document (Options.NoOpenAPICheck).
func (s *Server) Client() *http.Client { return s.client }

// HTTPTransport is the transport under Client, for a client of its own.
func (s *Server) HTTPTransport() *http.Transport {
	if c, ok := s.client.Transport.(*checkTransport); ok {
		return c.base.(*http.Transport)
	}
	return s.client.Transport.(*http.Transport)
}

// scrape gets /metrics with the admin token, as a Prometheus given the
// credential would; any answer but 200 is an error.
func (s *Server) scrape() (*http.Response, error) {
	req, err := http.NewRequest("GET", s.URL+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+s.AdminToken)
	resp, err := s.client.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		return nil, fmt.Errorf("GET /metrics: HTTP %d", resp.StatusCode)
	}
	return resp, nil
}

// MetricsText returns the whole of /metrics.
func (s *Server) MetricsText() string {
	s.t.Helper()
	resp, err := s.scrape()
	if err != nil {
		s.t.Fatalf("servertest: metrics: %v", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		s.t.Fatalf("servertest: metrics: %v", err)
	}
	return string(b)
}

// Metric returns the value of one sample of /metrics (0 when absent).
func (s *Server) Metric(name string, labels map[string]string) float64 {
	s.t.Helper()
	return s.MetricT(s.t, name, labels)
}

// MetricT is Metric failing t, not the test that started the server (a fuzz
// target must not fail its *testing.F).
func (s *Server) MetricT(t testing.TB, name string, labels map[string]string) float64 {
	t.Helper()
	resp, err := s.scrape()
	if err != nil {
		t.Fatalf("servertest: metrics: %v", err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			continue
		}
		key, val, ok := strings.Cut(line, " ")
		if !ok || !matchSample(key, name, labels) {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
		if err != nil {
			t.Fatalf("servertest: metrics: %q: %v", line, err)
		}
		return v
	}
	return 0
}

func matchSample(key, name string, labels map[string]string) bool {
	base, rest, _ := strings.Cut(key, "{")
	if base != name {
		return false
	}
	rest = strings.TrimSuffix(rest, "}")
	have := map[string]string{}
	for _, kv := range strings.Split(rest, ",") {
		if k, v, ok := strings.Cut(kv, "="); ok {
			have[k] = strings.Trim(v, `"`)
		}
	}
	for k, v := range labels {
		if have[k] != v {
			return false
		}
	}
	return len(have) == len(labels) || labels == nil && len(have) == 0
}
