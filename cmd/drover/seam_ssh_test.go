package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/internal/netlab"
	"github.com/drover/drover/internal/testwait"
	"github.com/drover/drover/internal/tunnel"
)

// Port forwarding end to end with real clients on a lab of network
// namespaces: drover serve on the lab's bridge, drover agent --connect in
// the device's namespace (the router), and behind it, on a LAN of its own
// routed by the router only, a host running OpenSSH's sshd (key
// authentication, a generated host key) and BusyBox's httpd. Through
// `drover tunnel`, ssh runs a command there (the host key checked
// strictly), scp copies a file there (its SHA-256 compared), curl fetches
// a page; the command's output names the LAN host's address. drover tunnel refuses a device without the server's label, a
// viewer, a destination outside the agent's allow-list and a session over
// the limit, each with the server's message and a non-zero exit.
func TestSeamTunnelSSHThroughRouter(t *testing.T) {
	if miss := netlab.Prerequisites("sshd", "ssh", "scp", "ssh-keygen", "curl", "busybox"); miss != "" {
		t.Skip("port forwarding through a lab of network namespaces: " + miss)
	}
	netlab.CleanStale("dts")
	n, err := netlab.New(netlab.NewID("dts", 0), "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Close)
	router, err := n.AddHost("router", 2)
	if err != nil {
		t.Fatal(err)
	}
	lanHost, err := n.AddLAN(router, "lan", "", 10)
	if err != nil {
		t.Fatal(err)
	}
	sshAddr, webAddr := net.JoinHostPort(lanHost.IP, "22"), net.JoinHostPort(lanHost.IP, "80")

	// The LAN host's servers.
	dir := t.TempDir()
	os.Chmod(dir, 0o755)
	run := func(name string, args ...string) {
		t.Helper()
		if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
			t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
		}
	}
	hostKey, userKey := filepath.Join(dir, "host_key"), filepath.Join(dir, "id_ed25519")
	run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", hostKey)
	run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", userKey)
	pub, _ := os.ReadFile(userKey + ".pub")
	authorized := filepath.Join(dir, "authorized_keys")
	os.WriteFile(authorized, pub, 0o600)
	incoming := filepath.Join(dir, "incoming")
	os.Mkdir(incoming, 0o755)
	cfg := filepath.Join(dir, "sshd_config")
	os.WriteFile(cfg, []byte(fmt.Sprintf(`ListenAddress %s
HostKey %s
AuthorizedKeysFile %s
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
StrictModes no
UsePAM no
PidFile none
Subsystem sftp internal-sftp
`, sshAddr, hostKey, authorized)), 0o644)
	os.MkdirAll("/run/sshd", 0o755) // sshd's privilege separation directory
	var sshdLog bytes.Buffer
	sshd := lanHost.Command(netlab.Sbin("sshd"), "-D", "-e", "-f", cfg, "-h", hostKey)
	sshd.Stdout, sshd.Stderr = &sshdLog, &sshdLog
	if err := sshd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sshd.Process.Kill(); sshd.Wait() })
	www := filepath.Join(dir, "www")
	os.Mkdir(www, 0o755)
	os.WriteFile(filepath.Join(www, "index.html"), []byte("the camera's page\n"), 0o644)
	httpd := lanHost.Command("busybox", "httpd", "-f", "-p", webAddr, "-h", www)
	if err := httpd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { httpd.Process.Kill(); httpd.Wait() })
	testwait.For(t, 10*time.Second, "sshd and httpd listening on the LAN host", func() bool {
		out, _ := lanHost.Command("ss", "-Hltn").Output()
		return bytes.Contains(out, []byte(sshAddr)) && bytes.Contains(out, []byte(webAddr))
	})

	// The server on the bridge (its certificate names the bridge's
	// address), the agent on the router.
	r := startRemoteRigOn(t, router.Exec(), []string{"--tunnel-allow", sshAddr + "," + webAddr},
		"--listen", n.HostIP+":0", "--remote-access-labels", "remote", "--tunnel-max-per-device", "2")
	tunnelArgs := func(tok, spec string) []string {
		return []string{"tunnel", "--server", r.base, "--token", tok, "--ca-cert", r.caFile, r.dev, spec}
	}
	refused := func(what, tok, spec, want string) {
		t.Helper()
		out, err := exec.Command(droverBin, tunnelArgs(tok, spec)...).CombinedOutput()
		if err == nil || !strings.Contains(string(out), want) {
			t.Errorf("drover tunnel, %s: %v %s, want a failure saying %q", what, err, out, want)
		}
	}
	refused("a device without the label", r.operator, "0:"+sshAddr, "remote access is not enabled for device "+r.dev)
	if st := call(t, r.client, r.base+"/api/v1/labels/assign", r.admin, `{"label":"remote","filter":{}}`, &map[string]any{}); st != 200 {
		t.Fatalf("label: %d", st)
	}
	refused("a viewer", r.viewer, "0:"+sshAddr, "your role may not do this (forbidden)")
	refused("a destination outside the allow-list", r.operator, "0:"+lanHost.IP+":23", "not in this device's tunnel allow-list (destination_not_allowed)")
	pem, _ := os.ReadFile(r.caFile)
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	tc := &tunnel.Client{Server: r.base, Token: r.operator, TLS: &tls.Config{RootCAs: pool}}
	var held []net.Conn
	for range 2 {
		c, err := tc.Dial(context.Background(), r.dev, sshAddr)
		if err != nil {
			t.Fatalf("a tunnel to sshd: %v\n%s", err, r.agentLog.String())
		}
		held = append(held, c)
	}
	refused("over the limit", r.operator, "0:"+sshAddr, "(tunnel_limit)")
	for _, c := range held {
		c.Close()
	}

	forward := func(spec string) string {
		t.Helper()
		var port string
		testwait.For(t, 10*time.Second, "drover tunnel once the held sessions' slots are free", func() bool {
			cmd := exec.Command(droverBin, tunnelArgs(r.operator, spec)...)
			stdout, _ := cmd.StdoutPipe()
			cmd.Stderr = cmd.Stdout
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			line, _ := bufio.NewReader(stdout).ReadString('\n')
			m := regexp.MustCompile(`^forwarding 127\.0\.0\.1:(\d+) to `).FindStringSubmatch(line)
			if m == nil {
				cmd.Process.Kill()
				cmd.Wait()
				return false
			}
			t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
			port = m[1]
			return true
		})
		return port
	}
	sshPort, webPort := forward("0:"+sshAddr), forward("0:"+webAddr)

	// ssh and scp, the host key checked against the generated one.
	hostPub, _ := os.ReadFile(hostKey + ".pub")
	known := filepath.Join(dir, "known_hosts")
	os.WriteFile(known, []byte("[127.0.0.1]:"+sshPort+" "+string(hostPub)), 0o600)
	opts := []string{"-F", "/dev/null", "-i", userKey, "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
		"-o", "StrictHostKeyChecking=yes", "-o", "UserKnownHostsFile=" + known, "-o", "ConnectTimeout=20"}
	out, err := exec.Command("ssh", append(append([]string{"-p", sshPort}, opts...), "root@127.0.0.1", "echo ok from $(hostname -I)")...).CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "ok from "+lanHost.IP {
		t.Fatalf("ssh through the tunnel: %v %q\nsshd:\n%s\nagent:\n%s", err, out, sshdLog.String(), r.agentLog.String())
	}
	payload := make([]byte, 3<<20)
	rand.Read(payload)
	src := filepath.Join(t.TempDir(), "firmware.bin")
	os.WriteFile(src, payload, 0o644)
	if out, err := exec.Command("scp", append(append([]string{"-P", sshPort}, opts...), src, "root@127.0.0.1:"+incoming+"/")...).CombinedOutput(); err != nil {
		t.Fatalf("scp through the tunnel: %v %s\n%s", err, out, sshdLog.String())
	}
	got, err := os.ReadFile(filepath.Join(incoming, "firmware.bin"))
	if err != nil || sha256.Sum256(got) != sha256.Sum256(payload) {
		t.Fatalf("the file scp copied: %d bytes of %d, %v", len(got), len(payload), err)
	}

	// curl through the other tunnel.
	out, err = exec.Command("curl", "-sS", "--max-time", "20", "http://127.0.0.1:"+webPort+"/index.html").CombinedOutput()
	if err != nil || string(out) != "the camera's page\n" {
		t.Fatalf("curl through the tunnel: %v %q", err, out)
	}
}
