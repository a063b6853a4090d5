package perf

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/drover/drover/internal/netlab"
	"github.com/drover/drover/internal/testwait"
)

// Load machines as hosts of their own: the server in one network
// namespace, two `drover perf worker`s in two others, the coordinator (this
// test) in the root namespace. The merged counts must equal the server's
// counters, and each load machine's own link must have carried its share.
func TestWorkersOnNetnsHosts(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts servers")
	}
	if miss := netlab.Prerequisites(); miss != "" {
		t.Skip("load machines in network namespaces need: " + miss)
	}
	netlab.CleanStale("dpw")
	nw, err := netlab.New(netlab.NewID("dpw", 0), "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nw.Close)
	srvHost, err := nw.AddHost("srv", 2)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	const secret, admin = "netns-enroll-secret", "netns-admin-token"
	start := func(h *netlab.Host, name string, args ...string) {
		cmd := h.Command(droverBin, args...)
		out := &testwait.Buffer{}
		cmd.Stdout, cmd.Stderr = out, out
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			cmd.Process.Signal(syscall.SIGTERM)
			done := make(chan struct{})
			go func() { cmd.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(20 * time.Second):
				cmd.Process.Kill()
				<-done
			}
			if t.Failed() {
				t.Logf("%s:\n%s", name, tailOf(out.String()))
			}
		})
	}
	start(srvHost, "server", "serve", "--data-dir", filepath.Join(dir, "server"), "--listen=", "--http-listen", srvHost.IP+":8080",
		"--enrollment-secret", secret, "--admin-token", admin, "--log-format", "json",
		"--quota-push-rate", "0", "--quota-history-samples", "0", "--quota-history-bytes", "0")
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte(testWorkerToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var loads []*netlab.Host
	var addrs []string
	for i := 1; i <= 2; i++ {
		h, err := nw.AddHost(fmt.Sprintf("load%d", i), 10+i)
		if err != nil {
			t.Fatal(err)
		}
		start(h, h.NS, "perf", "worker", "--listen", h.IP+":7070", "--token-file", tokenFile, "--work-dir", dir)
		loads, addrs = append(loads, h), append(addrs, h.IP+":7070")
	}
	for _, a := range append([]string{srvHost.IP + ":8080"}, addrs...) {
		if err := netlab.WaitTCP(a, 30*time.Second); err != nil {
			t.Fatalf("%s: %v", a, err)
		}
	}
	// A worker refuses a request without the token (its flag is required
	// too: TestPerfWorkerNeedsToken in cmd/drover).
	if _, err := newLoadPool(context.Background(), addrs[:1], "not-the-token-0123456789", 5*time.Second); err == nil || !strings.Contains(err.Error(), "401") {
		t.Errorf("the wrong token: %v, want HTTP 401", err)
	}

	base := "http://" + srvHost.IP + ":8080"
	pushes := serverCounter(t, base, admin, "drover_pushes_total", "accepted")
	regs := serverCounter(t, base, admin, "drover_registrations_total", "new")
	loadBytes := []int64{loads[0].Bytes(), loads[1].Bytes()}
	p, _ := Lookup("Bench-6-noSSL")
	o := testOptions(t, override{Devices: 400, Threads: 6})
	o.ServerCmd, o.URL, o.EnrollmentSecret, o.AdminToken = nil, base, secret, admin
	o.Workers, o.WorkerToken, o.WorkerTimeout = addrs, testWorkerToken, 20*time.Second
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r, err := Run(ctx, p, o)
	if err != nil {
		t.Fatal(err)
	}
	checkSplit(t, r, 400, 10, addrs,
		serverCounter(t, base, admin, "drover_pushes_total", "accepted")-pushes,
		serverCounter(t, base, admin, "drover_registrations_total", "new")-regs)
	// Each load machine sent its share of 4,000 pushes from its own
	// address: at least 100 KB over its own link.
	for i, h := range loads {
		if d := h.Bytes() - loadBytes[i]; d < 100_000 {
			t.Errorf("load machine %s carried %d bytes: the load did not come from it", h.IP, d)
		}
	}
	if md := markdownOf(r); !strings.Contains(md, addrs[0]) || !strings.Contains(md, addrs[1]) {
		t.Error("the protocol does not name the load machines")
	}
}

func tailOf(s string) string {
	if len(s) > 4000 {
		return "…" + s[len(s)-4000:]
	}
	return s
}
