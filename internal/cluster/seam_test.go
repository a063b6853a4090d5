package cluster_test

// Where the cluster meets other features (docs/architecture.md, "Where
// features meet"): a change taken by one node reaches a device connected
// to another node the way it reaches one connected to the node that took
// it (profiles, commands, labels, admission, rollouts), and numbers two
// nodes could hand out at once (profile revisions) come from the database.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/drover/drover/internal/store/dbtest"
)

// connection is a device's persistent connection to one node.
type connection struct {
	n    *node
	msgs chan string
	resp *http.Response // the 101
}

// dial opens token's persistent connection on n and waits until n holds it.
func dial(t *testing.T, n *node, token string) *connection {
	t.Helper()
	before := n.metric("drover_device_connections")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ws, resp, err := websocket.Dial(ctx, "ws://"+strings.TrimPrefix(n.base, "http://")+"/api/v1/connect",
		&websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + token}}})
	if err != nil {
		t.Fatalf("connect on %s: %v", n.name, err)
	}
	t.Cleanup(func() { ws.CloseNow() })
	c := &connection{n: n, msgs: make(chan string, 16), resp: resp}
	go func() {
		for {
			_, m, err := ws.Read(context.Background())
			if err != nil {
				close(c.msgs)
				return
			}
			c.msgs <- string(m)
		}
	}()
	within(t, 5*time.Second, "connection held on "+n.name, func() bool { return n.metric("drover_device_connections") > before })
	return c
}

// drain forgets the nudges received so far.
func (c *connection) drain() {
	for {
		select {
		case <-c.msgs:
		default:
			return
		}
	}
}

// nudged waits for {"type":"push"} on c for at most limit, and says how
// long it took; what names the change.
func (c *connection) nudged(t *testing.T, limit time.Duration, start time.Time, what string) time.Duration {
	t.Helper()
	select {
	case m, ok := <-c.msgs:
		if !ok || m != `{"type":"push"}` {
			t.Fatalf("connection on %s: %q (open %v)", c.n.name, m, ok)
		}
	case <-time.After(limit - time.Since(start)):
		t.Fatalf("%s: the connection on %s was not told to push within %v", what, c.n.name, limit)
	}
	took := time.Since(start)
	t.Logf("%s: connection on %s told to push after %v", what, c.n.name, took)
	return took
}

// answer is the part of a push answer these tests read.
type answer struct {
	PushInterval int `json:"push_interval"`
	Config       *struct {
		Version int64           `json:"version"`
		Data    json.RawMessage `json:"data"`
	} `json:"config"`
	Commands []struct {
		ID uint64 `json:"id"`
	} `json:"commands"`
}

// pushAt pushes token to n reporting configuration version applied and
// returns the answer's status and body.
func pushAt(t *testing.T, n *node, token string, applied int64) (int, answer) {
	t.Helper()
	seqMu.Lock()
	seq[token]++
	s := seq[token]
	seqMu.Unlock()
	st, b := n.do("POST", "/api/v1/push", token, fmt.Sprintf(`{"seq":%d,"config_version":%d,"state":{"uptime":%d}}`, s, applied, 100+s))
	var a answer
	if st == 200 {
		if err := json.Unmarshal(b, &a); err != nil {
			t.Fatalf("push answer on %s: %s", n.name, b)
		}
	}
	return st, a
}

// registerAs registers machine on n as deviceType with firmware.
func registerAs(t *testing.T, n *node, machine, deviceType, firmware string) registration {
	t.Helper()
	st, b := n.do("POST", "/api/v1/register", "", fmt.Sprintf(`{"machine_id":%q,"device_type":%q,"firmware":%q,"enrollment_secret":%q}`,
		machine, deviceType, firmware, secret))
	var r registration
	if st != 200 || json.Unmarshal(b, &r) != nil || r.Token == "" {
		t.Fatalf("register %s on %s: %d %s", machine, n.name, st, b)
	}
	return r
}

// deviceProfile is the profile ID n shows for device id ("" while n does
// not know the device).
func deviceProfile(t *testing.T, n *node, id string) string {
	t.Helper()
	st, b := n.do("GET", "/api/v1/devices/"+id, adminToken, "")
	var d struct {
		ProfileID string `json:"profile_id"`
	}
	if st == 404 {
		return ""
	}
	if st != 200 || json.Unmarshal(b, &d) != nil {
		t.Fatalf("device %s on %s: %d %s", id, n.name, st, b)
	}
	return d.ProfileID
}

// patchProfile changes profile id on n and returns its new version.
func patchProfile(t *testing.T, n *node, id, body string) int64 {
	t.Helper()
	st, b := n.do("PATCH", "/api/v1/profiles/"+id, adminToken, body)
	var p struct {
		Version int64 `json:"version"`
	}
	if st != 200 || json.Unmarshal(b, &p) != nil {
		t.Fatalf("profile %s change %s on %s: %d %s", id, body, n.name, st, b)
	}
	return p.Version
}

