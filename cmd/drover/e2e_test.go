package main

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/drover/drover/internal/testwait"
)

var droverBin string

func TestMain(m *testing.M) {
	flag.Parse()
	// The parallel tests mostly wait on the servers and agents they
	// start: four at a time unless -parallel says otherwise.
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == "test.parallel" })
	if !given {
		flag.Set("test.parallel", "4")
	}
	dir, err := os.MkdirTemp("", "drover-e2e")
	if err != nil {
		panic(err)
	}
	droverBin = filepath.Join(dir, "drover") // drover-agent is built next to it
	if prebuilt := os.Getenv("DROVER_TEST_BINARY"); prebuilt != "" {
		// scripts/test.sh builds drover once for every package, stamped.
		if err := os.Symlink(prebuilt, droverBin); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	} else if err := buildStamped(droverBin); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// buildStamped builds drover stamped with the version and commit as
// scripts/release.sh does.
func buildStamped(bin string) error {
	stamp, err := exec.Command("../../scripts/version.sh").Output()
	if err != nil {
		return fmt.Errorf("scripts/version.sh: %w", err)
	}
	build := exec.Command("go", "build", "-ldflags", strings.TrimSpace(string(stamp)), "-o", bin, ".")
	build.Stderr = os.Stderr
	if err := build.Run(); err != nil {
		return fmt.Errorf("building drover: %w", err)
	}
	return nil
}

type proc struct {
	cmd    *exec.Cmd
	addr   string
	stdout *testwait.Buffer
	exited chan error
	logMu  sync.Mutex
	log    []string // stderr lines so far
}

// logged returns the server's stderr lines so far.
func (p *proc) logged() []string {
	p.logMu.Lock()
	defer p.logMu.Unlock()
	return slices.Clone(p.log)
}

var listening = regexp.MustCompile(`msg=listening proto=https addr=(\S+)`)

// startServe runs `drover serve` on a free port, with extra flags, and
// waits until it listens.
func startServe(t *testing.T, dataDir string, extra ...string) *proc {
	t.Helper()
	cmd := exec.Command(droverBin, append([]string{"serve", "--data-dir", dataDir, "--listen", "127.0.0.1:0"}, extra...)...)
	// A pipe of the test's own, not StderrPipe: Wait would close that one
	// and lose the lines written just before the process exited.
	stderr, stderrW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stderr.Close() })
	cmd.Stderr = stderrW
	p := &proc{cmd: cmd, stdout: &testwait.Buffer{}, exited: make(chan error, 1)}
	cmd.Stdout = p.stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	stderrW.Close()
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			p.logMu.Lock()
			p.log = append(p.log, sc.Text())
			p.logMu.Unlock()
			if m := listening.FindStringSubmatch(sc.Text()); m != nil {
				addr <- m[1]
			}
		}
	}()
	go func() { p.exited <- cmd.Wait() }()
	select {
	case p.addr = <-addr:
	case err := <-p.exited:
		t.Fatalf("drover serve exited early: %v", err)
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		t.Fatal("drover serve did not listen within 30 s")
	}
	t.Cleanup(func() { cmd.Process.Kill() })
	return p
}

func (p *proc) stop(t *testing.T) {
	t.Helper()
	name := filepath.Base(p.cmd.Args[0]) + " " + p.cmd.Args[1] // drover serve, drover agent, busybox sh
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-p.exited:
		if err != nil {
			t.Fatalf("%s did not exit 0 on SIGTERM: %v", name, err)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("%s did not stop within 30 s of SIGTERM", name)
	}
}

func call(t *testing.T, c *http.Client, url, token, body string, into any) int {
	t.Helper()
	method := "GET"
	var rd io.Reader
	if body != "" {
		method, rd = "POST", strings.NewReader(body)
	}
	req, _ := http.NewRequest(method, url, rd)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(into); err != nil {
		t.Fatalf("%s: %v", url, err)
	}
	return resp.StatusCode
}

// The real binary, over real HTTPS with a plain client: register, push,
// SIGTERM, restart, and everything acknowledged is still there.
func TestServeEndToEnd(t *testing.T) {
	t.Parallel()
	data := t.TempDir()
	p := startServe(t, data)
	// stdout is written before listening; the pipe may still carry it.
	testwait.Until(5*time.Second, func() bool { return strings.Contains(p.stdout.String(), "enrollment secret:") })
	var secrets struct{ EnrollmentSecret, AdminToken string }
	raw, err := os.ReadFile(filepath.Join(data, "secrets.json"))
	if err != nil {
		t.Fatal(err)
	}
	json.Unmarshal(raw, &struct {
		E *string `json:"enrollment_secret"`
		A *string `json:"admin_token"`
	}{&secrets.EnrollmentSecret, &secrets.AdminToken})
	if !strings.Contains(p.stdout.String(), secrets.EnrollmentSecret) {
		t.Fatalf("first start did not print the enrollment secret: %q", p.stdout.String())
	}
	certPEM, err := os.ReadFile(filepath.Join(data, "tls", "cert.pem"))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(certPEM)
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	base := "https://" + p.addr

	var reg struct {
		DeviceID string `json:"device_id"`
		Token    string `json:"token"`
	}
	body := fmt.Sprintf(`{"machine_id":"e2e-1","device_type":"ICR-3241","firmware":"6.3.5","enrollment_secret":%q}`, secrets.EnrollmentSecret)
	if st := call(t, c, base+"/api/v1/register", "", body, &reg); st != 200 || reg.Token == "" {
		t.Fatalf("register: %d %+v", st, reg)
	}
	for seq := 1; seq <= 5; seq++ {
		var ans map[string]any
		push := fmt.Sprintf(`{"seq":%d,"config_version":0,"state":{"cpu":%d,"uptime":%d}}`, seq, seq*10, seq*200)
		if st := call(t, c, base+"/api/v1/push", reg.Token, push, &ans); st != 200 {
			t.Fatalf("push %d: %d %v", seq, st, ans)
		}
	}
	c.CloseIdleConnections()
	p.stop(t)

	p = startServe(t, data)
	base = "https://" + p.addr
	if strings.Contains(p.stdout.String(), "enrollment secret:") {
		t.Fatal("second start printed secrets again")
	}
	var dev map[string]any
	if st := call(t, c, base+"/api/v1/devices/"+reg.DeviceID, secrets.AdminToken, "", &dev); st != 200 {
		t.Fatalf("device after restart: %d %v", st, dev)
	}
	if dev["seq"] != 5.0 || dev["state"].(map[string]any)["cpu"] != 50.0 || dev["sync_state"] != "synchronized" {
		t.Fatalf("device after restart: %v", dev)
	}
	var ans map[string]any
	if st := call(t, c, base+"/api/v1/push", reg.Token, `{"seq":6,"state":{}}`, &ans); st != 200 {
		t.Fatalf("push after restart: %d %v", st, ans)
	}
	c.CloseIdleConnections()
	p.stop(t)
}

func TestCLIErrors(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"nonsense"}, {"serve", "--no-such-flag"}, {"serve", "--persistence", "maybe"}} {
		out, err := exec.Command(droverBin, args...).CombinedOutput()
		ee, ok := err.(*exec.ExitError)
		if !ok || ee.ExitCode() == 0 || len(out) == 0 {
			t.Errorf("drover %v: err %v, output %q", args, err, out)
		}
	}
	out, err := exec.Command(droverBin, "serve", "--help").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "-persistence") || !strings.Contains(string(out), "DROVER_") {
		t.Errorf("serve --help: %v %s", err, out)
	}
}
