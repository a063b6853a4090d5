package clustertest

import (
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/drover/drover/internal/emulator/results"
)

// Fleet of the scenarios: 1,000 devices pushing every 5 s (200 pushes/s)
// through HAProxy, a new TCP connection and TLS handshake per push.
const (
	fleet    = 1000
	interval = 5 * time.Second
)

// TestCluster runs three nodes (one without cluster mode in the build)
// behind HAProxy and, under the emulator's load: pauses NATS, restarts
// PostgreSQL, replaces every node by a new binary one by one (a rolling
// upgrade), kills a node with SIGKILL. After each, every push the
// emulator saw acknowledged is in the database, and the answers were
// never wrong.
func TestCluster(t *testing.T) {
	l := newLab(t)
	n := 3
	if !l.cluster {
		n = 1
		t.Logf("this build has no drover serve --cluster: one node behind HAProxy")
	}
	l.startNodes(n)
	l.register(fleet)
	t.Run("pause-nats", func(t *testing.T) { l.pauseNATS(t) })
	t.Run("restart-postgres", func(t *testing.T) { l.restartPostgres(t) })
	if n > 1 {
		t.Run("rolling-upgrade", func(t *testing.T) { l.rollingUpgrade(t) })
	}
	t.Run("kill-node", func(t *testing.T) { l.killNode(t) })
}

// counters scrapes every node's accepted pushes; nodes that do not answer
// are left out.
func (l *lab) counters() map[string]int64 {
	out := map[string]int64{}
	for _, nd := range l.nodes {
		if v, err := l.accepted(nd); err == nil {
			out[nd.name] = v
		}
	}
	return out
}

// checkAcks fails for every acknowledged push missing from the database.
func (l *lab) checkAcks(t *testing.T, acks []ack) map[pushKey]bool {
	t.Helper()
	stored, _ := l.stored()
	lost := 0
	for _, a := range acks {
		if !stored[pushKey{a.DeviceID, a.Seq}] {
			if lost++; lost <= 5 {
				t.Errorf("acknowledged push lost: device %s seq %d (node %s)", a.DeviceID, a.Seq, a.Node)
			}
		}
	}
	if lost > 0 {
		t.Errorf("%d of %d acknowledged pushes are not in the database", lost, len(acks))
	}
	return stored
}

// checkEquation: the emulator's accepted count is the sum of the nodes'
// drover_pushes_total{outcome="accepted"} over the run (extra: pushes the
// test itself made, by node), node by node.
func checkEquation(t *testing.T, sum *results.Summary, before, after, extra map[string]int64) {
	t.Helper()
	push := sum.Op(results.OpPush)
	var total int64
	for node, got := range after {
		want := push.AcceptedByNode[node] + extra[node]
		if d := got - before[node]; d != want {
			t.Errorf("node %s counted %d accepted pushes; the emulator %d and the test %d through it", node, d, push.AcceptedByNode[node], extra[node])
		}
		total += push.AcceptedByNode[node]
	}
	if total != push.Accepted {
		t.Errorf("emulator: %d accepted, %d by the nodes' headers %v", push.Accepted, total, push.AcceptedByNode)
	}
}

// checkNoWrongAnswer: the emulator got no answer but 200 and, where
// allowed, 503; a 401 would be a valid token refused.
func checkNoWrongAnswer(t *testing.T, sum *results.Summary, allow503 bool) {
	t.Helper()
	for _, op := range []string{results.OpPush, results.OpRegister} {
		c := sum.Op(op).Counts
		for st, k := range c.Rejected {
			if st != "503" || !allow503 {
				t.Errorf("emulator %s: %d answered %s", op, k, st)
			}
		}
		if c.Reregistered != 0 {
			t.Errorf("emulator %s: %d valid tokens refused (401, registered again)", op, c.Reregistered)
		}
	}
}

// probeDevice is a device the test drives itself.
type probeDevice struct {
	id, token, key, machine string
	mu                      sync.Mutex
	seq                     int64
}

func (l *lab) registerProbe(t *testing.T, base, machine, bearer, key string) *probeDevice {
	t.Helper()
	body := fmt.Sprintf(`{"machine_id":%q,"device_type":"probe","firmware":"1","enrollment_secret":%q`, machine, secret)
	if key != "" {
		body += fmt.Sprintf(`,"device_key":%q`, key)
	}
	st, node, b, _ := l.do(base, "POST", "/api/v1/register", bearer, body+"}")
	if st != 200 {
		t.Fatalf("register %s on %s (%s): %d %s", machine, base, node, st, b)
	}
	var r struct {
		DeviceID  string `json:"device_id"`
		Token     string `json:"token"`
		DeviceKey string `json:"device_key"`
	}
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	if r.DeviceKey == "" {
		r.DeviceKey = key
	}
	return &probeDevice{id: r.DeviceID, token: r.Token, key: r.DeviceKey, machine: machine}
}

