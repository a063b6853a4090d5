package main

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// seamServer is a real `drover serve` on a fresh data directory with an
// HTTPS client trusting it.
type seamServer struct {
	base, addr, cert, secret, admin string
	c                               *http.Client
	roots                           *x509.CertPool
}

func startSeamServer(t *testing.T) *seamServer {
	t.Helper()
	data := t.TempDir()
	p := startServe(t, data)
	sec := readSecrets(t, data)
	s := &seamServer{addr: p.addr, base: "https://" + p.addr, cert: caFile(data), secret: sec.Enroll, admin: sec.Admin}
	s.c = trustingClient(t, data, 10*time.Second)
	s.roots = s.c.Transport.(*http.Transport).TLSClientConfig.RootCAs
	return s
}

// do sends a JSON request with the admin token and decodes the answer.
func (s *seamServer) do(t *testing.T, method, path, body string, into any) int {
	t.Helper()
	req, _ := http.NewRequest(method, s.base+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+s.admin)
	resp, err := s.c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(into); err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	return resp.StatusCode
}

// Profiles × agents: an operator's PUT of the configuration a profile
// holds (as stored, reordered, re-indented) does not make the real agent
// apply it again, and its device stays synchronized.
func TestSeamProfilesAgentUnchangedConfig(t *testing.T) {
	t.Parallel()
	s := startSeamServer(t)
	dir := t.TempDir()
	applied := filepath.Join(dir, "applied.log")
	once := func() {
		t.Helper()
		cmd := exec.Command(droverBin, "agent", "--once", "--server", s.base, "--ca-cert", s.cert, "--enroll-secret", s.secret,
			"--state-dir", filepath.Join(dir, "state"), "--root", "../../internal/agent/testdata/root", "--machine-id", "seam-profile-1",
			"--device-type", "ICR-3241", "--firmware", "6.3.5", "--commands", "", "--hook", `echo "$DROVER_CONFIG_VERSION" >> `+applied)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("drover agent --once: %v\n%s", err, out)
		}
	}
	var devices struct {
		Devices []struct {
			ID        string `json:"id"`
			ProfileID string `json:"profile_id"`
			SyncState string `json:"sync_state"`
		} `json:"devices"`
	}
	device := func() (id, profile, sync string) {
		t.Helper()
		if st := s.do(t, "GET", "/api/v1/devices", "", &devices); st != 200 || len(devices.Devices) != 1 {
			t.Fatalf("devices: %d %+v", st, devices)
		}
		d := devices.Devices[0]
		return d.ID, d.ProfileID, d.SyncState
	}
	once()
	_, pid, _ := device()
	var p struct {
		Version float64 `json:"version"`
	}
	if st := s.do(t, "PUT", "/api/v1/profiles/"+pid, `{"config":{"apn":"iot","mtu":1400,"dns":["a","b"]}}`, &p); st != 200 || p.Version == 0 {
		t.Fatalf("configuration: %d %+v", st, p)
	}
	version := p.Version
	once() // applies it
	once() // reports it applied
	if _, _, sync := device(); sync != "synchronized" {
		t.Fatalf("after applying version %v the device is %s", version, sync)
	}
	for _, same := range []string{
		`{"config":{"apn":"iot","mtu":1400,"dns":["a","b"]}}`,
		`{"config":{"apn":"iot","mtu":1400,"dns":["a","b"]}}`,
		`{"config":{"dns":["a","b"],"mtu":1400,"apn":"iot"}}`,
		"{\"config\": {\n  \"mtu\": 1400,\n  \"apn\": \"iot\",\n  \"dns\": [\"a\", \"b\"]\n}}",
	} {
		if st := s.do(t, "PUT", "/api/v1/profiles/"+pid, same, &p); st != 200 || p.Version != version {
			t.Fatalf("PUT of the same configuration %s: %d, version %v, want %v", same, st, p.Version, version)
		}
	}
	if _, _, sync := device(); sync != "synchronized" {
		t.Fatalf("after unchanged PUTs the device is %s", sync)
	}
	once()
	once()
	log, err := os.ReadFile(applied)
	if err != nil {
		t.Fatal(err)
	}
	if lines := strings.Fields(string(log)); len(lines) != 1 || lines[0] != fmt.Sprint(version) {
		t.Fatalf("the agent's hook applied versions %q, want only %v", lines, version)
	}
	if _, _, sync := device(); sync != "synchronized" {
		t.Fatalf("at the end the device is %s", sync)
	}
}