// TestSeamClusterNudges: a device holding its persistent connection on B
// is told to push when its profile's configuration or push interval
// changes, or a command is queued for it, whichever node took the change,
// and as fast as when B took it; with NATS and without. Label and
// admission changes taken on A hold at the device's next push on B, as
// on one server. The 101 carries B's name.
func TestSeamClusterNudges(t *testing.T) {
	t.Parallel()
	_, nats, nodes := startCluster(t, "a", "b")
	a, b := nodes[0], nodes[1]
	d := registerAs(t, a, "m-seam-nudge", "SEAM-NUDGE", "1.0")
	prof := deviceProfile(t, a, d.DeviceID)
	within(t, converge, "B knows the device", func() bool { st, _ := pushAt(t, b, d.Token, 0); return st == 200 })
	conn := dial(t, b, d.Token)
	if got := conn.resp.Header.Values("X-Drover-Node"); conn.resp.StatusCode != http.StatusSwitchingProtocols || len(got) != 1 || got[0] != "b" {
		t.Fatalf("connect on b: %d, X-Drover-Node %q, want b", conn.resp.StatusCode, got)
	}
	conn.drain()

	var local time.Duration
	t.Run("configuration changed on B (the node holding the connection)", func(t *testing.T) {
		start := time.Now()
		v := patchProfile(t, b, prof, `{"config":{"ntp":"b.example"}}`)
		local = conn.nudged(t, converge, start, "configuration changed on b")
		if st, ans := pushAt(t, b, d.Token, 0); st != 200 || ans.Config == nil || ans.Config.Version != v {
			t.Fatalf("push on b after the nudge: %d %+v, want configuration version %d", st, ans, v)
		}
	})

	t.Run("configuration changed on A", func(t *testing.T) {
		start := time.Now()
		v := patchProfile(t, a, prof, `{"config":{"ntp":"a.example"}}`)
		took := conn.nudged(t, converge, start, "configuration changed on a")
		st, ans := pushAt(t, b, d.Token, 0)
		if st != 200 || ans.Config == nil || ans.Config.Version != v || !strings.Contains(string(ans.Config.Data), "a.example") {
			t.Fatalf("push on b after the nudge: %d %+v, want configuration version %d", st, ans, v)
		}
		t.Logf("nudge through B %v after a change on B, %v after one on A", local, took)
	})

	t.Run("push interval changed on A", func(t *testing.T) {
		start := time.Now()
		patchProfile(t, a, prof, `{"push_interval":90}`)
		conn.nudged(t, converge, start, "push interval changed on a")
		if st, ans := pushAt(t, b, d.Token, 0); st != 200 || ans.PushInterval != 90 {
			t.Fatalf("push on b after the nudge: %d %+v, want push_interval 90", st, ans)
		}
	})

	t.Run("another profile changed on A: no nudge", func(t *testing.T) {
		other := registerAs(t, a, "m-seam-other", "SEAM-OTHER", "1.0")
		op := deviceProfile(t, a, other.DeviceID)
		v := patchProfile(t, a, op, `{"config":{"x":1}}`)
		within(t, converge, "b applied the other profile's change", func() bool {
			st, body := b.do("GET", "/api/v1/profiles/"+op, adminToken, "")
			return st == 200 && strings.Contains(string(body), fmt.Sprintf(`"version":%d`, v))
		})
		select {
		case m := <-conn.msgs:
			t.Fatalf("connection on b got %q for another profile's change", m)
		default:
		}
	})

	t.Run("command queued on A", func(t *testing.T) {
		start := time.Now()
		j := a.send(fmt.Sprintf(`{"kind":"ping","args":["10.0.0.1"],"device_id":%q}`, d.DeviceID))
		conn.nudged(t, converge, start, "command queued on a")
		if ids := b.pushWith(d.Token, ""); count(ids, j.ID) != 1 {
			t.Fatalf("push on b after the nudge: %v, want job %s", ids, j.ID)
		}
	})

	t.Run("label assigned on A, command by label sent on B", func(t *testing.T) {
		st, body := a.do("POST", "/api/v1/labels/assign", adminToken, `{"label":"seam-site","filter":{"q":"m-seam-nudge"}}`)
		if st != 200 {
			t.Fatalf("assign on a: %d %s", st, body)
		}
		within(t, converge, "b lists the label's device", func() bool {
			st, body := b.do("GET", "/api/v1/devices?label=seam-site", adminToken, "")
			return st == 200 && strings.Contains(string(body), `"m-seam-nudge"`)
		})
		conn.drain()
		start := time.Now()
		j := b.send(`{"kind":"hook","args":["site"],"label":"seam-site"}`)
		if j.Total != 1 {
			t.Fatalf("command by label on b targets %d devices, want 1", j.Total)
		}
		conn.nudged(t, converge, start, "command by label queued on b")
		if ids := b.pushWith(d.Token, ""); count(ids, j.ID) != 1 {
			t.Fatalf("push on b after the nudge: %v, want job %s", ids, j.ID)
		}
	})

	t.Run("group values set on A, device values on B", func(t *testing.T) {
		conn.drain()
		start := time.Now()
		if st, body := a.do("PUT", "/api/v1/labels/seam-site/config", adminToken, `{"values":{"site":"north"}}`); st != 200 {
			t.Fatalf("group values on a: %d %s", st, body)
		}
		conn.nudged(t, converge, start, "group values set on a")
		effective := func(n *node) int64 {
			st, body := n.do("GET", "/api/v1/devices/"+d.DeviceID+"/config/effective", adminToken, "")
			var e struct {
				Version int64 `json:"version"`
			}
			if st != 200 || json.Unmarshal(body, &e) != nil {
				t.Fatalf("effective configuration on %s: %d %s", n.name, st, body)
			}
			return e.Version
		}
		st, ans := pushAt(t, b, d.Token, 0)
		if st != 200 || ans.Config == nil || ans.Config.Version != effective(a) || !strings.Contains(string(ans.Config.Data), `"site":"north"`) {
			t.Fatalf("push on b after the nudge: %d %+v, want a's effective version %d", st, ans, effective(a))
		}
		conn.drain()
		start = time.Now()
		if st, body := b.do("PUT", "/api/v1/devices/"+d.DeviceID+"/config", adminToken, `{"values":{"own":"${device.machine_id}"}}`); st != 200 {
			t.Fatalf("device values on b: %d %s", st, body)
		}
		conn.nudged(t, converge, start, "device values set on b")
		within(t, converge, "a has b's device values", func() bool { return effective(a) == effective(b) })
		if st, ans := pushAt(t, b, d.Token, 0); st != 200 || ans.Config == nil || !strings.Contains(string(ans.Config.Data), `"own":"m-seam-nudge"`) {
			t.Fatalf("push on b with device values: %d %+v", st, ans)
		}
		// Without its layers the device runs its profile's configuration again.
		for _, p := range []string{"/api/v1/labels/seam-site/config", "/api/v1/devices/" + d.DeviceID + "/config"} {
			if st, body := a.do("DELETE", p, adminToken, ""); st != 200 {
				t.Fatalf("delete %s on a: %d %s", p, st, body)
			}
		}
		within(t, converge, "b has no layers left", func() bool {
			st, body := b.do("GET", "/api/v1/devices/"+d.DeviceID+"/config/effective", adminToken, "")
			return st == 200 && strings.Contains(string(body), `"layers":[]`)
		})
	})

	t.Run("blocked on A, refused on B; approved on B, accepted on A", func(t *testing.T) {
		if st, body := a.do("POST", "/api/v1/devices/"+d.DeviceID+"/block", adminToken, ""); st != 200 {
			t.Fatalf("block on a: %d %s", st, body)
		}
		within(t, converge, "b refuses the blocked device", func() bool { st, _ := pushAt(t, b, d.Token, 0); return st == 403 })
		if st, body := b.do("POST", "/api/v1/devices/"+d.DeviceID+"/approve", adminToken, ""); st != 200 {
			t.Fatalf("approve on b: %d %s", st, body)
		}
		within(t, converge, "a takes the approved device", func() bool { st, _ := pushAt(t, a, d.Token, 0); return st == 200 })
	})

	t.Run("without NATS, through the change log poll", func(t *testing.T) {
		nats.stop()
		within(t, 10*time.Second, "a and b see NATS down", func() bool {
			return a.metric("drover_cluster_nats_up") == 0 && b.metric("drover_cluster_nats_up") == 0
		})
		conn.drain()
		start := time.Now()
		v := patchProfile(t, a, prof, `{"config":{"ntp":"poll.example"}}`)
		conn.nudged(t, converge, start, "configuration changed on a without NATS")
		if st, ans := pushAt(t, b, d.Token, 0); st != 200 || ans.Config == nil || ans.Config.Version != v {
			t.Fatalf("push on b after the nudge: %d %+v, want configuration version %d", st, ans, v)
		}
	})
}