// push pushes d with token to base: the answer's status (0: none, then
// body is the error), node and Retry-After, and the push's key.
func (l *lab) push(base string, d *probeDevice, token string) (st int, node string, k pushKey, retryAfter string, body []byte) {
	d.mu.Lock()
	d.seq++
	seq := d.seq
	d.mu.Unlock()
	st, node, body, retryAfter = l.do(base, "POST", "/api/v1/push", token, fmt.Sprintf(`{"seq":%d,"state":{"uptime":%d}}`, seq, seq))
	return st, node, pushKey{d.id, seq}, retryAfter, body
}

// pauseNATS stops NATS (SIGSTOP) for 6 s under load. Meanwhile, on the
// first node, a device registers again (new token), one is blocked, one
// deleted, one new registered; on every other node the old token must not
// get 200 later than 1 s after the change, the new ones must never get 401,
// the blocked and deleted devices must not get 200 later than 1 s after. 503 (with Retry-After) is always an acceptable answer.
// Once NATS is back, every node gives the exact answer.
func (l *lab) pauseNATS(t *testing.T) {
	first, others := l.nodes[0], l.nodes[1:]
	if len(others) == 0 {
		others = l.nodes
	}
	var probes []*probeDevice
	for i := range 5 {
		probes = append(probes, l.registerProbe(t, first.url, fmt.Sprintf("nats-probe-%d", i), "", ""))
	}
	for _, p := range probes {
		for _, nd := range l.nodes {
			if st, _, _, _, _ := l.push(nd.url, p, p.token); st != 200 {
				t.Fatalf("push of %s on %s: %d", p.id, nd.name, st)
			}
		}
	}
	extra := map[string]int64{} // the test's own accepted pushes from here on, by node
	before := l.counters()
	em := l.emulate(fleet, "--interval", interval.String(), "--duration", "18s", "--max-retry-wait", "10s")
	time.Sleep(4 * time.Second) // the scenario: 4 s of load, then the fault
	if err := l.nats.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	paused := true
	defer func() {
		if paused {
			l.nats.Process.Signal(syscall.SIGCONT)
		}
	}()
	time.Sleep(500 * time.Millisecond) // the changes below fall well inside the pause

	rotated, blocked, deleted, valid := probes[0], probes[1], probes[2], probes[3]
	oldToken := rotated.token
	renewed := l.registerProbe(t, first.url, rotated.machine, rotated.token, rotated.key)
	if renewed.id != rotated.id {
		t.Fatalf("re-registration moved device %s to %s", rotated.id, renewed.id)
	}
	renewed.seq = 1000
	if st, _, b, _ := l.do(first.url, "POST", "/api/v1/devices/"+blocked.id+"/block", adminToken, ""); st != 200 {
		t.Fatalf("block: %d %s", st, b)
	}
	if st, _, b, _ := l.do(first.url, "DELETE", "/api/v1/devices/"+deleted.id, adminToken, ""); st != 200 {
		t.Fatalf("delete: %d %s", st, b)
	}
	fresh := l.registerProbe(t, first.url, "nats-probe-new", "", "")
	// Without NATS, other nodes learn a change from the change log, which
	// they read every 250 ms: a revoked credential may still be accepted
	// for up to 1 s after the change (the cluster's bound), never later. A
	// valid credential is never refused (a node checks the database first).
	changed := time.Now()
	const bound = time.Second

	type probe struct {
		name  string
		dev   *probeDevice
		token string
		wrong map[int]bool // answers that would be wrong
		exact int          // the answer once NATS is back
	}
	probeSet := []probe{
		{"old token after re-registration", rotated, oldToken, map[int]bool{200: true}, 401},
		{"new token", renewed, renewed.token, map[int]bool{401: true, 403: true}, 200},
		{"blocked device", blocked, blocked.token, map[int]bool{200: true, 401: true}, 403},
		{"deleted device", deleted, deleted.token, map[int]bool{200: true}, 401},
		{"device registered during the pause", fresh, fresh.token, map[int]bool{401: true, 403: true}, 200},
		{"untouched device", valid, valid.token, map[int]bool{401: true, 403: true}, 200},
	}
	seen := map[string]map[int]int{}
	staleSeen := map[string]int{} // revoked credentials accepted within the bound
	var acked []pushKey
	round := func(exactOnly bool) (allExact bool) {
		allExact = true
		for _, p := range probeSet {
			for _, nd := range others {
				st, node, k, ra, _ := l.push(nd.url, p.dev, p.token)
				if seen[p.name] == nil {
					seen[p.name] = map[int]int{}
				}
				seen[p.name][st]++
				stale := st == 200 && p.exact != 200 && time.Since(changed) < bound
				if stale {
					staleSeen[p.name]++
				} else if p.wrong[st] || st == 0 || (st == 503 && ra == "") {
					t.Errorf("%s on %s: %d (Retry-After %q)", p.name, nd.name, st, ra)
				}
				if st == 200 {
					acked = append(acked, k)
					extra[node]++
				}
				if st != p.exact {
					allExact = false
				}
			}
		}
		return allExact
	}
	// 5 s of the pause, a round of probe pushes every 200 ms: the pacing
	// is part of the load the counts are checked against.
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); {
		round(false)
		time.Sleep(200 * time.Millisecond)
	}
	if err := l.nats.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	paused = false
	resumed := time.Now()
	converged := time.Duration(-1)
	for time.Since(resumed) < 15*time.Second {
		if round(true) {
			converged = time.Since(resumed)
			break
		}
		time.Sleep(200 * time.Millisecond) // the same pacing as during the pause
	}
	if converged < 0 {
		t.Errorf("15 s after NATS came back the nodes still do not all answer exactly: %v", seen)
	}
	sum, acks := em.wait(t)
	t.Logf("answers while NATS was paused and after: %v (of the 200s, accepted within %v of the change: %v); exact on every node %v after NATS came back", seen, bound, staleSeen, converged.Round(time.Millisecond))
	logRun(t, sum)
	checkNoWrongAnswer(t, sum, true)
	stored := l.checkAcks(t, acks)
	for _, k := range acked {
		if !stored[k] {
			t.Errorf("probe push %v answered 200 is not in the database", k)
		}
	}
	checkEquation(t, sum, before, l.counters(), extra)
}

