package clustertest

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/drover/drover/internal/emulator/results"
	drover "github.com/drover/drover/internal/fleet"
	"github.com/drover/drover/internal/netlab"
	"github.com/drover/drover/internal/store/dbtest"
	"github.com/drover/drover/internal/store/postgres"
	"github.com/drover/drover/internal/testwait"
)

// The lab: every host is a network namespace with one veth on a bridge in
// the root namespace. The root namespace holds the bridge address (.1),
// HAProxy and the emulator; PostgreSQL (.2), NATS (.3) and the nodes
// (.11, .12, …) have hosts of their own, so that each one's traffic is
// its veth's counters.

const (
	secret     = "cluster-enroll-secret"
	adminToken = "cluster-admin-token"
	maxHosts   = 6 // db, nats and at most 4 nodes: a bounded number of namespaces per run
)

var (
	droverBin string
	labSeq    atomic.Int32
)

func TestMain(m *testing.M) {
	if missing := prerequisites(); missing != "" {
		fmt.Fprintln(os.Stderr, "clustertest: "+missing+": tests will skip")
		os.Exit(m.Run())
	}
	bin, dir, err := dbtest.BuildDrover("drover-clustertest")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	droverBin = bin
	cleanStale()
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

var skipReason string

// prerequisites names what is missing ("" when nothing).
func prerequisites() string {
	skipReason = netlab.Prerequisites("haproxy", "nats-server", "setpriv")
	if skipReason != "" {
		skipReason += " (Debian: iproute2, haproxy, nats-server, util-linux; scripts/test.sh installs them)"
	}
	return skipReason
}

func need(t testing.TB) {
	t.Helper()
	if skipReason != "" {
		if os.Getenv("CI") == "true" {
			t.Fatalf("clustertest needs: %s (CI never skips)", skipReason)
		}
		t.Skip("clustertest needs: " + skipReason)
	}
}

func sbin(name string) string { return netlab.Sbin(name) }

// cleanStale removes namespaces, veths and bridges of earlier runs whose
// process is gone (a run killed before its cleanup).
func cleanStale() { netlab.CleanStale("dct") }

// host is one network namespace.
type host = netlab.Host

// ---- the lab ----

type lab struct {
	t       testing.TB
	id      string // dct<pid><letter>: prefix of every namespace and link of this lab
	net     string // the /24, as "10.X.Y"
	hostIP  string // the bridge's address: HAProxy and the emulator
	dir     string
	cert    string // one certificate (and key) for every node: TLS passes through HAProxy
	key     string
	pool    *x509.CertPool
	cluster bool // drover serve has --cluster
	// ticketKeys, when set before startNodes, is a --tls-ticket-keys file
	// every node gets: a device's session resumes on any node.
	ticketKeys string

	nw     *netlab.Net
	dbHost *host
	pg     *dbtest.Server
	dsn    string

	natsHost *host
	nats     *exec.Cmd
	natsURL  string

	nodes []*node

	lbPort  int
	lbURL   string
	lbAdmin string // HAProxy's runtime API socket
	haproxy *exec.Cmd
	lbLog   *testwait.Buffer
}

// newLab sets up the network, PostgreSQL and NATS; nodes and HAProxy come
// with startNodes. Everything is undone when the test ends, also on
// failure.
func newLab(t testing.TB) *lab {
	t.Helper()
	need(t)
	l := &lab{t: t, id: netlab.NewID("dct", int(labSeq.Add(1))), dir: t.TempDir()}
	nw, err := netlab.New(l.id, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nw.Close)
	l.nw, l.net, l.hostIP = nw, nw.Subnet, nw.HostIP
	help, _ := exec.Command(droverBin, "serve", "--help").CombinedOutput()
	l.cluster = bytes.Contains(help, []byte("-cluster"))
	l.makeCert()

	l.dbHost = l.addHost("db", 2)
	l.pg, err = dbtest.StartPostgres(dbtest.Options{Host: l.dbHost.IP, Clients: l.net + ".0/24", Wrap: l.dbHost.Exec()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.pg.Close() })
	l.dsn = l.pg.NewDB(t)

	l.natsHost = l.addHost("nats", 3)
	l.startNATS()
	return l
}

// addHost makes namespace <id>-<name> with address <net>.<octet>.
func (l *lab) addHost(name string, octet int) *host {
	l.t.Helper()
	if l.nw.Hosts() >= maxHosts {
		l.t.Fatalf("more than %d hosts", maxHosts)
	}
	h, err := l.nw.AddHost(name, octet)
	if err != nil {
		l.t.Fatal(err)
	}
	return h
}

func (l *lab) makeCert() {
	l.t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		l.t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "drover cluster test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true, IsCA: true,
	}
	for i := 1; i < 30; i++ {
		tmpl.IPAddresses = append(tmpl.IPAddresses, net.ParseIP(fmt.Sprintf("%s.%d", l.net, i)))
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		l.t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		l.t.Fatal(err)
	}
	l.cert, l.key = filepath.Join(l.dir, "cert.pem"), filepath.Join(l.dir, "key.pem")
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	if err := os.WriteFile(l.cert, certPEM, 0o644); err != nil {
		l.t.Fatal(err)
	}
	if err := os.WriteFile(l.key, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		l.t.Fatal(err)
	}
	l.pool = x509.NewCertPool()
	l.pool.AppendCertsFromPEM(certPEM)
}