// revisions reads profile id's history on n.
func revisions(t *testing.T, n *node, id string) []struct {
	Rev     int    `json:"rev"`
	Version int64  `json:"version"`
	Note    string `json:"note"`
	By      string `json:"by"`
} {
	t.Helper()
	st, b := n.do("GET", "/api/v1/profiles/"+id+"/history", adminToken, "")
	var h struct {
		Revisions []struct {
			Rev     int    `json:"rev"`
			Version int64  `json:"version"`
			Note    string `json:"note"`
			By      string `json:"by"`
		} `json:"revisions"`
	}
	if st != 200 || json.Unmarshal(b, &h) != nil {
		t.Fatalf("history of profile %s on %s: %d %s", id, n.name, st, b)
	}
	return h.Revisions
}

// TestSeamClusterRevisions: registrations of one new device type and
// firmware on two nodes at once make one profile with one revision, and
// changes of one profile on two nodes at once each get their own
// revision number; labels and alert rules made on two nodes at once each
// get their own ID: the database allocates them, no node logs a failure.
func TestSeamClusterRevisions(t *testing.T) {
	t.Parallel()
	_, _, nodes := startCluster(t, "a", "b")
	a, b := nodes[0], nodes[1]

	t.Run("one new type and firmware registered on A and B at once", func(t *testing.T) {
		for round := range 6 {
			deviceType := fmt.Sprintf("SEAM-REV-%d", round)
			var regs [2]registration
			var wg sync.WaitGroup
			start := make(chan struct{})
			for i, n := range nodes {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					st, b := n.do("POST", "/api/v1/register", "", fmt.Sprintf(`{"machine_id":"m-rev-%d-%s","device_type":%q,"firmware":"1.0","enrollment_secret":%q}`,
						round, n.name, deviceType, secret))
					if st != 200 || json.Unmarshal(b, &regs[i]) != nil {
						t.Errorf("register on %s: %d %s", n.name, st, b)
					}
				}()
			}
			close(start)
			wg.Wait()
			if t.Failed() {
				t.FailNow()
			}
			prof := deviceProfile(t, a, regs[0].DeviceID)
			within(t, converge, "both devices on one profile on both nodes", func() bool {
				for _, n := range nodes {
					for _, r := range regs {
						if deviceProfile(t, n, r.DeviceID) != prof {
							return false
						}
					}
				}
				return true
			})
			for _, n := range nodes {
				if h := revisions(t, n, prof); len(h) != 1 || h[0].Rev != 1 || h[0].Note != "created empty" {
					t.Fatalf("round %d: history of profile %s on %s: %+v, want one revision, created empty", round, prof, n.name, h)
				}
			}
		}
	})

	t.Run("one profile changed on A and B at once", func(t *testing.T) {
		r := registerAs(t, a, "m-rev-patch", "SEAM-REV-PATCH", "1.0")
		prof := deviceProfile(t, a, r.DeviceID)
		within(t, converge, "b knows the profile", func() bool {
			st, _ := b.do("GET", "/api/v1/profiles/"+prof, adminToken, "")
			return st == 200
		})
		const each = 5
		var wg sync.WaitGroup
		start := make(chan struct{})
		for _, n := range nodes {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				for k := range each {
					st, body := n.do("PATCH", "/api/v1/profiles/"+prof, adminToken, fmt.Sprintf(`{"config":{"by":%q,"k":%d}}`, n.name, k))
					if st != 200 {
						t.Errorf("change on %s: %d %s", n.name, st, body)
					}
				}
			}()
		}
		close(start)
		wg.Wait()
		for _, n := range nodes {
			h := revisions(t, n, prof)
			if len(h) != 1+2*each {
				t.Fatalf("history on %s: %d revisions, want %d: %+v", n.name, len(h), 1+2*each, h)
			}
			versions := map[int64]bool{}
			for i, rv := range h {
				if rv.Rev != i+1 || versions[rv.Version] {
					t.Fatalf("history on %s: revision %d is %+v (numbers 1…%d, versions distinct): %+v", n.name, i+1, rv, len(h), h)
				}
				versions[rv.Version] = true
			}
		}
	})

	// atOnce runs body(n, k) for k < each on both nodes at the same
	// moment and wants every answer to be want.
	atOnce := func(t *testing.T, each, want int, method, path func(n *node, k int) string, body func(n *node, k int) string) {
		var wg sync.WaitGroup
		start := make(chan struct{})
		for _, n := range nodes {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				for k := range each {
					if st, b := n.do(method(n, k), path(n, k), adminToken, body(n, k)); st != want {
						t.Errorf("%s %s on %s: %d %s", method(n, k), path(n, k), n.name, st, b)
					}
				}
			}()
		}
		close(start)
		wg.Wait()
	}

	t.Run("labels made on A and B at once", func(t *testing.T) {
		r := registerAs(t, a, "m-rev-labels", "SEAM-REV-LABELS", "1.0")
		// An assignment selects among the devices its node knows: b must
		// know the device before its filter can match it.
		within(t, converge, "b knows the device", func() bool { return deviceProfile(t, b, r.DeviceID) != "" })
		const each = 5
		post := func(*node, int) string { return "POST" }
		atOnce(t, each, 200, post, func(*node, int) string { return "/api/v1/labels/assign" }, func(n *node, k int) string {
			return fmt.Sprintf(`{"label":"%s-%d","filter":{"q":"m-rev-labels"}}`, n.name, k)
		})
		// The same name on both nodes at once: one label.
		atOnce(t, 1, 200, post, func(*node, int) string { return "/api/v1/labels/assign" }, func(*node, int) string {
			return `{"label":"both","filter":{"q":"m-rev-labels"}}`
		})
		for _, n := range nodes {
			// Ten labels through the change log on a busy machine: the
			// promise here is one label per name, each on its device.
			within(t, 10*time.Second, "every label on "+n.name, func() bool {
				st, b := n.do("GET", "/api/v1/labels", adminToken, "")
				var ls struct {
					Labels []struct {
						ID      string `json:"id"`
						Name    string `json:"name"`
						Devices int    `json:"devices"`
					} `json:"labels"`
				}
				if st != 200 || json.Unmarshal(b, &ls) != nil {
					t.Fatalf("labels on %s: %d %s", n.name, st, b)
				}
				ids := map[string]bool{}
				assigned := 0
				for _, l := range ls.Labels {
					if ids[l.ID] || l.Devices > 1 {
						t.Fatalf("labels on %s: %s", n.name, b)
					}
					ids[l.ID] = true
					// A label read back from the change log may show
					// before its assignment does.
					assigned += l.Devices
				}
				return len(ls.Labels) == 2*each+1 && assigned == len(ls.Labels)
			})
		}
	})

	t.Run("alert rules made on A and B at once", func(t *testing.T) {
		const each = 5
		atOnce(t, each, 201, func(*node, int) string { return "POST" }, func(*node, int) string { return "/api/v1/alerts/rules" }, func(n *node, k int) string {
			return fmt.Sprintf(`{"name":"hot-%s-%d","kind":"temperature_above","threshold":%d}`, n.name, k, 70+k)
		})
		for _, n := range nodes {
			within(t, 10*time.Second, "every rule on "+n.name, func() bool {
				st, b := n.do("GET", "/api/v1/alerts/rules", adminToken, "")
				var rs struct {
					Rules []struct {
						ID   string `json:"id"`
						Name string `json:"name"`
					} `json:"rules"`
				}
				if st != 200 || json.Unmarshal(b, &rs) != nil {
					t.Fatalf("rules on %s: %d %s", n.name, st, b)
				}
				ids := map[string]bool{}
				for _, r := range rs.Rules {
					if ids[r.ID] {
						t.Fatalf("rules on %s: ID %s twice: %s", n.name, r.ID, b)
					}
					ids[r.ID] = true
				}
				return len(rs.Rules) == 2*each
			})
		}
	})

	for _, n := range nodes {
		if l := n.logs(); strings.Contains(l, "storing a profile revision failed") || strings.Contains(l, "duplicate key") {
			t.Errorf("node %s logged a failed revision or a duplicate key:\n%s", n.name, tail(l))
		}
	}
}

