package cluster_test

// These tests run real `drover serve --cluster` processes on one throwaway
// PostgreSQL and one throwaway nats-server, on loopback ports, and check
// what docs/cluster.md promises.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/drover/drover/internal/store/dbtest"
	"github.com/drover/drover/internal/testwait"
)

var (
	droverBin string
	pg        *dbtest.Server
)

func TestMain(m *testing.M) {
	bin, dir, err := dbtest.BuildDrover("drover-clustertest")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	droverBin = bin
	code := dbtest.Main(m, map[dbtest.Kind]**dbtest.Server{dbtest.Postgres: &pg})
	os.RemoveAll(dir)
	os.Exit(code)
}

const (
	secret     = "cluster-enroll"
	adminToken = "cluster-admin-token"
)

// natsServer is a throwaway nats-server.
type natsServer struct {
	t    *testing.T
	port int
	cmd  *exec.Cmd
}

func startNATS(t *testing.T) *natsServer {
	t.Helper()
	bin, err := exec.LookPath("nats-server")
	if err != nil {
		bin = "/usr/sbin/nats-server"
		if _, err := os.Stat(bin); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatal("nats-server not installed (Debian package nats-server)")
			}
			t.Skip("nats-server not installed (Debian package nats-server; scripts/test.sh installs it)")
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	n := &natsServer{t: t, port: ln.Addr().(*net.TCPAddr).Port}
	ln.Close()
	n.cmd = exec.Command(bin, "-a", "127.0.0.1", "-p", strconv.Itoa(n.port))
	n.start()
	t.Cleanup(n.stop)
	return n
}

func (n *natsServer) url() string { return fmt.Sprintf("nats://127.0.0.1:%d", n.port) }

func (n *natsServer) start() {
	n.t.Helper()
	if n.cmd.Process != nil {
		n.cmd = exec.Command(n.cmd.Path, n.cmd.Args[1:]...)
	}
	if err := n.cmd.Start(); err != nil {
		n.t.Fatal(err)
	}
	if !testwait.Until(5*time.Second, func() bool {
		c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", n.port))
		if err == nil {
			c.Close()
		}
		return err == nil
	}) {
		n.t.Fatal("nats-server did not listen")
	}
}

func (n *natsServer) stop() {
	if n.cmd.Process != nil && n.cmd.ProcessState == nil {
		n.cmd.Process.Kill()
		n.cmd.Wait()
	}
}

// node is a running `drover serve --cluster`.
type node struct {
	t      *testing.T
	name   string
	cmd    *exec.Cmd
	base   string
	client *http.Client
	log    *bytes.Buffer
	logMu  *sync.Mutex
	exited chan error
}

var listening = regexp.MustCompile(`msg=listening proto=http addr=(\S+)`)

func startNode(t *testing.T, name, dsn, natsURL string, extra ...string) *node {
	t.Helper()
	args := append([]string{"serve", "--cluster", "--node-name", name, "--nats-url", natsURL, "--db", dsn,
		"--data-dir", t.TempDir(), "--listen", "", "--http-listen", "127.0.0.1:0", "--log-level", "debug",
		"--enrollment-secret", secret, "--admin-token", adminToken, "--push-interval", "60",
		"--quota-push-rate", "0", "--quota-history-samples", "0", "--quota-history-bytes", "0"}, extra...)
	cmd := exec.Command(droverBin, args...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	n := &node{t: t, name: name, cmd: cmd, log: &bytes.Buffer{}, logMu: &sync.Mutex{}, exited: make(chan error, 1),
		client: &http.Client{Timeout: 30 * time.Second}}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	addr := make(chan string, 1)
	scanned := make(chan struct{}) // closed once the log is read to its end
	go func() {
		defer close(scanned)
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			n.logMu.Lock()
			n.log.WriteString(sc.Text() + "\n")
			n.logMu.Unlock()
			if m := listening.FindStringSubmatch(sc.Text()); m != nil {
				addr <- m[1]
			}
		}
	}()
	go func() { n.exited <- cmd.Wait() }()
	select {
	case a := <-addr:
		n.base = "http://" + a
	case err := <-n.exited:
		select { // the last log lines
		case <-scanned:
		case <-time.After(5 * time.Second):
		}
		t.Fatalf("node %s exited early: %v\n%s", name, err, n.logs())
	case <-time.After(60 * time.Second):
		cmd.Process.Kill()
		t.Fatalf("node %s did not listen within 60 s\n%s", name, n.logs())
	}
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-n.exited:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
		}
		if t.Failed() {
			t.Logf("node %s log:\n%s", name, tail(n.logs()))
		}
	})
	return n
}

func (n *node) logs() string {
	n.logMu.Lock()
	defer n.logMu.Unlock()
	return n.log.String()
}

func tail(s string) string {
	if len(s) > 6000 {
		return "…" + s[len(s)-6000:]
	}
	return s
}