// Request limits × TLS: over the real binary's HTTPS listener, a request
// declaring a body over the limit and sending two bytes is answered 413
// at once and the connection closed, on the device routes, an operator
// route and a firmware upload.
func TestSeamBodyLimitTLS(t *testing.T) {
	t.Parallel()
	s := startSeamServer(t)
	var reg struct{ Token string }
	body := fmt.Sprintf(`{"machine_id":"seam-limit-1","device_type":"ICR-3241","firmware":"6.3.5","enrollment_secret":%q}`, s.secret)
	req, _ := http.NewRequest("POST", s.base+"/api/v1/register", strings.NewReader(body))
	resp, err := s.c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	json.NewDecoder(resp.Body).Decode(&reg)
	resp.Body.Close()
	for _, tc := range []struct {
		path, token string
		length      int64
	}{
		{"/api/v1/register", "", 65537},
		{"/api/v1/register", "", 1000000},
		{"/api/v1/register", "", 99999999999},
		{"/api/v1/push", reg.Token, 65537},
		{"/api/v1/profiles/approve", s.admin, 65537},
		{"/api/v1/firmware?device_type=ICR-3241&version=7", s.admin, 99999999999},
	} {
		conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 3 * time.Second}, "tcp", s.addr, &tls.Config{RootCAs: s.roots, ServerName: "127.0.0.1"})
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		conn.SetDeadline(start.Add(5 * time.Second))
		head := fmt.Sprintf("POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n", tc.path, s.addr, tc.length)
		if tc.token != "" {
			head += "Authorization: Bearer " + tc.token + "\r\n"
		}
		io.WriteString(conn, head+"\r\n{}")
		br := bufio.NewReader(conn)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			conn.Close()
			t.Fatalf("POST %s declaring %d bytes: no answer after %s: %v", tc.path, tc.length, time.Since(start).Round(time.Millisecond), err)
		}
		b, _ := io.ReadAll(resp.Body)
		_, next := br.ReadByte()
		conn.Close()
		if resp.StatusCode != http.StatusRequestEntityTooLarge || !bytes.Contains(b, []byte(`"body_too_large"`)) || !resp.Close || !errors.Is(next, io.EOF) {
			t.Fatalf("POST %s declaring %d bytes: %d %s, Connection: close %v, then %v; want 413 body_too_large and a clean close",
				tc.path, tc.length, resp.StatusCode, b, resp.Close, next)
		}
	}
}

// Alerts × rule changes: through the real binary, disabling a rule clears
// its active alert with the documented reason, as deleting one does.
func TestSeamAlertsRuleDisable(t *testing.T) {
	t.Parallel()
	s := startSeamServer(t)
	var rule map[string]any
	if st := s.do(t, "POST", "/api/v1/alerts/rules", `{"name":"hot","kind":"temperature_above","threshold":50}`, &rule); st != 201 {
		t.Fatalf("rule: %d %v", st, rule)
	}
	var reg struct{ Token string }
	body := fmt.Sprintf(`{"machine_id":"seam-alert-1","device_type":"ICR-3241","firmware":"6.3.5","enrollment_secret":%q}`, s.secret)
	if st := call(t, s.c, s.base+"/api/v1/register", "", body, &reg); st != 200 {
		t.Fatalf("register: %d", st)
	}
	var ans map[string]any
	if st := call(t, s.c, s.base+"/api/v1/push", reg.Token, `{"seq":1,"config_version":0,"state":{"temperature":90}}`, &ans); st != 200 {
		t.Fatalf("push: %d %v", st, ans)
	}
	var alerts struct {
		Alerts []struct {
			State       string `json:"state"`
			ClearReason string `json:"clear_reason"`
		} `json:"alerts"`
		Active int `json:"active"`
	}
	if st := s.do(t, "GET", "/api/v1/alerts?state=active", "", &alerts); st != 200 || alerts.Active != 1 {
		t.Fatalf("active alerts after a hot push: %d %+v", st, alerts)
	}
	id := fmt.Sprint(rule["id"])
	if st := s.do(t, "PUT", "/api/v1/alerts/rules/"+id, `{"name":"hot","kind":"temperature_above","threshold":50,"disabled":true}`, &rule); st != 200 {
		t.Fatalf("disable: %d %v", st, rule)
	}
	if st := s.do(t, "GET", "/api/v1/alerts", "", &alerts); st != 200 || len(alerts.Alerts) != 1 || alerts.Active != 0 ||
		alerts.Alerts[0].State != "cleared" || alerts.Alerts[0].ClearReason != "rule deleted or disabled" {
		t.Fatalf("alerts after disabling the rule: %d %+v", st, alerts)
	}
}