// TestSeamClusterRollouts: a rollout made on A is offered to a device
// pushing on B, the device's upgrade through B moves it to its new
// firmware's profile on every node, and a change of that profile made on
// A tells the device's connection on B to push.
func TestSeamClusterRollouts(t *testing.T) {
	t.Parallel()
	dsn := dbtest.Need(t, dbtest.Postgres, pg).NewDB(t)
	nats := startNATS(t)
	a := startNode(t, "a", dsn, nats.url(), "--rollout-interval", "200ms")
	b := startNode(t, "b", dsn, nats.url(), "--rollout-interval", "200ms")
	d := registerAs(t, a, "m-seam-roll", "SEAM-ROLL", "1.0")
	fwd := &fwDevice{r: d, firmware: "1.0"}
	within(t, converge, "b knows the device", func() bool { st, _ := pushAt(t, b, d.Token, 0); return st == 200 })
	fwd.push(t, a, "")
	conn := dial(t, b, d.Token)

	req, _ := http.NewRequest("POST", a.base+"/api/v1/firmware", strings.NewReader(`{"device_type":"SEAM-ROLL","version":"2.0","sha256":"`+
		strings.Repeat("ab", 32)+`","size":1024,"url":"https://files.example/seam-2.0.bin"}`))
	req.Header.Set("Authorization", "Bearer "+adminToken)
	req.Header.Set("Content-Type", "application/json")
	resp, err := a.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	st := resp.StatusCode
	var fw struct {
		ID uint64 `json:"id,string"`
	}
	if st != 201 || json.Unmarshal(body, &fw) != nil {
		t.Fatalf("firmware on a: %d %s", st, body)
	}
	st, body = a.do("POST", "/api/v1/rollouts", adminToken, fmt.Sprintf(`{"firmware_id":%d,"filter":"device_type=SEAM-ROLL","waves":["100%%"]}`, fw.ID))
	var ro rolloutView
	if st != 201 || json.Unmarshal(body, &ro) != nil || ro.Total != 1 {
		t.Fatalf("rollout on a: %d %s", st, body)
	}
	var o *offer
	within(t, 15*time.Second, "b offers the rollout made on a", func() bool {
		o = fwd.push(t, b, "")
		return o != nil
	})
	if o.Rollout != ro.ID || o.Version != "2.0" {
		t.Fatalf("offer on b: %+v", o)
	}
	fwd.push(t, b, fmt.Sprintf(`{"rollout":%d,"state":"installing"}`, ro.ID))
	fwd.firmware = "2.0"
	fwd.push(t, b, "")
	var prof string
	within(t, 10*time.Second, "the upgrade through b counted on a, the device on its new profile", func() bool {
		v := getRollout(t, a, ro.ID)
		prof = deviceProfile(t, a, d.DeviceID)
		return v.Counts["verified"] == 1 && prof != "" && prof == deviceProfile(t, b, d.DeviceID) && len(revisions(t, a, prof)) > 0 &&
			strings.Contains(revisions(t, a, prof)[0].Note, "inherited")
	})
	conn.drain()
	start := time.Now()
	v := patchProfile(t, a, prof, `{"config":{"after":"2.0"}}`)
	conn.nudged(t, converge, start, "the upgraded device's new profile changed on a")
	if st, ans := pushAt(t, b, d.Token, 0); st != 200 || ans.Config == nil || ans.Config.Version != v {
		t.Fatalf("push on b after the nudge: %d %+v, want configuration version %d", st, ans, v)
	}
}