func (n *node) do(method, path, token, body string) (int, []byte) {
	n.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, n.base+path, rd)
	if err != nil {
		n.t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := n.client.Do(req)
	if err != nil {
		n.t.Fatalf("%s %s on %s: %v", method, path, n.name, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

type registration struct {
	DeviceID  string `json:"device_id"`
	Token     string `json:"token"`
	DeviceKey string `json:"device_key"`
}

func (n *node) register(machine, key string) (int, registration) {
	n.t.Helper()
	body := fmt.Sprintf(`{"machine_id":%q,"device_type":"ICR-3241","firmware":"6.3.5","enrollment_secret":%q}`, machine, secret)
	if key != "" {
		body = fmt.Sprintf(`{"machine_id":%q,"device_type":"ICR-3241","firmware":"6.3.5","device_key":%q}`, machine, key)
	}
	st, b := n.do("POST", "/api/v1/register", "", body)
	var r registration
	if st == 200 {
		if err := json.Unmarshal(b, &r); err != nil {
			n.t.Fatalf("register answer %s: %v", b, err)
		}
	}
	return st, r
}

func (n *node) mustRegister(machine string) registration {
	n.t.Helper()
	st, r := n.register(machine, "")
	if st != 200 || r.Token == "" {
		n.t.Fatalf("register %s on %s: %d", machine, n.name, st)
	}
	return r
}

var seq = map[string]int{}
var seqMu sync.Mutex

func (n *node) push(token string) (int, []byte) {
	n.t.Helper()
	seqMu.Lock()
	seq[token]++
	s := seq[token]
	seqMu.Unlock()
	return n.do("POST", "/api/v1/push", token, fmt.Sprintf(`{"seq":%d,"config_version":0,"state":{"uptime":%d}}`, s, 100+s))
}

func (n *node) metric(name string) float64 {
	n.t.Helper()
	_, b := n.do("GET", "/metrics", adminToken, "")
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, name+" "); ok {
			v, _ := strconv.ParseFloat(rest, 64)
			return v
		}
	}
	n.t.Fatalf("no metric %s on %s", name, n.name)
	return 0
}

// within polls cond every 20 ms and returns how long it took to hold, or
// fails after limit.
func within(t *testing.T, limit time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	if !testwait.Until(limit, cond) {
		t.Fatalf("%s: not within %v", what, limit)
	}
	return time.Since(start)
}

// converge is the bound of the issue: a change made on one node holds on
// every node within 1 s.
const converge = time.Second

// startCluster starts a fresh database, a nats-server and the named nodes
// on them.
func startCluster(t *testing.T, names ...string) (dsn string, nats *natsServer, nodes []*node) {
	t.Helper()
	dsn = dbtest.Need(t, dbtest.Postgres, pg).NewDB(t)
	nats = startNATS(t)
	for _, name := range names {
		nodes = append(nodes, startNode(t, name, dsn, nats.url()))
	}
	return dsn, nats, nodes
}

func TestCluster(t *testing.T) {
	t.Parallel()
	dsn, nats, ab := startCluster(t, "a", "b")
	a, b := ab[0], ab[1]

	t.Run("register on A, push on B", func(t *testing.T) {
		r := a.mustRegister("m-ab")
		if st, body := b.push(r.Token); st != 200 {
			t.Fatalf("push on B right after registering on A: %d %s", st, body)
		}
	})

	t.Run("a push costs other nodes no database read", func(t *testing.T) { pushesCostNoReads(t, dsn, a, b) })

	// reregisterRevokes re-registers a device on B and wants its old token
	// refused on A within the bound.
	reregisterRevokes := func(t *testing.T, machine string) {
		r := a.mustRegister(machine)
		if st, _ := a.push(r.Token); st != 200 {
			t.Fatalf("push on A: %d", st)
		}
		st, r2 := b.register(machine, r.DeviceKey)
		if st != 200 || r2.Token == "" || r2.DeviceID != r.DeviceID {
			t.Fatalf("re-register on B: %d %+v", st, r2)
		}
		took := within(t, converge, "old token refused on A", func() bool {
			st, _ := a.push(r.Token)
			return st == 401
		})
		t.Logf("old token refused on A %v after the re-registration on B", took)
		for _, n := range []*node{a, b} {
			if st, body := n.push(r2.Token); st != 200 {
				t.Fatalf("new token on %s: %d %s", n.name, st, body)
			}
			if st, _ := n.push(r.Token); st != 401 {
				t.Fatalf("old token on %s: %d", n.name, st)
			}
		}
	}
	t.Run("re-registration revokes the old token everywhere", func(t *testing.T) { reregisterRevokes(t, "m-rereg") })

	t.Run("profile change reaches every node", func(t *testing.T) {
		a.mustRegister("m-prof")
		st, body := a.do("GET", "/api/v1/profiles", adminToken, "")
		var ps struct {
			Profiles []struct {
				ID uint64 `json:"id,string"`
			} `json:"profiles"`
		}
		if st != 200 || json.Unmarshal(body, &ps) != nil || len(ps.Profiles) == 0 {
			t.Fatalf("profiles: %d %s", st, body)
		}
		id := ps.Profiles[0].ID
		st, body = a.do("PATCH", fmt.Sprintf("/api/v1/profiles/%d", id), adminToken, `{"config":{"ntp":"pool.example"}}`)
		var p struct {
			Version int64 `json:"version"`
		}
		if st != 200 || json.Unmarshal(body, &p) != nil {
			t.Fatalf("profile change: %d %s", st, body)
		}
		took := within(t, converge, "profile version on B", func() bool {
			st, body := b.do("GET", fmt.Sprintf("/api/v1/profiles/%d", id), adminToken, "")
			var q struct {
				Version int64           `json:"version"`
				Config  json.RawMessage `json:"config"`
			}
			return st == 200 && json.Unmarshal(body, &q) == nil && q.Version == p.Version && strings.Contains(string(q.Config), "pool.example")
		})
		t.Logf("profile change visible on B %v after A answered", took)
	})

	t.Run("configuration versions unique across nodes", func(t *testing.T) {
		// Two profiles, changed at once on A and B: never one version twice.
		st, body := b.do("POST", "/api/v1/register", "", fmt.Sprintf(`{"machine_id":"m-fw2","device_type":"ICR-3241","firmware":"6.3.9","enrollment_secret":%q}`, secret))
		if st != 200 {
			t.Fatalf("register: %d %s", st, body)
		}
		var ps struct {
			Profiles []struct {
				ID uint64 `json:"id,string"`
			} `json:"profiles"`
		}
		within(t, converge, "two profiles on A", func() bool {
			st, body := a.do("GET", "/api/v1/profiles", adminToken, "")
			return st == 200 && json.Unmarshal(body, &ps) == nil && len(ps.Profiles) >= 2
		})
		var mu sync.Mutex
		seen := map[int64]string{}
		var wg sync.WaitGroup
		for i, n := range []*node{a, b} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for k := range 5 {
					st, body := n.do("PATCH", fmt.Sprintf("/api/v1/profiles/%d", ps.Profiles[i].ID), adminToken, fmt.Sprintf(`{"config":{"k":%d}}`, k))
					var p struct {
						Version int64 `json:"version"`
					}
					if st != 200 || json.Unmarshal(body, &p) != nil {
						t.Errorf("profile change on %s: %d %s", n.name, st, body)
						return
					}
					mu.Lock()
					if other, dup := seen[p.Version]; dup {
						t.Errorf("version %d given on %s and %s", p.Version, other, n.name)
					}
					seen[p.Version] = n.name
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
	})

	t.Run("firmware artifacts by URL get IDs from the database", func(t *testing.T) {
		// Firmware artifacts by URL (files: TestClusterRollout) added on
		// A and on B at the same moment, they get two IDs, and every node lists both.
		add := func(n *node, version string) uint64 {
			req, _ := http.NewRequest("POST", n.base+"/api/v1/firmware", strings.NewReader(fmt.Sprintf(
				`{"device_type":"ICR-3241","version":%q,"sha256":%q,"size":1000,"url":"https://files.example/fw.bin"}`, version, strings.Repeat("ab", 32))))
			req.Header.Set("Authorization", "Bearer "+adminToken)
			req.Header.Set("Content-Type", "application/json")
			resp, err := n.client.Do(req)
			if err != nil {
				t.Error(err)
				return 0
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			var f struct {
				ID uint64 `json:"id,string"`
			}
			if resp.StatusCode != 201 || json.Unmarshal(body, &f) != nil {
				t.Errorf("firmware by URL on %s: %d %s", n.name, resp.StatusCode, body)
			}
			return f.ID
		}
		var ids [2]uint64
		var wg sync.WaitGroup
		for i, n := range []*node{a, b} {
			wg.Add(1)
			go func() { defer wg.Done(); ids[i] = add(n, fmt.Sprintf("6.4.%d", i)) }()
		}
		wg.Wait()
		if ids[0] == ids[1] {
			t.Fatalf("firmware added on A and B got one ID %d", ids[0])
		}
		for _, n := range []*node{a, b} {
			within(t, converge, "both artifacts listed on "+n.name, func() bool {
				st, body := n.do("GET", "/api/v1/firmware", adminToken, "")
				return st == 200 && strings.Contains(string(body), `"6.4.0"`) && strings.Contains(string(body), `"6.4.1"`)
			})
		}
	})

	t.Run("labels and quota lifts reach every node", func(t *testing.T) {
		r := a.mustRegister("m-label")
		st, body := a.do("POST", "/api/v1/labels/assign", adminToken, `{"label":"north","filter":{"q":"m-label"}}`)
		if st != 200 {
			t.Fatalf("assign: %d %s", st, body)
		}
		labelled := func(n *node, label string) bool {
			st, body := n.do("GET", "/api/v1/devices?label="+label, adminToken, "")
			return st == 200 && strings.Contains(string(body), `"m-label"`)
		}
		took := within(t, converge, "label on B", func() bool { return labelled(b, "north") })
		t.Logf("label visible on B %v after A answered", took)
		// A label made on B next gets its own ID, and A sees both.
		if st, body := b.do("POST", "/api/v1/labels/assign", adminToken, `{"label":"south","filter":{"q":"m-label"}}`); st != 200 {
			t.Fatalf("assign on B: %d %s", st, body)
		}
		within(t, converge, "both labels on A", func() bool { return labelled(a, "north") && labelled(a, "south") })
		st, body = a.do("GET", "/api/v1/labels", adminToken, "")
		if st != 200 || !strings.Contains(string(body), "north") || !strings.Contains(string(body), "south") {
			t.Fatalf("labels on A: %d %s", st, body)
		}
		if st, body := a.do("PUT", "/api/v1/devices/"+r.DeviceID+"/quota", adminToken, `{"note":"field test"}`); st != 200 {
			t.Fatalf("lift: %d %s", st, body)
		}
		within(t, converge, "lift on B", func() bool {
			st, body := b.do("GET", "/api/v1/devices/"+r.DeviceID+"/quota", adminToken, "")
			return st == 200 && strings.Contains(string(body), `"lifted":true`)
		})
	})

	t.Run("enrollment tokens and preauthorized machine IDs across nodes", func(t *testing.T) {
		type token struct {
			ID     string  `json:"id"`
			Token  string  `json:"token"`
			UsedAt *string `json:"used_at"`
		}
		mk := func(n *node) token {
			st, body := n.do("POST", "/api/v1/enrollment-tokens", adminToken, `{}`)
			var tk token
			if st != 201 || json.Unmarshal(body, &tk) != nil || tk.Token == "" {
				t.Fatalf("token on %s: %d %s", n.name, st, body)
			}
			return tk
		}
		reg := func(n *node, machine, tok string) int {
			st, _ := n.do("POST", "/api/v1/register", "", fmt.Sprintf(`{"machine_id":%q,"device_type":"ICR-3241","firmware":"6.3.5","enrollment_token":%q}`, machine, tok))
			return st
		}
		listed := func(n *node, id string) (found, used bool) {
			st, body := n.do("GET", "/api/v1/enrollment-tokens", adminToken, "")
			var v struct {
				Tokens []token `json:"tokens"`
			}
			if st != 200 || json.Unmarshal(body, &v) != nil {
				t.Fatalf("tokens on %s: %d %s", n.name, st, body)
			}
			for _, tk := range v.Tokens {
				if tk.ID == id {
					return true, tk.UsedAt != nil
				}
			}
			return false, false
		}
		ta, tb := mk(a), mk(b)
		if ta.ID == tb.ID {
			t.Fatalf("tokens made on A and B share ID %s", ta.ID)
		}
		// Made on A, used on B at once; single use on every node.
		if st := reg(b, "m-token-1", ta.Token); st != 200 {
			t.Fatalf("register on B with a token made on A: %d", st)
		}
		if st := reg(a, "m-token-2", ta.Token); st == 200 {
			t.Fatal("a used token accepted again on A")
		}
		within(t, converge, "the token listed as used on A", func() bool {
			found, used := listed(a, ta.ID)
			return found && used
		})
		// Revoked on A: refused on B.
		if st, body := a.do("DELETE", "/api/v1/enrollment-tokens/"+tb.ID, adminToken, ""); st != 200 {
			t.Fatalf("revoke on A: %d %s", st, body)
		}
		if st := reg(b, "m-token-3", tb.Token); st == 200 {
			t.Fatal("a token revoked on A accepted on B")
		}
		if st, body := a.do("POST", "/api/v1/preauthorized", adminToken, `{"machine_ids":["m-pre-1"]}`); st != 200 {
			t.Fatalf("preauthorize on A: %d %s", st, body)
		}
		within(t, converge, "the preauthorized machine ID listed on B", func() bool {
			st, body := b.do("GET", "/api/v1/preauthorized", adminToken, "")
			return st == 200 && strings.Contains(string(body), `"m-pre-1"`)
		})
	})

	t.Run("one machine ID registered on A and B at once gets one device ID", func(t *testing.T) {
		for i := range 10 {
			machine := fmt.Sprintf("m-race-%d", i)
			var wg sync.WaitGroup
			var ids [2]string
			var sts [2]int
			for j, n := range []*node{a, b} {
				wg.Add(1)
				go func() {
					defer wg.Done()
					body := fmt.Sprintf(`{"machine_id":%q,"device_type":"ICR-3241","firmware":"6.3.5","enrollment_secret":%q}`, machine, secret)
					st, b := n.do("POST", "/api/v1/register", "", body)
					var r registration
					json.Unmarshal(b, &r)
					sts[j], ids[j] = st, r.DeviceID
				}()
			}
			wg.Wait()
			if sts[0] != 200 && sts[1] != 200 {
				t.Fatalf("%s: neither registration succeeded: %v", machine, sts)
			}
			if ids[0] != "" && ids[1] != "" && ids[0] != ids[1] {
				t.Fatalf("%s: two device IDs %v", machine, ids)
			}
		}
	})

	t.Run("IDs never collide under concurrent registration", func(t *testing.T) {
		c := startNode(t, "c", dsn, nats.url())
		nodes := []*node{a, b, c}
		var mu sync.Mutex
		seen := map[string]string{}
		var wg sync.WaitGroup
		for i := range 3 * 40 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				n := nodes[i%3]
				machine := fmt.Sprintf("m-many-%d", i)
				r := n.mustRegister(machine)
				mu.Lock()
				defer mu.Unlock()
				if other, dup := seen[r.DeviceID]; dup {
					t.Errorf("device ID %s given to %s and %s", r.DeviceID, other, machine)
				}
				seen[r.DeviceID] = machine
			}()
		}
		wg.Wait()
		st, body := c.do("GET", "/api/v1/cluster", adminToken, "")
		var v struct {
			Alive int `json:"alive"`
		}
		if st != 200 || json.Unmarshal(body, &v) != nil || v.Alive != 3 {
			t.Fatalf("cluster view: %d %s", st, body)
		}
	})

	t.Run("liveness of other nodes' devices", func(t *testing.T) {
		r := a.mustRegister("m-live")
		if st, _ := a.push(r.Token); st != 200 {
			t.Fatal("push")
		}
		within(t, 3*time.Second, "B sees the push", func() bool {
			st, body := b.do("GET", "/api/v1/devices/"+r.DeviceID, adminToken, "")
			var d struct {
				Liveness string `json:"liveness"`
			}
			return st == 200 && json.Unmarshal(body, &d) == nil && d.Liveness == "online"
		})
	})

	t.Run("dashboard sessions work across nodes", func(t *testing.T) {
		jar, _ := cookiejar.New(nil)
		cl := &http.Client{Jar: jar, Timeout: 30 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
		get := func(n *node, path string) (int, string) {
			resp, err := cl.Get(n.base + path)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			return resp.StatusCode, string(b)
		}
		if st, _ := get(a, "/ui/login"); st != 200 {
			t.Fatal("login page")
		}
		ua, _ := url.Parse(a.base + "/ui/")
		ub, _ := url.Parse(b.base + "/ui/")
		cookie := func(u *url.URL, name string) *http.Cookie {
			for _, c := range jar.Cookies(u) {
				if c.Name == name {
					return c
				}
			}
			return nil
		}
		login := cookie(ua, "drover_login")
		if login == nil {
			t.Fatal("no login cookie")
		}
		resp, err := cl.PostForm(a.base+"/ui/login", url.Values{"csrf": {login.Value}, "password": {adminToken}})
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		session := cookie(ua, "drover_session")
		if resp.StatusCode != http.StatusSeeOther || session == nil {
			t.Fatalf("login: %d", resp.StatusCode)
		}
		// As behind a balancer, the browser sends the cookie to every node.
		jar.SetCookies(ub, []*http.Cookie{session})
		for _, n := range []*node{b, a, b} {
			if st, _ := get(n, "/ui/"); st != 200 {
				t.Fatalf("dashboard on %s with the session made on A: %d", n.name, st)
			}
		}
		// The overview lists the nodes.
		_, page := get(b, "/ui/")
		for _, name := range []string{"a", "b"} { // c stopped with its subtest
			if !strings.Contains(page, `data-node="`+name+`"`) {
				t.Errorf("overview on B does not list node %s", name)
			}
		}
		// Logging out on B ends the session on A, which has it cached.
		m := regexp.MustCompile(`name="csrf" value="([^"]+)"`).FindStringSubmatch(page)
		if m == nil {
			t.Fatal("no csrf field on the dashboard")
		}
		req, _ := http.NewRequest("POST", b.base+"/ui/logout", strings.NewReader(url.Values{"csrf": {m[1]}}.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		if resp, err := cl.Do(req); err != nil || resp.StatusCode != http.StatusSeeOther {
			t.Fatalf("logout on B: %v %v", err, resp)
		}
		jar.SetCookies(ua, []*http.Cookie{session})
		if st, _ := get(a, "/ui/"); st != http.StatusSeeOther {
			t.Fatalf("dashboard on A after logging out on B: %d, want a redirect to the login", st)
		}
	})

	t.Run("each alert is raised once", func(t *testing.T) {
		// A rule made on B; pushes meeting it on both nodes; one device
		// falls silent. Whichever node leads, each alert is raised once.
		for _, rule := range []string{`{"name":"hot","kind":"cpu_above","threshold":50,"severity":"warning"}`,
			`{"name":"gone","kind":"offline","seconds":5,"severity":"critical"}`} {
			if st, body := b.do("POST", "/api/v1/alerts/rules", adminToken, rule); st != 201 {
				t.Fatalf("rule: %d %s", st, body)
			}
		}
		hot := a.mustRegister("m-hot")
		silent := b.mustRegister("m-silent")
		if st, _ := b.push(silent.Token); st != 200 {
			t.Fatal("push")
		}
		events := func(n *node, device string) map[string]int {
			st, body := n.do("GET", "/api/v1/alerts?device_id="+device, adminToken, "")
			var v struct {
				Alerts []struct {
					ID   string `json:"id"`
					Rule string `json:"rule"`
				} `json:"alerts"`
			}
			if st != 200 || json.Unmarshal(body, &v) != nil {
				t.Fatalf("alerts: %d %s", st, body)
			}
			out := map[string]int{}
			for _, e := range v.Alerts {
				out[e.Rule]++
			}
			return out
		}
		cpu := func(n *node) {
			seqMu.Lock()
			seq[hot.Token]++
			sq := seq[hot.Token]
			seqMu.Unlock()
			if st, body := n.do("POST", "/api/v1/push", hot.Token, fmt.Sprintf(`{"seq":%d,"config_version":0,"state":{"cpu":90}}`, sq)); st != 200 {
				t.Fatalf("push on %s: %d %s", n.name, st, body)
			}
		}
		within(t, 30*time.Second, "the cpu alert", func() bool {
			cpu(a)
			cpu(b)
			time.Sleep(200 * time.Millisecond) // paces the pushes while the alert is awaited
			return events(a, hot.DeviceID)["hot"] > 0
		})
		within(t, 30*time.Second, "the offline alert", func() bool { return events(b, silent.DeviceID)["gone"] > 0 })
		for range 5 {
			cpu(a)
			cpu(b)
		}
		// No duplicate may appear: nothing to wait for but more than a
		// check of every node.
		time.Sleep(6 * time.Second)
		for _, n := range []*node{a, b} {
			// Every node counts the active alerts, leader or not.
			st, body := n.do("GET", "/api/v1/alerts?state=active", adminToken, "")
			var v struct {
				Active int `json:"active"`
			}
			if st != 200 || json.Unmarshal(body, &v) != nil || v.Active < 2 {
				t.Errorf("active alerts counted on %s: %d %s", n.name, st, body)
			}
			if got := events(n, hot.DeviceID)["hot"]; got != 1 {
				t.Errorf("cpu alerts seen on %s: %d, want 1", n.name, got)
			}
			if got := events(n, silent.DeviceID)["gone"]; got != 1 {
				t.Errorf("offline alerts seen on %s: %d, want 1", n.name, got)
			}
		}
	})

	t.Run("a node cut off from NATS", func(t *testing.T) {
		// Its pushes reach the others through the database: no offline
		// alert for a device that pushes only there, on whichever node
		// leads, and the others see it online.
		c := startNode(t, "c", dsn, "nats://127.0.0.1:1")
		for _, n := range []*node{a, b} {
			within(t, 5*time.Second, "readyz on "+n.name+" says a node cannot reach NATS", func() bool {
				st, body := n.do("GET", "/readyz", "", "")
				return st == 200 && strings.Contains(string(body), "a node cannot reach NATS") && n.metric("drover_cluster_summaries_via_db") == 1
			})
		}
		keepsPushing(t, c, []*node{a, b})
	})

	t.Run("a server without --cluster is refused", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		out, err := exec.CommandContext(ctx, droverBin, "serve", "--db", dsn, "--data-dir", t.TempDir(),
			"--listen", "", "--http-listen", "127.0.0.1:0").CombinedOutput()
		if err == nil || ctx.Err() != nil || !strings.Contains(string(out), "in use") {
			t.Fatalf("single server next to the cluster: %v\n%s", err, out)
		}
	})

	t.Run("without NATS", func(t *testing.T) {
		nats.stop()
		within(t, 10*time.Second, "readyz says degraded", func() bool {
			st, body := a.do("GET", "/readyz", "", "")
			return st == 200 && strings.Contains(string(body), "degraded")
		})
		if v := a.metric("drover_cluster_nats_up"); v != 0 {
			t.Fatalf("drover_cluster_nats_up = %v with NATS down", v)
		}
		reregisterRevokes(t, "m-rereg-nonats")
		r := b.mustRegister("m-nonats")
		if st, _ := a.push(r.Token); st != 200 {
			t.Fatal("push on A of a device registered on B without NATS")
		}
		// The leader's liveness comes from the database: a device pushing
		// only to the other node raises no offline alert.
		other := b
		if leads(t, b) {
			other = a
		}
		keepsPushing(t, other, []*node{a, b})
		nats.start()
		within(t, 10*time.Second, "NATS back", func() bool { return a.metric("drover_cluster_nats_up") == 1 })
		// Both nodes' heartbeats say so within a beat or two.
		within(t, 5*time.Second, "readyz not degraded after NATS came back", func() bool {
			st, body := a.do("GET", "/readyz", "", "")
			return st == 200 && !strings.Contains(string(body), "degraded")
		})
	})
}

// leads says whether n leads the cluster.
func leads(t *testing.T, n *node) bool {
	t.Helper()
	st, body := n.do("GET", "/api/v1/cluster", adminToken, "")
	var v struct {
		Node struct {
			Leader bool `json:"leader"`
		} `json:"node"`
	}
	if st != 200 || json.Unmarshal(body, &v) != nil {
		t.Fatalf("cluster view of %s: %d %s", n.name, st, body)
	}
	return v.Node.Leader
}

// keepsPushing registers a device on on and pushes it there every 300 ms
// for 12 s (more than the offline rule "gone", 5 s, and a leader's check,
// 5 s, together): no offline alert may be raised for it, and the nodes of
// view see it online. Once it stops, the alert comes (the rule does apply
// to it). The rule leaves room for the database path: a push reaches the
// leader after up to two StatesEvery (1 s) besides the push interval, and
// later on a loaded machine.
func keepsPushing(t *testing.T, on *node, view []*node) {
	t.Helper()
	r := on.mustRegister(fmt.Sprintf("m-keeps-%s-%d", on.name, time.Now().UnixNano()))
	alerts := func(n *node) int {
		st, body := n.do("GET", "/api/v1/alerts?device_id="+r.DeviceID, adminToken, "")
		var v struct {
			Alerts []struct {
				Rule string `json:"rule"`
			} `json:"alerts"`
		}
		if st != 200 || json.Unmarshal(body, &v) != nil {
			t.Fatalf("alerts: %d %s", st, body)
		}
		k := 0
		for _, e := range v.Alerts {
			if e.Rule == "gone" {
				k++
			}
		}
		return k
	}
	online := func(n *node) bool {
		st, body := n.do("GET", "/api/v1/devices/"+r.DeviceID, adminToken, "")
		var d struct {
			Liveness string `json:"liveness"`
		}
		return st == 200 && json.Unmarshal(body, &d) == nil && d.Liveness == "online"
	}
	// The device pushes every 300 ms for 12 s: the pacing is what is
	// tested (no offline alert while it pushes), not a wait.
	for end := time.Now().Add(12 * time.Second); time.Now().Before(end); time.Sleep(300 * time.Millisecond) {
		if st, body := on.push(r.Token); st != 200 {
			t.Fatalf("push on %s: %d %s", on.name, st, body)
		}
	}
	for _, n := range view {
		if got := alerts(n); got != 0 {
			t.Fatalf("%d offline alerts on %s for a device that pushed on %s every 300 ms", got, n.name, on.name)
		}
		within(t, 3*time.Second, n.name+" sees the device online", func() bool { return online(n) })
	}
	within(t, 15*time.Second, "the offline alert once the device stops", func() bool { return alerts(view[0]) > 0 })
}

// pushesCostNoReads: pushes on A and B write no change log row and make
// no node read a device back (liveness travels as push summaries); a
// stale token costs one read, not one per push.
func pushesCostNoReads(t *testing.T, dsn string, a, b *node) {
	ctx := context.Background()
	db, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(ctx)
	count := func(table string) int64 {
		var n int64
		if err := db.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	type dev struct {
		r   registration
		ver int64
		seq int
	}
	applied := b.metric("drover_cluster_changes_applied_total")
	var devs []*dev
	for i := range 10 {
		devs = append(devs, &dev{r: a.mustRegister(fmt.Sprintf("m-cheap-%d", i))})
	}
	within(t, converge, "B applied the registrations", func() bool {
		return b.metric("drover_cluster_changes_applied_total") >= applied+10
	})
	// Sync events of these devices only: an earlier subtest's may still
	// be on its way to the leader.
	ids := make([]string, len(devs))
	for i, d := range devs {
		ids[i] = d.r.DeviceID
	}
	syncTable := "sync_events WHERE device_id IN (" + strings.Join(ids, ",") + ")"
	changes, syncs := count("cluster_changes"), count(syncTable)
	readsA, readsB := a.metric("drover_cluster_device_reads_total"), b.metric("drover_cluster_device_reads_total")
	summaries := b.metric("drover_cluster_push_summaries_applied_total")
	for round := range 3 {
		for i, d := range devs {
			n := a
			if (i+round)%2 == 1 {
				n = b
			}
			d.seq++
			st, body := n.do("POST", "/api/v1/push", d.r.Token, fmt.Sprintf(`{"seq":%d,"config_version":%d,"state":{"uptime":%d}}`, d.seq, d.ver, 100+d.seq))
			var pr struct {
				Config *struct {
					Version int64 `json:"version"`
				} `json:"config"`
			}
			if st != 200 || json.Unmarshal(body, &pr) != nil {
				t.Fatalf("push on %s: %d %s", n.name, st, body)
			}
			if pr.Config != nil {
				d.ver = pr.Config.Version
			}
		}
	}
	// The last round's 5 pushes on A at least: earlier ones B may have
	// overtaken with its own push of the same device.
	within(t, 3*time.Second, "B took A's pushes as summaries", func() bool {
		return b.metric("drover_cluster_push_summaries_applied_total") >= summaries+5
	})
	// Nothing may be written: no condition to wait for, only a poll or
	// four and the alert engine's flushes.
	time.Sleep(time.Second)
	if got := count("cluster_changes"); got != changes {
		t.Errorf("30 pushes wrote %d change log rows, want 0", got-changes)
	}
	if got := a.metric("drover_cluster_device_reads_total"); got != readsA {
		t.Errorf("30 pushes made A read %v devices back, want 0", got-readsA)
	}
	if got := b.metric("drover_cluster_device_reads_total"); got != readsB {
		t.Errorf("30 pushes made B read %v devices back, want 0", got-readsB)
	}
	// A sync event is a change of sync state: each device's first push
	// (arriving → synchronized), then none.
	if got := count(syncTable) - syncs; got > int64(len(devs)) {
		t.Errorf("30 pushes of %d devices recorded %d sync events", len(devs), got)
	}
	// A stale token: one read, then refused from memory.
	stale := devs[0].r.DeviceID + ".not-the-token"
	readsB = b.metric("drover_cluster_device_reads_total")
	for range 20 {
		if st, _ := b.push(stale); st != 401 {
			t.Fatalf("stale token: %d, want 401", st)
		}
	}
	if got := b.metric("drover_cluster_device_reads_total") - readsB; got != 1 {
		t.Errorf("20 pushes with a stale token read the device %v times, want 1", got)
	}
}

// Under the preauthorized policy a machine ID listed on A registers on B
// at once (B reads the list back when its memory does not know the ID),
// and one taken off the list on B is refused on A.
func TestClusterPreauthorized(t *testing.T) {
	t.Parallel()
	srv := dbtest.Need(t, dbtest.Postgres, pg)
	dsn := srv.NewDB(t)
	nats := startNATS(t)
	a := startNode(t, "a", dsn, nats.url(), "--admission", "preauthorized")
	b := startNode(t, "b", dsn, nats.url(), "--admission", "preauthorized")
	if st, _ := b.register("m-listed", ""); st == 200 {
		t.Fatal("an unlisted machine ID registered")
	}
	for i := range 5 {
		m := fmt.Sprintf("m-listed-%d", i)
		if st, body := a.do("POST", "/api/v1/preauthorized", adminToken, fmt.Sprintf(`{"machine_ids":[%q]}`, m)); st != 200 {
			t.Fatalf("preauthorize on A: %d %s", st, body)
		}
		if st, _ := b.register(m, ""); st != 200 {
			t.Fatalf("%s listed on A, registering on B right after: %d", m, st)
		}
	}
	if st, body := a.do("POST", "/api/v1/preauthorized", adminToken, `{"machine_ids":["m-unlisted"]}`); st != 200 {
		t.Fatalf("preauthorize on A: %d %s", st, body)
	}
	within(t, converge, "B lists m-unlisted", func() bool {
		st, body := b.do("GET", "/api/v1/preauthorized", adminToken, "")
		return st == 200 && strings.Contains(string(body), `"m-unlisted"`)
	})
	if st, body := b.do("DELETE", "/api/v1/preauthorized/m-unlisted", adminToken, ""); st != 200 && st != 204 {
		t.Fatalf("remove on B: %d %s", st, body)
	}
	within(t, converge, "A no longer lists m-unlisted", func() bool {
		st, body := a.do("GET", "/api/v1/preauthorized", adminToken, "")
		return st == 200 && !strings.Contains(string(body), `"m-unlisted"`)
	})
	if st, _ := a.register("m-unlisted", ""); st == 200 {
		t.Fatal("a machine ID taken off the list on B registered on A")
	}
}

func TestClusterRefusesOtherBackends(t *testing.T) {
	t.Parallel()
	for _, dsn := range []string{"sqlite:" + filepath.Join(t.TempDir(), "x.db"), "mysql://root@tcp(127.0.0.1:1)/x"} {
		out, err := exec.CommandContext(context.Background(), droverBin, "serve", "--cluster", "--db", dsn,
			"--data-dir", t.TempDir()).CombinedOutput()
		if err == nil || !strings.Contains(string(out), "PostgreSQL") {
			t.Fatalf("--cluster on %s: %v %s", dsn, err, out)
		}
	}
}