func logRun(t *testing.T, sum *results.Summary) {
	t.Helper()
	p := sum.Op(results.OpPush)
	t.Logf("emulator: %d pushes accepted %v, rejected %v, dropped %v, retried %d, late %d, %.0f/s",
		p.Accepted, p.AcceptedByNode, p.Rejected, p.Dropped, p.Retried, p.Late, p.AcceptedRate())
}

// restartPostgres stops PostgreSQL under load for 4 s and starts it again.
// Every answer is 200 or 503 with Retry-After; every 200 is in the
// database afterwards; pushes are accepted again after it returns.
func (l *lab) restartPostgres(t *testing.T) {
	var probes []*probeDevice
	for i := range 6 {
		probes = append(probes, l.registerProbe(t, l.lbURL, fmt.Sprintf("pg-probe-%d", i), "", ""))
	}
	before := l.counters()
	em := l.emulate(fleet, "--interval", interval.String(), "--duration", "20s", "--max-retry-wait", "10s")
	type answer struct {
		st   int
		ra   string
		node string
		k    pushKey
		at   time.Time
		body []byte
	}
	var mu sync.Mutex
	var answers []answer
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, p := range probes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				st, node, k, ra, body := l.push(l.lbURL, p, p.token)
				mu.Lock()
				answers = append(answers, answer{st, ra, node, k, time.Now(), body})
				mu.Unlock()
				time.Sleep(50 * time.Millisecond) // a probe push every 50 ms: load, not a wait
			}
		}()
	}
	time.Sleep(5 * time.Second) // the scenario: 5 s of load, then the fault
	stopping := time.Now()
	if err := l.pg.Stop(); err != nil {
		// Killed: go on, so it restarts for the next scenario.
		t.Error(err)
	}
	down := time.Now()
	t.Logf("PostgreSQL took %v to stop (fast shutdown)", down.Sub(stopping).Round(time.Millisecond))
	time.Sleep(4 * time.Second) // the outage's length is the scenario
	if err := l.pg.Restart(); err != nil {
		t.Fatal(err)
	}
	up := time.Now()
	sum, acks := em.wait(t)
	close(stop)
	wg.Wait()

	extra := map[string]int64{}
	statuses := map[int]int{}
	var unavailable, recoveredAfter int
	firstOKAfterUp := time.Duration(-1)
	for _, a := range answers {
		statuses[a.st]++
		switch {
		case a.st == 200:
			extra[a.node]++
			if a.at.After(up) && firstOKAfterUp < 0 {
				firstOKAfterUp = a.at.Sub(up)
			}
			if a.at.After(up) {
				recoveredAfter++
			}
		case a.st == 503:
			unavailable++
			if a.ra == "" {
				t.Errorf("503 without Retry-After from %s", a.node)
			}
		default:
			t.Errorf("probe push answered %d (node %q) at %v after PostgreSQL stopped: %.200s", a.st, a.node, a.at.Sub(down).Round(time.Millisecond), a.body)
		}
	}
	t.Logf("PostgreSQL down %v; probe answers %v; first 200 %v after it returned", up.Sub(down).Round(time.Millisecond), statuses, firstOKAfterUp.Round(time.Millisecond))
	logRun(t, sum)
	if unavailable == 0 {
		t.Error("no probe push was answered 503 while PostgreSQL was down")
	}
	if recoveredAfter == 0 {
		t.Error("no probe push was accepted after PostgreSQL returned")
	}
	checkNoWrongAnswer(t, sum, true)
	stored := l.checkAcks(t, acks)
	for _, a := range answers {
		if a.st == 200 && !stored[a.k] {
			t.Errorf("probe push %v answered 200 by %s at %v is not in the database", a.k, a.node, a.at.Sub(down).Round(time.Millisecond))
		}
	}
	checkEquation(t, sum, before, l.counters(), extra)
}