// profileOf reads profile id on n: its status, push interval and version.
func profileOf(t *testing.T, n *node, id string) (int, int, int64) {
	t.Helper()
	st, b := n.do("GET", "/api/v1/profiles/"+id, adminToken, "")
	var p struct {
		PushInterval int   `json:"push_interval"`
		Version      int64 `json:"version"`
	}
	if st == 200 && json.Unmarshal(b, &p) != nil {
		t.Fatalf("profile %s on %s: %s", id, n.name, b)
	}
	return st, p.PushInterval, p.Version
}

// TestSeamClusterProfilePolicy: approving a pending firmware on A moves
// its devices to their new profile on B too, and tells B's connection to
// push when what the device gets changed, as on A; a firmware linked to
// a profile on A is pending on B too, and approved there; a profile deleted on A
// is gone on B, and a registration on B of its type and firmware makes a
// new one.
func TestSeamClusterProfilePolicy(t *testing.T) {
	t.Parallel()
	_, _, nodes := startCluster(t, "a", "b")
	a, b := nodes[0], nodes[1]

	t.Run("firmware approved on A", func(t *testing.T) {
		d := registerAs(t, a, "m-seam-approve", "SEAM-APPROVE", "1.0")
		old := deviceProfile(t, a, d.DeviceID)
		patchProfile(t, a, old, `{"push_interval":90}`)
		if st, body := a.do("PUT", "/api/v1/profiles/policy", adminToken, `{"mode":"join","carry":"inherit","create_limit":10,"create_window":86400}`); st != 200 {
			t.Fatalf("policy on a: %d %s", st, body)
		}
		fwd := &fwDevice{r: d, firmware: "2.0"}
		fwd.push(t, a, "") // linked to its profile on a: pending
		within(t, converge, "b has the device on firmware 2.0 and its old profile", func() bool {
			st, body := b.do("GET", "/api/v1/devices/"+d.DeviceID, adminToken, "")
			return st == 200 && strings.Contains(string(body), `"firmware":"2.0"`) && deviceProfile(t, b, d.DeviceID) == old
		})
		if st, ans := pushAt(t, b, d.Token, 0); st != 200 || ans.PushInterval != 90 {
			t.Fatalf("push on b before the approval: %d %+v, want push_interval 90", st, ans)
		}
		conn := dial(t, b, d.Token)
		conn.drain()
		start := time.Now()
		st, body := a.do("POST", "/api/v1/profiles/approve", adminToken, `{"device_type":"SEAM-APPROVE","firmware":"2.0","carry":"empty"}`)
		var p struct {
			ID string `json:"id"`
		}
		if st != 201 || json.Unmarshal(body, &p) != nil || p.ID == "" || p.ID == old {
			t.Fatalf("approve on a: %d %s", st, body)
		}
		if got := deviceProfile(t, a, d.DeviceID); got != p.ID {
			t.Fatalf("device on a after the approval: profile %s, want %s", got, p.ID)
		}
		conn.nudged(t, converge, start, "firmware approved on a")
		if got := deviceProfile(t, b, d.DeviceID); got != p.ID {
			t.Fatalf("device on b after the approval: profile %s, want %s", got, p.ID)
		}
		if st, ans := pushAt(t, b, d.Token, 0); st != 200 || ans.PushInterval != 60 {
			t.Fatalf("push on b after the approval: %d %+v, want the new profile's push_interval 60", st, ans)
		}
		for _, n := range nodes {
			if st, body := n.do("GET", "/api/v1/profiles/pending", adminToken, ""); st != 200 || strings.Contains(string(body), "SEAM-APPROVE") {
				t.Fatalf("pending firmware on %s after the approval: %d %s", n.name, st, body)
			}
		}
	})

	t.Run("firmware linked on A, approved on B", func(t *testing.T) {
		d := registerAs(t, a, "m-seam-link", "SEAM-LINK", "1.0")
		old := deviceProfile(t, a, d.DeviceID)
		fwd := &fwDevice{r: d, firmware: "3.0"}
		fwd.push(t, a, "")
		within(t, converge, "b lists the firmware linked on a as pending", func() bool {
			st, body := b.do("GET", "/api/v1/profiles/pending", adminToken, "")
			return st == 200 && strings.Contains(string(body), `"device_type":"SEAM-LINK","firmware":"3.0"`)
		})
		st, body := b.do("POST", "/api/v1/profiles/approve", adminToken, `{"device_type":"SEAM-LINK","firmware":"3.0"}`)
		var p struct {
			ID string `json:"id"`
		}
		if st != 201 || json.Unmarshal(body, &p) != nil || p.ID == "" || p.ID == old {
			t.Fatalf("approve on b: %d %s", st, body)
		}
		within(t, converge, "the device on its new profile on both nodes, nothing pending", func() bool {
			for _, n := range nodes {
				st, body := n.do("GET", "/api/v1/profiles/pending", adminToken, "")
				if deviceProfile(t, n, d.DeviceID) != p.ID || st != 200 || strings.Contains(string(body), "SEAM-LINK") {
					return false
				}
			}
			return true
		})
	})

	t.Run("profile deleted on A", func(t *testing.T) {
		d := registerAs(t, a, "m-seam-del", "SEAM-DEL", "1.0")
		prof := deviceProfile(t, a, d.DeviceID)
		within(t, converge, "b knows the device", func() bool { return deviceProfile(t, b, d.DeviceID) == prof })
		if st, body := a.do("DELETE", "/api/v1/devices/"+d.DeviceID, adminToken, ""); st != 200 {
			t.Fatalf("delete device on a: %d %s", st, body)
		}
		within(t, converge, "b forgets the device", func() bool { return deviceProfile(t, b, d.DeviceID) == "" })
		if st, body := a.do("DELETE", "/api/v1/profiles/"+prof, adminToken, ""); st != 200 {
			t.Fatalf("delete profile on a: %d %s", st, body)
		}
		within(t, converge, "b forgets the profile", func() bool { st, _, _ := profileOf(t, b, prof); return st == 404 })
		r := registerAs(t, b, "m-seam-del-2", "SEAM-DEL", "1.0")
		got := deviceProfile(t, b, r.DeviceID)
		if got == "" || got == prof {
			t.Fatalf("registered on b after the deletion: profile %q, want a new one, not %s", got, prof)
		}
		within(t, converge, "a knows the new profile", func() bool { return deviceProfile(t, a, r.DeviceID) == got })
		if st, _, _ := profileOf(t, a, got); st != 200 {
			t.Fatalf("the new profile %s on a: %d", got, st)
		}
	})
}

