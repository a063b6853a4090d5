// Package ctl is the operator's command-line client of the Drover operator
// API (/api/v1): each operation is one or a few HTTP requests, and its
// answer is written for people (aligned tables), for scripts (the API's
// JSON as is) or as CSV where the API exports it. It knows no flags: the
// command (`drover ctl`, cmd/drover/ctl.go) fills a Config. It speaks only
// HTTP to the server, never to the server's packages.
package ctl

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"
)

// Exit codes of `drover ctl` (docs/ctl.md). 0, 1 and 2 are every drover
// command's; the others say what the API answered.
const (
	ExitOK          = 0
	ExitFailure     = 1
	ExitUsage       = 2
	ExitNotFound    = 3 // 404
	ExitDenied      = 4 // 401 or 403: no, a wrong or a revoked token, or a role too low
	ExitConflict    = 5 // 409
	ExitWaitTimeout = 6 // a wait (commands send --wait, commands wait) ran out of time
)

// Output formats.
const (
	OutputTable = "table"
	OutputJSON  = "json"
	OutputCSV   = "csv"
)

// Config is what a Client needs.
type Config struct {
	// Server is the server's base URL, e.g. https://drover.example:8443.
	Server string
	// Token is the bearer token: a user's API token or the admin token.
	Token string
	// CACert is a PEM file of the certificate (or its CA) the server's
	// HTTPS must present, e.g. the self-signed drover-data/tls/cert.pem;
	// empty: the system's roots.
	CACert string
	// Insecure skips the verification of the server's certificate (and
	// says so on Stderr). Never the default.
	Insecure bool
	// Timeout bounds each HTTP request.
	Timeout time.Duration
	// Output is OutputTable, OutputJSON or OutputCSV.
	Output string
	Stdout io.Writer
	Stderr io.Writer
}

// DefaultConfig is the configuration before flags, environment and file.
func DefaultConfig() Config {
	return Config{Server: "https://localhost:8443", Timeout: 30 * time.Second, Output: OutputTable, Stdout: os.Stdout, Stderr: os.Stderr}
}

// Client calls the operator API.
type Client struct {
	cfg  Config
	base *url.URL
	hc   *http.Client
	// poll is the first pause between two looks of a wait; it doubles up
	// to a second.
	poll time.Duration
}

// New checks cfg and makes a client.
func New(cfg Config) (*Client, error) {
	u, err := url.Parse(strings.TrimRight(cfg.Server, "/"))
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
		return nil, UsageError{fmt.Errorf("server must be a URL such as https://drover.example:8443, not %q", cfg.Server)}
	}
	switch cfg.Output {
	case OutputTable, OutputJSON, OutputCSV:
	default:
		return nil, UsageError{fmt.Errorf("output must be table, json or csv, not %q", cfg.Output)}
	}
	if cfg.Token == "" {
		return nil, UsageError{errors.New("no API token: give --api-token, --api-token-file, DROVER_API_TOKEN or api-token in the config file")}
	}
	if cfg.Stdout == nil {
		cfg.Stdout = io.Discard
	}
	if cfg.Stderr == nil {
		cfg.Stderr = io.Discard
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if cfg.CACert != "" {
		pem, err := os.ReadFile(cfg.CACert)
		if err != nil {
			return nil, fmt.Errorf("CA certificate: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("CA certificate %s: no PEM certificate in it", cfg.CACert)
		}
		tc.RootCAs = pool
	}
	if cfg.Insecure {
		tc.InsecureSkipVerify = true
		if u.Scheme == "https" {
			fmt.Fprintf(cfg.Stderr, "warning: the certificate of %s is not verified (--insecure)\n", u.Host)
		}
	}
	if u.Scheme == "http" && !loopback(u.Hostname()) {
		fmt.Fprintf(cfg.Stderr, "warning: the token goes to %s unencrypted (http); use https\n", u.Host)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = tc
	return &Client{cfg: cfg, base: u, hc: &http.Client{Transport: tr, Timeout: cfg.Timeout}, poll: 100 * time.Millisecond}, nil
}

// loopback tells whether host is this machine.
func loopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Output is the format answers are written in (OutputTable, …).
func (c *Client) Output() string { return c.cfg.Output }

// Close releases idle connections.
func (c *Client) Close() { c.hc.CloseIdleConnections() }

// UsageError is a wrong invocation found by the library (exit code 2).
type UsageError struct{ Err error }

func (e UsageError) Error() string { return e.Err.Error() }
func (e UsageError) Unwrap() error { return e.Err }

// ExitCode is ExitUsage.
func (e UsageError) ExitCode() int { return ExitUsage }

// Error is an error answer of the API: its status and the code and
// message of its JSON body ({"error":{"code":…,"message":…}}).
type Error struct {
	Status  int
	Code    string
	Message string
	Body    []byte // as answered
}

func (e *Error) Error() string {
	msg := e.Message
	if msg == "" {
		msg = strings.TrimSpace(string(e.Body))
	}
	if msg == "" {
		msg = http.StatusText(e.Status)
	}
	code := e.Code
	if code == "" {
		code = strings.ToLower(strings.ReplaceAll(http.StatusText(e.Status), " ", "_"))
	}
	return fmt.Sprintf("%s (HTTP %d %s)", msg, e.Status, code)
}

// HTTPStatus is the answer's status.
func (e *Error) HTTPStatus() int { return e.Status }

// ExitCode is the exit code of the answer's status.
func (e *Error) ExitCode() int {
	switch e.Status {
	case http.StatusNotFound:
		return ExitNotFound
	case http.StatusUnauthorized, http.StatusForbidden:
		return ExitDenied
	case http.StatusConflict:
		return ExitConflict
	case http.StatusBadRequest, http.StatusUnprocessableEntity:
		return ExitUsage
	}
	return ExitFailure
}

// WaitTimeoutError is a wait that ran out of time (exit code 6).
type WaitTimeoutError struct{ What string }

func (e WaitTimeoutError) Error() string { return e.What }

// ExitCode is ExitWaitTimeout.
func (e WaitTimeoutError) ExitCode() int { return ExitWaitTimeout }

// Do sends one request: body, when not nil, as JSON; a status other than
// 2xx is an *Error. The answer's body is returned whole.
func (c *Client) Do(ctx context.Context, method, path string, query url.Values, body any) ([]byte, error) {
	return c.do(ctx, method, path, query, body)
}

// do sends one request; body, when not nil, is sent as JSON. A status
// other than 2xx is an *Error. The answer's body is returned whole.
func (c *Client) do(ctx context.Context, method, path string, query url.Values, body any) ([]byte, error) {
	resp, err := c.send(ctx, method, path, query, body, "")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return io.ReadAll(resp.Body)
}

// send is do without reading the answer; accept, when set, is the Accept
// header.
func (c *Client) send(ctx context.Context, method, path string, query url.Values, body any, accept string) (*http.Response, error) {
	u := *c.base
	u.Path += path
	u.RawQuery = query.Encode()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), rd)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+c.cfg.Token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if accept == "" {
		accept = "application/json"
	}
	req.Header.Set("Accept", accept)
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode/100 == 2 {
		return resp, nil
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	e := &Error{Status: resp.StatusCode, Body: raw}
	var eb struct {
		Error struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal(raw, &eb) == nil {
		e.Code, e.Message = eb.Error.Code, eb.Error.Message
	}
	return nil, e
}
