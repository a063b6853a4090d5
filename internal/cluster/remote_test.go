package cluster_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/drover/drover/internal/testwait"
)

// startAgent runs `drover agent --connect` against n with flags and
// returns its device ID once n holds its persistent connection.
func startAgent(t *testing.T, n *node, machine string, flags ...string) (id string, log *bytes.Buffer) {
	t.Helper()
	before := n.metric("drover_device_connections")
	root, _ := filepath.Abs("../agent/testdata/root")
	cmd := exec.Command(droverBin, append([]string{"agent", "--connect", "--allow-http", "--server", n.base, "--enroll-secret", secret,
		"--state-dir", t.TempDir(), "--machine-id", machine, "--root", root}, flags...)...)
	log = &bytes.Buffer{}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	if !testwait.Until(30*time.Second, func() bool { return n.metric("drover_device_connections") > before }) {
		t.Fatalf("the agent did not connect to %s within 30 s:\n%s", n.name, log)
	}
	_, b := n.do("GET", "/api/v1/devices?limit=1000", adminToken, "")
	var page struct {
		Devices []struct {
			ID        json.Number `json:"id"`
			MachineID string      `json:"machine_id"`
		} `json:"devices"`
	}
	json.Unmarshal(b, &page)
	for _, d := range page.Devices {
		if d.MachineID == machine {
			return d.ID.String(), log
		}
	}
	t.Fatalf("device %s not listed: %s", machine, b)
	return "", nil
}

// echoServer answers every connection with what it reads, then closes.
func echoServer(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				io.Copy(c, c)
			}()
		}
	}()
	return ln.Addr().String()
}

// A session opened through one node reaches a device connected to
// another: the node that took the request relays it to the node holding
// the device's connection, which checks, limits and audits it once.
func TestClusterRemoteRelay(t *testing.T) {
	_, _, ab := startCluster(t, "a", "b")
	a, b := ab[0], ab[1]
	echo := echoServer(t)
	dev, agentLog := startAgent(t, b, "relay-1", "--tunnel-allow", echo, "--remote-shell", "/bin/sh")
	// A device connected to no node.
	idle := a.mustRegister("relay-idle")

	// A tunnel through a: bytes both ways and the half-close.
	host := strings.TrimPrefix(a.base, "http://")
	c, err := net.Dial("tcp", host)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "GET /api/v1/devices/%s/tunnel?to=%s HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nConnection: Upgrade\r\nUpgrade: drover-tunnel\r\n\r\n", dev, echo, host, adminToken)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("tunnel through a: %v %v\n%s", resp, err, agentLog)
	}
	if got := resp.Header.Get("X-Drover-Device-Node"); got != "b" {
		t.Errorf("X-Drover-Device-Node %q, want b", got)
	}
	if got := resp.Header.Get("X-Drover-Node"); got != "a" {
		t.Errorf("X-Drover-Node %q, want a", got)
	}
	c.Write([]byte("ping-through-a"))
	c.(*net.TCPConn).CloseWrite()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	got, err := io.ReadAll(br)
	if err != nil || string(got) != "ping-through-a" {
		t.Fatalf("echo through a relayed tunnel: %q %v", got, err)
	}
	c.Close()

	// A terminal through a: a command and its exit status.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ws, _, err := websocket.Dial(ctx, "ws://"+host+"/api/v1/devices/"+dev+"/terminal?command=echo+relayed-%24((6*7))%3B+exit+5",
		&websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + adminToken}}})
	if err != nil {
		t.Fatalf("terminal through a: %v", err)
	}
	var out strings.Builder
	status := -1
	for {
		typ, m, err := ws.Read(ctx)
		if err != nil {
			break
		}
		if typ == websocket.MessageBinary {
			out.Write(m)
			continue
		}
		var e struct {
			Type   string `json:"type"`
			Status int    `json:"status"`
		}
		if json.Unmarshal(m, &e) == nil && e.Type == "exit" {
			status = e.Status
		}
	}
	if !strings.Contains(out.String(), "relayed-42") || status != 5 {
		t.Errorf("terminal through a: output %q, status %d; want relayed-42 and 5", out.String(), status)
	}

	// Refusals stay the holder's, and clear.
	for _, tc := range []struct {
		what, path, code string
		status           int
	}{
		{"a destination the device does not allow", "/api/v1/devices/" + dev + "/tunnel?to=127.0.0.1:1", "destination_not_allowed", 403},
		{"a device connected to no node", "/api/v1/devices/" + idle.DeviceID + "/tunnel?to=" + echo, "connect_requested", 409},
	} {
		st, body := a.do("GET", tc.path, adminToken, "")
		if st != tc.status || !strings.Contains(string(body), `"`+tc.code+`"`) {
			t.Errorf("%s through a: %d %s, want %d %s", tc.what, st, body, tc.status, tc.code)
		}
	}
	// The device connected to no node is asked to connect at its next
	// push, on whichever node takes it.
	within(t, converge, "the ask to connect on b", func() bool {
		st, body := b.push(idle.Token)
		return st == 200 && strings.Contains(string(body), `"connect":300`)
	})
	// A check through a is allowed as through b.
	if st, body := a.do("GET", "/api/v1/devices/"+dev+"/tunnel?to="+echo, adminToken, ""); st != 200 || !strings.Contains(string(body), `"allowed":true`) {
		t.Errorf("check through a: %d %s", st, body)
	}
	// A client cannot pass for a relay.
	req, _ := http.NewRequest("GET", b.base+"/api/v1/devices/"+dev+"/tunnel?to="+echo, nil)
	req.Header.Set("Authorization", "Bearer "+adminToken)
	req.Header.Set("X-Drover-Relay", "a "+fmt.Sprint(time.Now().Unix())+" 10.9.9.9 00")
	if resp, err := b.client.Do(req); err != nil || resp.StatusCode != 403 {
		t.Errorf("a forged relay credential: %v %v, want 403", resp, err)
	} else {
		resp.Body.Close()
	}

	// Audited once, on the node holding the device, naming the relay.
	type row struct {
		After struct {
			Via        string `json:"via"`
			Kind       string `json:"kind"`
			ToDevice   int64  `json:"bytes_to_device"`
			FromDevice int64  `json:"bytes_from_device"`
			EndReason  string `json:"end_reason"`
		} `json:"after"`
	}
	rows := func(action string) []row {
		_, body := a.do("GET", "/api/v1/audit?action="+strings.ReplaceAll(action, " ", "+"), adminToken, "")
		var r struct {
			Entries []row `json:"entries"`
		}
		json.Unmarshal(body, &r)
		return r.Entries
	}
	within(t, 10*time.Second, "the sessions' end rows", func() bool { return len(rows("tunnel end")) >= 1 && len(rows("shell end")) >= 1 })
	for _, action := range []string{"tunnel open", "tunnel end", "shell open", "shell end"} {
		rs := rows(action)
		if len(rs) != 1 || rs[0].After.Via != "a" {
			t.Errorf("%s: %d rows %+v, want one naming via a", action, len(rs), rs)
		}
	}
	if r := rows("tunnel end"); len(r) == 1 && (r[0].After.ToDevice != 14 || r[0].After.FromDevice != 14) {
		t.Errorf("tunnel end: %+v, want 14 bytes each way", r[0].After)
	}
	if n := a.metric("drover_tunnel_relayed_total"); n < 4 {
		t.Errorf("drover_tunnel_relayed_total on a: %v, want at least 4", n)
	}
	if n := a.metric("drover_tunnel_sessions"); n != 0 {
		t.Errorf("drover_tunnel_sessions on a: %v", n)
	}
}