// killNode kills the last node with SIGKILL under load. Nothing it
// acknowledged is lost, every device goes on being accepted through the
// other nodes (with one node, after it restarts), and the counts add up:
// the surviving nodes' counters equal the emulator's accepted pushes by
// their X-Drover-Node header; the killed node's final counter, which died
// with it, is what the database gained minus what the survivors counted,
// and lies between what the emulator saw it acknowledge and that plus the
// requests cut off by the kill (stored, but their answer never arrived).
func (l *lab) killNode(t *testing.T) {
	victim := l.nodes[len(l.nodes)-1]
	before := l.counters()
	_, samplesBefore := l.stored()
	em := l.emulate(fleet, "--interval", interval.String(), "--duration", "20s", "--max-retry-wait", "10s")
	time.Sleep(6 * time.Second) // the scenario: 6 s of load, then the kill
	lastScrape, err := l.accepted(victim)
	if err != nil {
		t.Fatal(err)
	}
	l.kill(victim)
	killed := time.Now()
	resumeAfter := killed
	if len(l.nodes) == 1 {
		time.Sleep(time.Second) // the only node stays down a second: the outage
		l.start(victim)         // its counters start again from 0
		resumeAfter = time.Now()
	}
	sum, acks := em.wait(t)
	after := l.counters()
	_, samplesAfter := l.stored()
	logRun(t, sum)
	checkNoWrongAnswer(t, sum, false)
	l.checkAcks(t, acks)

	push := sum.Op(results.OpPush)
	byDevice := map[string]bool{}
	victimAcks := int64(0)
	for _, a := range acks {
		at := time.UnixMilli(a.AtMS)
		if a.Node == victim.name && at.Before(killed.Add(time.Millisecond)) {
			victimAcks++
		}
		if at.After(resumeAfter) {
			byDevice[a.DeviceID] = true
		}
	}
	if len(byDevice) != fleet {
		t.Errorf("%d of %d devices had a push accepted after the kill", len(byDevice), fleet)
	}
	if d := push.DroppedTotal(); len(l.nodes) > 1 && d > 200 {
		t.Errorf("%d pushes dropped: more than were in flight at the kill", d)
	}
	// The survivors (with one node: the restarted one, from 0).
	var survivors int64
	for _, nd := range l.nodes {
		base := before[nd.name]
		if nd == victim {
			base = 0
			if len(l.nodes) > 1 {
				continue
			}
		}
		got, ok := after[nd.name]
		if !ok {
			t.Fatalf("node %s did not answer /metrics", nd.name)
		}
		want := push.AcceptedByNode[nd.name]
		if nd == victim {
			want -= victimAcks // its pushes before the kill belong to the dead process
		}
		if got-base != want {
			t.Errorf("node %s counted %d accepted pushes, the emulator %d through it", nd.name, got-base, want)
		}
		survivors += got - base
	}
	victimFinal := samplesAfter - samplesBefore - survivors
	cutOff := push.DroppedTotal() + push.Aborted
	t.Logf("killed %s: last scrape %d, acknowledged to the emulator %d, final counter from the database %d (%d stored but unanswered; %d cut off)",
		victim.name, lastScrape-before[victim.name], victimAcks, victimFinal, victimFinal-victimAcks, cutOff)
	if victimFinal < victimAcks || victimFinal > victimAcks+cutOff || victimFinal < lastScrape-before[victim.name] {
		t.Errorf("killed node's final counter %d: want %d..%d (acknowledged .. + cut off) and ≥ its last scrape %d",
			victimFinal, victimAcks, victimAcks+cutOff, lastScrape-before[victim.name])
	}
	if push.Accepted != survivors+victimAcks {
		t.Errorf("emulator accepted %d ≠ survivors' counters %d + the killed node's acknowledged %d", push.Accepted, survivors, victimAcks)
	}
	nodes := make([]string, 0, len(push.AcceptedByNode))
	for n := range push.AcceptedByNode {
		nodes = append(nodes, n+"="+strconv.FormatInt(push.AcceptedByNode[n], 10))
	}
	sort.Strings(nodes)
	t.Logf("accepted by node: %s", strings.Join(nodes, " "))
}
