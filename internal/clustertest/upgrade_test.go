package clustertest

import (
	"bufio"
	"encoding/csv"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/drover/drover/internal/emulator/results"
	"github.com/drover/drover/internal/testwait"
)

// haproxyAPI sends one command to HAProxy's runtime API and returns its
// answer.
func (l *lab) haproxyAPI(cmd string) (string, error) {
	c, err := net.DialTimeout("unix", l.lbAdmin, 5*time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, cmd+"\n"); err != nil {
		return "", err
	}
	b, err := io.ReadAll(bufio.NewReader(c))
	return string(b), err
}

// serverStat is one server's row of HAProxy's `show stat`.
type serverStat struct {
	status                      string
	current                     int64 // scur: connections open now
	connErrors, retries, redisp int64 // econ, wretr, wredis
}

// haproxyStats reads `show stat` by backend/server.
func (l *lab) haproxyStats(t *testing.T) map[string]serverStat {
	t.Helper()
	out, err := l.haproxyAPI("show stat")
	if err != nil {
		t.Fatalf("haproxy show stat: %v", err)
	}
	rd := csv.NewReader(strings.NewReader(strings.TrimPrefix(out, "# ")))
	rd.FieldsPerRecord = -1
	rows, err := rd.ReadAll()
	if err != nil || len(rows) < 2 {
		t.Fatalf("haproxy show stat: %v\n%s", err, out)
	}
	col := map[string]int{}
	for i, h := range rows[0] {
		col[h] = i
	}
	num := func(r []string, name string) int64 {
		v, _ := strconv.ParseInt(r[col[name]], 10, 64)
		return v
	}
	stats := map[string]serverStat{}
	for _, r := range rows[1:] {
		if len(r) < len(rows[0])-1 || r[col["svname"]] == "FRONTEND" || r[col["svname"]] == "BACKEND" {
			continue
		}
		stats[r[col["pxname"]]+"/"+r[col["svname"]]] = serverStat{
			status: r[col["status"]], current: num(r, "scur"),
			connErrors: num(r, "econ"), retries: num(r, "wretr"), redisp: num(r, "wredis"),
		}
	}
	return stats
}

// setState sets nd's administrative state in both backends.
func (l *lab) setState(t *testing.T, nd *node, state string) {
	t.Helper()
	for _, be := range []string{"drover", "drover_alive"} {
		out, err := l.haproxyAPI(fmt.Sprintf("set server %s/%s state %s", be, nd.name, state))
		if err != nil || strings.TrimSpace(out) != "" {
			t.Fatalf("haproxy set server %s/%s state %s: %v %q", be, nd.name, state, err, out)
		}
	}
}

// rollingUpgrade replaces every node, one by one, by a process of a new
// binary, under load, as docs/cluster.md's "Rolling upgrade" says: drain
// the node at HAProxy, wait until it holds no connection, stop it with
// SIGTERM, start the new binary, put it back in rotation once it is
// ready. The devices see no refused connection, no error and no lost
// push: HAProxy never tries a stopped node (no connection error, retry or
// redispatch), every answer is 200, every acknowledged push is stored.
func (l *lab) rollingUpgrade(t *testing.T) {
	newBin := filepath.Join(l.dir, "drover-next")
	b, err := os.ReadFile(droverBin)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(newBin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	statsBefore := l.haproxyStats(t)
	const load = 32 * time.Second
	em := l.emulate(fleet, "--interval", interval.String(), "--duration", load.String(), "--max-retry-wait", "10s")
	loadEnd := time.Now().Add(load)
	time.Sleep(3 * time.Second) // the scenario: load first, then the upgrade

	replacedAt := map[string]time.Time{}
	for _, nd := range l.nodes {
		start := time.Now()
		oldPID := nd.cmd.Process.Pid
		l.setState(t, nd, "drain")
		// A connection lasts at most HAProxy's client timeout (35 s).
		if !testwait.Until(40*time.Second, func() bool {
			st := l.haproxyStats(t)
			return st["drover/"+nd.name].current == 0 && st["drover_alive/"+nd.name].current == 0
		}) {
			t.Fatalf("node %s still holds connections 40 s after the drain: %+v", nd.name, l.haproxyStats(t))
		}
		drained := time.Since(start)
		if err := nd.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-nd.exited:
			if err != nil {
				t.Fatalf("node %s after SIGTERM: %v\n%s", nd.name, err, tail(nd.log.String()))
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("node %s did not stop within 20 s of SIGTERM", nd.name)
		}
		nd.bin = newBin
		l.start(nd) // waits until its /readyz answers 200
		if exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", nd.cmd.Process.Pid)); exe != newBin {
			t.Fatalf("node %s runs %q, want the new binary %s", nd.name, exe, newBin)
		}
		l.setState(t, nd, "ready")
		if !testwait.Until(15*time.Second, func() bool {
			return strings.HasPrefix(l.haproxyStats(t)["drover/"+nd.name].status, "UP")
		}) {
			t.Fatalf("node %s not back in rotation 15 s after it was ready", nd.name)
		}
		replacedAt[nd.name] = time.Now()
		t.Logf("node %s: pid %d replaced by %d in %v (drained in %v)", nd.name, oldPID, nd.cmd.Process.Pid,
			time.Since(start).Round(time.Millisecond), drained.Round(time.Millisecond))
	}
	sum, acks := em.wait(t)
	logRun(t, sum)
	push := sum.Op(results.OpPush)
	if push.Latency != nil {
		t.Logf("push latency through the upgrade: p50 %v, p99 %v, max %v",
			push.Latency.Quantile(0.5), push.Latency.Quantile(0.99), push.Latency.Max())
	}
	checkNoWrongAnswer(t, sum, false)
	if d := push.DroppedTotal(); d != 0 {
		t.Errorf("%d pushes dropped during the rolling upgrade: %v", d, push.Dropped)
	}
	if push.Retried != 0 {
		t.Errorf("%d pushes retried during the rolling upgrade", push.Retried)
	}
	l.checkAcks(t, acks)
	statsAfter := l.haproxyStats(t)
	for _, nd := range l.nodes {
		for _, be := range []string{"drover", "drover_alive"} {
			k := be + "/" + nd.name
			a, b := statsAfter[k], statsBefore[k]
			if a.connErrors != b.connErrors || a.retries != b.retries || a.redisp != b.redisp {
				t.Errorf("HAProxy %s: %d connection errors, %d retries, %d redispatches during the upgrade (refused connections)",
					k, a.connErrors-b.connErrors, a.retries-b.retries, a.redisp-b.redisp)
			}
		}
		served := false
		for _, a := range acks {
			if a.Node == nd.name && time.UnixMilli(a.AtMS).After(replacedAt[nd.name]) {
				served = true
				break
			}
		}
		if !served && replacedAt[nd.name].Before(loadEnd.Add(-3*time.Second)) {
			t.Errorf("node %s acknowledged no push after it was replaced", nd.name)
		}
	}
}