// TestSeamClusterAlertIDs: alert events raised by a leader and by the
// node that takes over from it each keep their own event: their IDs come
// from the database, never from a node's memory of the IDs it saw.
func TestSeamClusterAlertIDs(t *testing.T) {
	t.Parallel()
	dsn := dbtest.Need(t, dbtest.Postgres, pg).NewDB(t)
	nats := startNATS(t)
	a := startNode(t, "a", dsn, nats.url())
	within(t, 10*time.Second, "a leads", func() bool { return leads(t, a) })
	b := startNode(t, "b", dsn, nats.url())
	if st, body := a.do("POST", "/api/v1/alerts/rules", adminToken, `{"name":"rebooted","kind":"reboot","seconds":600}`); st != 201 {
		t.Fatalf("rule on a: %d %s", st, body)
	}
	within(t, 10*time.Second, "b has the rule", func() bool {
		st, body := b.do("GET", "/api/v1/alerts/rules", adminToken, "")
		return st == 200 && strings.Contains(string(body), `"rebooted"`)
	})
	const each = 3
	var regs []registration
	for i := range 2 * each {
		regs = append(regs, registerAs(t, a, fmt.Sprintf("m-seam-alert-%d", i), "SEAM-ALERT", "1.0"))
	}
	within(t, converge, "b knows the devices", func() bool {
		for _, r := range regs {
			if deviceProfile(t, b, r.DeviceID) == "" {
				return false
			}
		}
		return true
	})
	// reboot pushes uptime 1000, then 5, on n: the leader raises an alert.
	reboot := func(n *node, r registration) {
		for _, up := range []int{1000, 5} {
			seqMu.Lock()
			seq[r.Token]++
			s := seq[r.Token]
			seqMu.Unlock()
			if st, body := n.do("POST", "/api/v1/push", r.Token, fmt.Sprintf(`{"seq":%d,"config_version":0,"state":{"uptime":%d}}`, s, up)); st != 200 {
				t.Fatalf("push on %s: %d %s", n.name, st, body)
			}
		}
	}
	// events lists the stored alert events as n shows them: IDs, and how
	// many events.
	events := func(n *node) (map[string]bool, int) {
		st, body := n.do("GET", "/api/v1/alerts?limit=100", adminToken, "")
		var v struct {
			Alerts []struct {
				ID       string `json:"id"`
				DeviceID string `json:"device_id"`
			} `json:"alerts"`
		}
		if st != 200 || json.Unmarshal(body, &v) != nil {
			t.Fatalf("alerts on %s: %d %s", n.name, st, body)
		}
		ids := map[string]bool{}
		for _, e := range v.Alerts {
			ids[e.ID] = true
		}
		return ids, len(v.Alerts)
	}
	for _, r := range regs[:each] {
		reboot(a, r)
	}
	within(t, 5*time.Second, "a stored its alerts", func() bool { _, n := events(a); return n == each })

	// A stops; B takes over and raises alerts at once, before any check
	// of its own.
	a.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-a.exited:
		a.exited <- err
	case <-time.After(30 * time.Second):
		t.Fatal("a did not stop")
	}
	within(t, 10*time.Second, "b leads", func() bool { return leads(t, b) })
	for _, r := range regs[each:] {
		reboot(b, r)
	}
	within(t, 5*time.Second, "b stored every alert", func() bool {
		ids, n := events(b)
		if len(ids) != n {
			t.Fatalf("alerts on b: %d events, %d IDs", n, len(ids))
		}
		return n == 2*each
	})
	for _, n := range []*node{a, b} {
		if l := n.logs(); strings.Contains(l, "no event ID") {
			t.Errorf("node %s logged a missing event ID:\n%s", n.name, tail(l))
		}
	}
}