func (l *lab) startNATS() {
	l.t.Helper()
	h := l.natsHost
	args := append(h.Exec(), sbin("nats-server"), "-a", h.IP, "-p", "4222", "-js", "-sd", filepath.Join(l.dir, "nats"))
	cmd := exec.Command(args[0], args[1:]...)
	log := &testwait.Buffer{}
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		l.t.Fatal(err)
	}
	l.t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGCONT)
		cmd.Process.Kill()
		cmd.Wait()
	})
	l.nats, l.natsURL = cmd, "nats://"+h.IP+":4222"
	if err := waitTCP(h.IP+":4222", 30*time.Second); err != nil {
		l.t.Fatalf("nats-server: %v\n%s", err, log)
	}
}

func waitTCP(addr string, limit time.Duration) error { return netlab.WaitTCP(addr, limit) }

// ---- nodes ----

func tail(s string) string {
	if len(s) > 3000 {
		return "…" + s[len(s)-3000:]
	}
	return s
}

// node is one drover serve on a host of its own.
type node struct {
	name   string
	host   *host
	data   string
	url    string
	bin    string // the drover binary it runs; empty: the one under test
	cmd    *exec.Cmd
	log    *testwait.Buffer
	exited chan error
}

// startNodes starts n nodes (each on a new host) and HAProxy in front.
func (l *lab) startNodes(n int) {
	l.t.Helper()
	if n > 1 && !l.cluster {
		l.t.Fatalf("%d nodes need drover serve --cluster, which this build lacks", n)
	}
	for i := range n {
		name := fmt.Sprintf("n%d", i+1)
		nd := &node{name: name, host: l.addHost(name, 11+i), data: filepath.Join(l.dir, name)}
		nd.url = "https://" + nd.host.IP + ":8443"
		l.nodes = append(l.nodes, nd)
	}
	for _, nd := range l.nodes {
		l.start(nd)
	}
	l.startHAProxy()
}

// start (re)starts nd and waits until it is ready.
func (l *lab) start(nd *node) {
	l.t.Helper()
	bin := nd.bin
	if bin == "" {
		bin = droverBin
	}
	args := append(nd.host.Exec(), bin, "serve", "--data-dir", nd.data, "--listen", nd.host.IP+":8443",
		"--db", l.dsn, "--persistence", "write-through", "--node-name", nd.name,
		"--tls-cert", l.cert, "--tls-key", l.key, "--enrollment-secret", secret, "--admin-token", adminToken,
		"--quota-push-rate", "0", "--quota-history-samples", "0", "--quota-history-bytes", "0",
		// Every request comes from HAProxy's address (docs/cluster.md).
		"--register-rate-exempt", l.hostIP, "--shutdown-timeout", "10s")
	if l.cluster {
		args = append(args, "--cluster", "--nats-url", l.natsURL)
	}
	if l.ticketKeys != "" {
		args = append(args, "--tls-ticket-keys", l.ticketKeys)
	}
	cmd := exec.Command(args[0], args[1:]...)
	nd.log = &testwait.Buffer{}
	cmd.Stdout, cmd.Stderr = nd.log, nd.log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		l.t.Fatal(err)
	}
	nd.cmd, nd.exited = cmd, make(chan error, 1)
	go func() { nd.exited <- cmd.Wait() }()
	l.t.Cleanup(func() { cmd.Process.Kill() })
	if !testwait.Until(60*time.Second, func() bool {
		if st, _, _ := l.get(nd, "/readyz", ""); st == 200 {
			return true
		}
		select {
		case err := <-nd.exited:
			nd.exited <- err
			l.t.Fatalf("node %s exited: %v\n%s", nd.name, err, tail(nd.log.String()))
		default:
		}
		return false
	}) {
		l.t.Fatalf("node %s not ready within 60 s\n%s", nd.name, tail(nd.log.String()))
	}
}

