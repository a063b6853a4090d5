package server

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"
)

// ProbeURL is where a server run with cfg answers probes from the same
// host: its HTTPS listener, else its plain-HTTP one, on loopback when it
// listens on every address.
func ProbeURL(cfg Config, path string) (string, error) {
	scheme, addr := "https", cfg.Listen
	if addr == "" {
		scheme, addr = "http", cfg.HTTPListen
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("listen address %q: %w", addr, err)
	}
	if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		host = "127.0.0.1"
		if ip != nil && ip.To4() == nil {
			host = "::1"
		}
	}
	return scheme + "://" + net.JoinHostPort(host, port) + path, nil
}

// Probe asks url (a server's /healthz or /readyz) and returns nil on 200,
// else an error with the reason the server gave. It does not verify the
// certificate: it sends nothing secret and runs beside the server (a
// container's HEALTHCHECK), where the certificate names another host.
func Probe(ctx context.Context, url string) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "GET", url, nil)
	if err != nil {
		return err
	}
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	defer client.CloseIdleConnections()
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var body struct{ Status, Reason string }
	json.NewDecoder(io.LimitReader(resp.Body, 4096)).Decode(&body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: HTTP %d %s %s", url, resp.StatusCode, body.Status, body.Reason)
	}
	return nil
}