// TestSeamClusterAccess: an operator's role changed or API token revoked
// on A holds on B at once, as on A, not when B's cache of users and
// tokens expires: B drops it when it reads the change log entry.
func TestSeamClusterAccess(t *testing.T) {
	t.Parallel()
	_, _, nodes := startCluster(t, "a", "b")
	a, b := nodes[0], nodes[1]
	if st, body := a.do("POST", "/api/v1/users", adminToken, `{"name":"seam-op","role":"admin","password":"seam-password-1"}`); st != 201 {
		t.Fatalf("user on a: %d %s", st, body)
	}
	st, body := a.do("POST", "/api/v1/tokens", adminToken, `{"user":"seam-op","name":"seam"}`)
	var tok struct {
		ID    string `json:"id"`
		Token string `json:"token"`
	}
	if st != 201 || json.Unmarshal(body, &tok) != nil || tok.Token == "" {
		t.Fatalf("token on a: %d %s", st, body)
	}
	// B's cache lasts 2 s: each change must hold on B within the bound of
	// every other change, right after B used (and cached) the token.
	const limit = converge

	t.Run("role changed on A", func(t *testing.T) {
		if st, body := b.do("GET", "/api/v1/users", tok.Token, ""); st != 200 {
			t.Fatalf("admin call on b: %d %s", st, body)
		}
		if st, body := a.do("PATCH", "/api/v1/users/seam-op", adminToken, `{"role":"viewer"}`); st != 200 {
			t.Fatalf("role change on a: %d %s", st, body)
		}
		within(t, limit, "b refuses the viewer an admin call", func() bool {
			st, _ := b.do("GET", "/api/v1/users", tok.Token, "")
			return st == 403
		})
	})

	t.Run("token revoked on A", func(t *testing.T) {
		// A new token: B caches it at its first use, just below.
		st, body := a.do("POST", "/api/v1/tokens", adminToken, `{"user":"seam-op","name":"seam-2"}`)
		var tok struct {
			ID    string `json:"id"`
			Token string `json:"token"`
		}
		if st != 201 || json.Unmarshal(body, &tok) != nil || tok.Token == "" {
			t.Fatalf("token on a: %d %s", st, body)
		}
		if st, body := b.do("GET", "/api/v1/devices", tok.Token, ""); st != 200 {
			t.Fatalf("viewer call on b: %d %s", st, body)
		}
		if st, body := a.do("DELETE", "/api/v1/tokens/"+tok.ID, adminToken, ""); st != 200 {
			t.Fatalf("revoke on a: %d %s", st, body)
		}
		within(t, limit, "b refuses the revoked token", func() bool {
			st, _ := b.do("GET", "/api/v1/devices", tok.Token, "")
			return st == 401
		})
	})
}