// kill ends nd with SIGKILL.
func (l *lab) kill(nd *node) {
	nd.cmd.Process.Signal(syscall.SIGKILL)
	err := <-nd.exited
	nd.exited <- err
}

// ---- HAProxy ----

var serverLine = regexp.MustCompile(`(?m)^(\s*)server node1 \S+(.*)\n`)
var otherServer = regexp.MustCompile(`(?m)^\s*server node[2-9] .*\n`)

// haproxyConfig is deploy/haproxy/drover.cfg with the lab's addresses: its
// bind address, its nodes in place of node1…node3, no syslog.
func (l *lab) haproxyConfig() string {
	l.t.Helper()
	b, err := os.ReadFile("../../deploy/haproxy/drover.cfg")
	if err != nil {
		l.t.Fatal(err)
	}
	cfg := otherServer.ReplaceAllString(string(b), "")
	cfg = serverLine.ReplaceAllStringFunc(cfg, func(m string) string {
		sm := serverLine.FindStringSubmatch(m)
		var out strings.Builder
		for _, nd := range l.nodes {
			fmt.Fprintf(&out, "%sserver %s %s:8443%s\n", sm[1], nd.name, nd.host.IP, sm[2])
		}
		return out.String()
	})
	n := strings.Count(cfg, "bind :8443")
	cfg = strings.Replace(cfg, "bind :8443", fmt.Sprintf("bind %s:%d", l.hostIP, l.lbPort), 1)
	cfg = regexp.MustCompile(`(?m)^\s*log /dev/log.*\n`).ReplaceAllString(cfg, "")
	cfg = regexp.MustCompile(`maxconn \d+`).ReplaceAllString(cfg, "maxconn 8000") // within the test's file limit
	l.lbAdmin = filepath.Join(l.dir, "haproxy.sock")
	cfg = strings.Replace(cfg, "stats socket /run/haproxy/admin.sock", "stats socket "+l.lbAdmin, 1)
	if n != 1 || !strings.Contains(cfg, "server n1 ") || !strings.Contains(cfg, l.lbAdmin) {
		l.t.Fatalf("deploy/haproxy/drover.cfg: want one `bind :8443`, `server node1 …` and `stats socket /run/haproxy/admin.sock` lines:\n%s", b)
	}
	return cfg
}

func (l *lab) startHAProxy() {
	l.t.Helper()
	ln, err := net.Listen("tcp", l.hostIP+":0")
	if err != nil {
		l.t.Fatal(err)
	}
	l.lbPort = ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	l.lbURL = fmt.Sprintf("https://%s:%d", l.hostIP, l.lbPort)
	path := filepath.Join(l.dir, "haproxy.cfg")
	if err := os.WriteFile(path, []byte(l.haproxyConfig()), 0o644); err != nil {
		l.t.Fatal(err)
	}
	cmd := exec.Command(sbin("haproxy"), "-db", "-f", path)
	l.lbLog = &testwait.Buffer{}
	cmd.Stdout, cmd.Stderr = l.lbLog, l.lbLog
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		l.t.Fatal(err)
	}
	l.haproxy = cmd
	l.t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		if l.t.Failed() {
			l.t.Logf("HAProxy's log:\n%s", tail(l.lbLog.String()))
			for _, nd := range l.nodes {
				l.t.Logf("node %s's log:\n%s", nd.name, tail(nd.log.String()))
			}
		}
	})
	if err := waitTCP(fmt.Sprintf("%s:%d", l.hostIP, l.lbPort), 30*time.Second); err != nil {
		l.t.Fatalf("haproxy: %v\n%s", err, l.lbLog)
	}
	// Wait until its first health checks found every node up.
	seen := map[string]bool{}
	if !testwait.Until(30*time.Second, func() bool {
		if st, node, _, _ := l.do(l.lbURL, "GET", "/readyz", "", ""); st == 200 {
			seen[node] = true
		}
		return len(seen) == len(l.nodes)
	}) {
		l.t.Fatalf("through HAProxy only %v of %d nodes answered within 30 s\n%s", seen, len(l.nodes), l.lbLog)
	}
}

