package main

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// The tunnels × persistent connection seam, through the real binaries:
// `drover serve`, `drover agent --connect --tunnel-allow` and `drover
// tunnel`, with an HTTP server on loopback as the host on the device's
// LAN. An operator's requests reach it through the forwarded port; a
// viewer and a destination outside the agent's allow-list are refused by
// drover tunnel with a clear message and a non-zero exit; the audit log
// holds each session.
func TestSeamTunnelAgentConnect(t *testing.T) {
	lan := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello from the LAN: %s", r.URL.Path)
	}))
	defer lan.Close()
	lanAddr := strings.TrimPrefix(lan.URL, "http://")
	_, lanPort, _ := net.SplitHostPort(lanAddr)

	r := startTunnelRig(t, "127.0.0.1:"+lanPort, "--tunnel-max-per-device", "4")
	base, caFile, dev, operator, viewer, agentLog := r.base, r.caFile, r.dev, r.operator, r.viewer, r.agentLog
	api := func(path, body string, into any) int {
		t.Helper()
		return call(t, r.client, base+path, r.admin, body, into)
	}

	tunnelArgs := func(tok, spec string) []string {
		return []string{"tunnel", "--server", base, "--token", tok, "--ca-cert", caFile, dev, spec}
	}
	// Refusals: exit code and message.
	for _, tc := range []struct{ tok, spec, want string }{
		{viewer, "0:" + lanAddr, "your role may not do this (forbidden)"},
		{operator, "0:127.0.0.1:1", "not in this device's tunnel allow-list (destination_not_allowed)"},
		{operator, "0:nohost", "is not HOST:PORT"},
	} {
		out, err := exec.Command(droverBin, tunnelArgs(tc.tok, tc.spec)...).CombinedOutput()
		if err == nil || !strings.Contains(string(out), tc.want) {
			t.Errorf("drover tunnel %s: %v %s, want a failure saying %q", tc.spec, err, out, tc.want)
		}
	}

	// The operator's tunnel: two HTTP requests on two connections.
	tun := exec.Command(droverBin, tunnelArgs(operator, "0:"+lanAddr)...)
	stdout, _ := tun.StdoutPipe()
	var tunErr bytes.Buffer
	tun.Stderr = &tunErr
	if err := tun.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tun.Process.Kill(); tun.Wait() })
	line, err := bufio.NewReader(stdout).ReadString('\n')
	m := regexp.MustCompile(`^forwarding (\S+) to `).FindStringSubmatch(line)
	if err != nil || m == nil {
		t.Fatalf("drover tunnel: %q %v %s", line, err, tunErr.String())
	}
	local := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	for _, path := range []string{"/one", "/two"} {
		resp, err := local.Get("http://" + m[1] + path)
		if err != nil {
			t.Fatalf("GET through the tunnel: %v\n%s\n%s", err, tunErr.String(), agentLog.String())
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(b) != "hello from the LAN: "+path {
			t.Fatalf("through the tunnel: %q", b)
		}
	}
	var audit struct {
		Entries []struct {
			Actor, Object string
			After         map[string]any
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for api("/api/v1/audit?action=tunnel+end", "", &audit) == 200 && len(audit.Entries) < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("audit rows of the sessions' ends: %+v", audit)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, e := range audit.Entries {
		if e.Actor != "olga" || e.Object != "/api/v1/devices/"+dev || e.After["destination"] != lanAddr ||
			e.After["bytes_to_device"].(float64) == 0 || e.After["bytes_from_device"].(float64) == 0 || e.After["end_reason"] != "closed" {
			t.Errorf("audit row %+v", e)
		}
	}
}

// tunnelRig is a real drover serve and a real drover agent --connect with
// an allow-list, and an operator's and a viewer's tokens.
type tunnelRig struct {
	data                    string
	serve                   *proc
	base, caFile, dev       string
	admin, operator, viewer string
	client                  *http.Client
	agent                   *exec.Cmd
	agentLog                *bytes.Buffer
}

func startTunnelRig(t *testing.T, allow string, serveFlags ...string) *tunnelRig {
	t.Helper()
	return startRemoteRig(t, []string{"--tunnel-allow", allow}, serveFlags...)
}

// startRemoteRig is startTunnelRig with the agent's remote access flags
// given whole; the rig's data directory is its serve's.
func startRemoteRig(t *testing.T, agentFlags []string, serveFlags ...string) *tunnelRig {
	t.Helper()
	return startRemoteRigOn(t, nil, agentFlags, serveFlags...)
}

// startRemoteRigOn is startRemoteRig with the agent run by the command
// prefix on (a network namespace's ip netns exec; nil: here).
func startRemoteRigOn(t *testing.T, on []string, agentFlags []string, serveFlags ...string) *tunnelRig {
	t.Helper()
	data := t.TempDir()
	p := startServe(t, data, serveFlags...)
	base := "https://" + p.addr
	var secrets struct {
		Enroll string `json:"enrollment_secret"`
		Admin  string `json:"admin_token"`
	}
	raw, err := os.ReadFile(filepath.Join(data, "secrets.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &secrets); err != nil || secrets.Admin == "" {
		t.Fatalf("secrets.json: %v", err)
	}
	caFile := filepath.Join(data, "tls", "cert.pem")
	certPEM, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(certPEM)
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	t.Cleanup(c.CloseIdleConnections)
	api := func(path, body string, into any) int {
		t.Helper()
		return call(t, c, base+path, secrets.Admin, body, into)
	}
	token := func(name, role string) string {
		if st := api("/api/v1/users", fmt.Sprintf(`{"name":%q,"role":%q}`, name, role), &map[string]any{}); st != 201 {
			t.Fatalf("user %s: %d", name, st)
		}
		var tok struct{ Token string }
		if st := api("/api/v1/tokens", fmt.Sprintf(`{"user":%q,"name":"cli"}`, name), &tok); st != 201 {
			t.Fatalf("token %s: %d", name, st)
		}
		return tok.Token
	}
	operator, viewer := token("olga", "operator"), token("vera", "viewer")

	dir := t.TempDir()
	root, _ := filepath.Abs("../../internal/agent/testdata/root")
	agentArgs := append(append(on[:len(on):len(on)], droverBin), "agent", "--connect", "--server", base, "--enroll-secret", secrets.Enroll, "--ca-cert", caFile,
		"--state-dir", filepath.Join(dir, "state"), "--machine-id", "seam-tunnel", "--root", root)
	agentCmd := exec.Command(agentArgs[0], append(agentArgs[1:], agentFlags...)...)
	agentLog := &bytes.Buffer{}
	agentCmd.Stdout, agentCmd.Stderr = agentLog, agentLog
	if err := agentCmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { agentCmd.Process.Kill(); agentCmd.Wait() })
	connected := regexp.MustCompile(`(?m)^drover_device_connections 1$`)
	deadline := time.Now().Add(30 * time.Second)
	for {
		req, _ := http.NewRequest("GET", base+"/metrics", nil)
		req.Header.Set("Authorization", "Bearer "+secrets.Admin)
		if resp, err := c.Do(req); err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if connected.Match(b) {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the agent did not connect within 30 s:\n%s", agentLog.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	var devices struct {
		Devices []struct{ ID string }
	}
	if st := api("/api/v1/devices", "", &devices); st != 200 || len(devices.Devices) != 1 {
		t.Fatalf("devices: %d %+v", st, devices)
	}
	return &tunnelRig{data: data, serve: p, base: base, caFile: caFile, dev: devices.Devices[0].ID, admin: secrets.Admin,
		operator: operator, viewer: viewer, client: c, agent: agentCmd, agentLog: agentLog}
}