// TestSeamClusterAlertSettings: an alert rule made on B, which does not
// lead, is evaluated by the leader A at its next push, not at its next
// check; e-mail settings set on B are the leader's at once, not after
// its restart.
func TestSeamClusterAlertSettings(t *testing.T) {
	t.Parallel()
	dsn := dbtest.Need(t, dbtest.Postgres, pg).NewDB(t)
	nats := startNATS(t)
	a := startNode(t, "a", dsn, nats.url())
	within(t, 10*time.Second, "a leads", func() bool { return leads(t, a) })
	b := startNode(t, "b", dsn, nats.url())
	d := registerAs(t, a, "m-seam-alert-rule", "SEAM-ALERT-RULE", "1.0")
	// A's own check reloads the rules every 5 s: the rule must hold on A
	// within the bound of every other change.
	const limit = converge

	t.Run("rule made on B", func(t *testing.T) {
		if st, body := b.do("POST", "/api/v1/alerts/rules", adminToken, `{"name":"seam-hot","kind":"cpu_above","threshold":50}`); st != 201 {
			t.Fatalf("rule on b: %d %s", st, body)
		}
		within(t, limit, "a raises the alert of the rule made on b", func() bool {
			seqMu.Lock()
			seq[d.Token]++
			s := seq[d.Token]
			seqMu.Unlock()
			if st, body := a.do("POST", "/api/v1/push", d.Token, fmt.Sprintf(`{"seq":%d,"config_version":0,"state":{"cpu":90}}`, s)); st != 200 {
				t.Fatalf("push on a: %d %s", st, body)
			}
			st, body := a.do("GET", "/api/v1/alerts?device_id="+d.DeviceID, adminToken, "")
			return st == 200 && strings.Contains(string(body), `"seam-hot"`)
		})
	})

	t.Run("e-mail settings set on B", func(t *testing.T) {
		if st, body := b.do("PUT", "/api/v1/alerts/smtp", adminToken, `{"addr":"smtp.seam.example:587","from":"drover@seam.example"}`); st != 200 {
			t.Fatalf("smtp on b: %d %s", st, body)
		}
		within(t, converge, "a has the e-mail settings set on b", func() bool {
			st, body := a.do("GET", "/api/v1/alerts/smtp", adminToken, "")
			return st == 200 && strings.Contains(string(body), "smtp.seam.example:587")
		})
	})
}

// TestSeamClusterRolloutPolicies: a rollout policy set on A is there on
// B; replaced on B, A reads the new plan; deleted on A, B forgets it.
func TestSeamClusterRolloutPolicies(t *testing.T) {
	t.Parallel()
	_, _, nodes := startCluster(t, "a", "b")
	a, b := nodes[0], nodes[1]
	if st, body := a.do("PUT", "/api/v1/rollout-policies/slow", adminToken, `{"waves":["1","50%"],"max_failure_pct":5}`); st != 201 {
		t.Fatalf("policy on a: %d %s", st, body)
	}
	within(t, converge, "b has the policy set on a", func() bool {
		st, body := b.do("GET", "/api/v1/rollout-policies/slow", adminToken, "")
		return st == 200 && strings.Contains(string(body), `"waves":["1","50%"]`)
	})
	if st, body := b.do("PUT", "/api/v1/rollout-policies/slow", adminToken, `{"waves":["100%"]}`); st != 200 {
		t.Fatalf("policy replaced on b: %d %s", st, body)
	}
	within(t, converge, "a has the plan replaced on b", func() bool {
		st, body := a.do("GET", "/api/v1/rollout-policies/slow", adminToken, "")
		return st == 200 && strings.Contains(string(body), `"waves":["100%"]`)
	})
	if st, body := a.do("DELETE", "/api/v1/rollout-policies/slow", adminToken, ""); st != 200 {
		t.Fatalf("delete on a: %d %s", st, body)
	}
	within(t, converge, "b forgets the policy deleted on a", func() bool {
		st, _ := b.do("GET", "/api/v1/rollout-policies/slow", adminToken, "")
		return st == 404
	})
}