// ---- HTTP ----

// client opens a new connection per request, as the fleet does.
func (l *lab) client() *http.Client {
	return &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: l.pool}, DisableKeepAlives: true,
	}}
}

// do sends one request to base; status 0 means no answer.
func (l *lab) do(base, method, path, token, body string) (status int, node string, b []byte, retryAfter string) {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, base+path, rd)
	if err != nil {
		l.t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := l.client().Do(req)
	if err != nil {
		return 0, "", []byte(err.Error()), ""
	}
	defer resp.Body.Close()
	b, _ = io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("X-Drover-Node"), b, resp.Header.Get("Retry-After")
}

func (l *lab) get(nd *node, path, token string) (int, string, []byte) {
	st, node, b, _ := l.do(nd.url, "GET", path, token, "")
	return st, node, b
}

// accepted reads drover_pushes_total{outcome="accepted"} of nd.
func (l *lab) accepted(nd *node) (int64, error) {
	return l.sample(nd, `drover_pushes_total{outcome="accepted"}`)
}

// sample reads one sample of nd's /metrics (0 when absent).
func (l *lab) sample(nd *node, name string) (int64, error) {
	st, _, b := l.get(nd, "/metrics", adminToken)
	if st != 200 {
		return 0, fmt.Errorf("metrics of %s: %d %s", nd.name, st, b)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return int64(f), err
		}
	}
	return 0, nil
}

// metric is sample, failing the test when /metrics does not answer.
func (l *lab) metric(nd *node, name string) int64 {
	l.t.Helper()
	v, err := l.sample(nd, name)
	if err != nil {
		l.t.Fatal(err)
	}
	return v
}

// ---- the emulator ----

// emulation is a drover emulate run through HAProxy.
type emulation struct {
	cmd  *exec.Cmd
	out  string
	acks string
	log  *testwait.Buffer
	done chan error
}

// emulate starts drover emulate on the fleet of devices devices (the
// credentials file keeps tokens and sequence numbers between runs).
func (l *lab) emulate(devices int, args ...string) *emulation {
	l.t.Helper()
	e := &emulation{out: filepath.Join(l.dir, fmt.Sprintf("emulate-%d.jsonl", time.Now().UnixNano())), log: &testwait.Buffer{}, done: make(chan error, 1)}
	e.acks = e.out + ".acks"
	all := append([]string{"emulate", "--target", l.lbURL, "--ca-cert", l.cert, "--secret", secret,
		"--devices", strconv.Itoa(devices), "--seed", l.id, "--credentials", filepath.Join(l.dir, "creds.jsonl"),
		"--out", e.out, "--acks", e.acks, "--progress", "log", "--log-every", "5s"}, args...)
	e.cmd = exec.Command(droverBin, all...)
	e.cmd.Stdout, e.cmd.Stderr = e.log, e.log
	e.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := e.cmd.Start(); err != nil {
		l.t.Fatal(err)
	}
	l.t.Cleanup(func() { e.cmd.Process.Kill() })
	go func() { e.done <- e.cmd.Wait() }()
	return e
}

// ack is one line of --acks.
type ack struct {
	DeviceID string `json:"device_id"`
	Seq      int64  `json:"seq"`
	Node     string `json:"node"`
	AtMS     int64  `json:"at_ms"`
}

// wait waits for the run and returns its summary and acknowledged pushes.
func (e *emulation) wait(t testing.TB) (*results.Summary, []ack) {
	t.Helper()
	select {
	case err := <-e.done:
		if err != nil {
			t.Fatalf("drover emulate: %v\n%s", err, tail(e.log.String()))
		}
	case <-time.After(5 * time.Minute):
		e.cmd.Process.Kill()
		t.Fatalf("drover emulate did not end within 5 minutes\n%s", tail(e.log.String()))
	}
	f, err := os.Open(e.out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var s results.Stream
	if err := s.Read(f); err != nil || len(s.Summaries) != 1 {
		t.Fatalf("result stream: %v, %d summaries", err, len(s.Summaries))
	}
	b, err := os.ReadFile(e.acks)
	if err != nil {
		t.Fatal(err)
	}
	var acks []ack
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		var a ack
		if err := json.Unmarshal(sc.Bytes(), &a); err != nil {
			t.Fatalf("acks line %q: %v", sc.Text(), err)
		}
		acks = append(acks, a)
	}
	return s.Summaries[0], acks
}

// register registers the fleet through HAProxy (closed loop, kept-alive
// connections) and fails unless every device got its token.
func (l *lab) register(devices int) {
	l.t.Helper()
	sum, _ := l.emulate(devices, "--mode", "benchmark", "--loops", "0", "--workers", "16", "--conn", "keepalive").wait(l.t)
	if reg := sum.Op(results.OpRegister); reg.Accepted != int64(devices) {
		l.t.Fatalf("registration: %+v", reg.Counts)
	}
}

// ---- the database ----

func (l *lab) db(ctx context.Context) *pgx.Conn {
	l.t.Helper()
	c, err := pgx.Connect(ctx, l.dsn)
	if err != nil {
		l.t.Fatal(err)
	}
	return c
}

type pushKey struct {
	device string
	seq    int64
}

// stored returns every (device, seq) of the history and the sample count,
// read through the store (history rows are packed: internal/store/postgres).
func (l *lab) stored() (map[pushKey]bool, int64) {
	l.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := l.db(ctx)
	defer c.Close(ctx)
	// Every device with history, deleted ones included: a push accepted
	// just before (or, within the cluster's bound, after) a deletion on
	// another node is stored all the same.
	rows, err := c.Query(ctx, `SELECT id FROM devices UNION SELECT DISTINCT device_id FROM history UNION SELECT DISTINCT device_id FROM samples`)
	if err != nil {
		l.t.Fatal(err)
	}
	var ids []uint64
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			l.t.Fatal(err)
		}
		ids = append(ids, uint64(id))
	}
	if err := rows.Err(); err != nil {
		l.t.Fatal(err)
	}
	s, err := postgres.OpenUnlocked(ctx, l.dsn)
	if err != nil {
		l.t.Fatal(err)
	}
	defer s.Close()
	out := map[pushKey]bool{}
	var n int64
	for _, id := range ids {
		h, err := s.History(ctx, id, drover.HistoryQuery{Limit: math.MaxInt32})
		if err != nil {
			l.t.Fatal(err)
		}
		for _, m := range h {
			out[pushKey{strconv.FormatUint(id, 10), int64(m.Seq)}] = true
			n++
		}
	}
	return out, n
}

// ---- CPU ----

// cpuTicks is utime+stime of pid (with children's, when children), in
// clock ticks (1/100 s on Linux).
func cpuTicks(pid int, children bool) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state): utime is field 14, stime 15, cutime 16, cstime 17.
	var n int64
	last := 13
	if children {
		last = 15
	}
	for k := 11; k <= last && k < len(f); k++ {
		v, _ := strconv.ParseInt(f[k], 10, 64)
		n += v
	}
	return n
}

// treeTicks is the CPU of pid, its children (PostgreSQL's backends) and
// its exited children.
func treeTicks(pid int) int64 {
	n := cpuTicks(pid, true)
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		c, err := strconv.Atoi(e.Name())
		if err != nil || c == pid {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) > 1 && f[1] == strconv.Itoa(pid) {
			n += cpuTicks(c, false)
		}
	}
	return n
}
