package clustertest

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/internal/emulator/results"
)

// TestMeasure is the measurement of docs/cluster.md (scripts/bench-cluster.sh
// runs it): for 1, 2 and 3 nodes, each time on a fresh lab and database,
// the fleet registers, then pushes open loop through HAProxy with a new
// TCP connection and TLS handshake per push; what every process used is
// read from /proc and every host's traffic from its veth. It runs only
// when DROVER_CLUSTER_BENCH=1 (it takes minutes and the whole machine).
//
//	DROVER_BENCH_NODES=1,2,3  DROVER_BENCH_DEVICES=6000  DROVER_BENCH_INTERVAL=20s
//	DROVER_BENCH_DURATION=40s DROVER_BENCH_RUNS=1 (3: medians of 3)
//	DROVER_BENCH_IDLE=10s (the registered fleet silent: the cluster's own cost)
//	DROVER_BENCH_CONN=new (how devices connect, a comma-separated list:
//	  new: a full TLS handshake per push; resume: each device resumes its
//	  own TLS 1.3 session, the nodes sharing --tls-ticket-keys, as
//	  docs/cluster.md advises; resume-tls12: the same at TLS 1.2, whose
//	  resumption skips the key exchange)
func TestMeasure(t *testing.T) {
	if os.Getenv("DROVER_CLUSTER_BENCH") != "1" {
		t.Skip("a measurement: DROVER_CLUSTER_BENCH=1 (scripts/bench-cluster.sh)")
	}
	need(t)
	nodes := envInts(t, "DROVER_BENCH_NODES", "1,2,3")
	devices := envInts(t, "DROVER_BENCH_DEVICES", "6000")[0]
	runs := envInts(t, "DROVER_BENCH_RUNS", "1")[0]
	interval := envDuration(t, "DROVER_BENCH_INTERVAL", "20s")
	duration := envDuration(t, "DROVER_BENCH_DURATION", "40s")
	conns := strings.Split(os.Getenv("DROVER_BENCH_CONN"), ",")
	if conns[0] == "" {
		conns = []string{"new"}
	}
	for _, c := range conns {
		if _, ok := benchConns[c]; !ok {
			t.Fatalf("DROVER_BENCH_CONN=%q: want new, resume or resume-tls12, comma-separated", c)
		}
	}
	load, _ := os.ReadFile("/proc/loadavg")
	var rows []measured
	// Runs of one node count alternate between the ways of connecting,
	// so that each comparison is taken in the same stretch of time.
	for _, n := range nodes {
		all := map[string][]measured{}
		for run := range runs {
			for _, c := range conns {
				t.Run(fmt.Sprintf("nodes=%d/conn=%s/run=%d", n, c, run+1), func(t *testing.T) {
					m := measure(t, n, devices, interval, duration, c)
					t.Logf("%+v", m)
					all[c] = append(all[c], m)
				})
			}
		}
		for _, c := range conns {
			if len(all[c]) > 0 {
				rows = append(rows, median(all[c]))
			}
		}
	}
	load2, _ := os.ReadFile("/proc/loadavg")
	var b strings.Builder
	fmt.Fprintf(&b, "\n%d devices, one push each per %v, for %v after registration; a new TCP and TLS connection per push through HAProxy (conn: new, a full handshake; resume, the device's own session resumed on any node); medians of %d run(s).\n", devices, interval, duration, runs)
	fmt.Fprintf(&b, "/proc/loadavg before: %s, after: %s\n\n", strings.TrimSpace(string(load)), strings.TrimSpace(string(load2)))
	b.WriteString("| nodes | conn | resumed % | offered/s | accepted/s | p50 ms | p99 ms | late % | node CPU ms/push (each) | nodes CPU ms/push | PostgreSQL CPU ms/push | HAProxy CPU ms/push | NATS CPU ms/push | device bytes/push | DB wire bytes/push | NATS bytes/push | DB growth bytes/push | WAL bytes/push | DB bytes/device | change-log rows/push | device reads/push | sync events/push | idle CPU ms/s per node | idle PostgreSQL CPU ms/s |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, m := range rows {
		each := make([]string, len(m.nodeCPU))
		for i, c := range m.nodeCPU {
			each[i] = fmt.Sprintf("%.3f", c)
		}
		fmt.Fprintf(&b, "| %d | %s | %.0f | %.0f | %.0f | %.1f | %.1f | %.1f | %s | %.3f | %.3f | %.3f | %.3f | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f | %.3f | %.3f | %.3f | %.1f | %.1f |\n",
			m.nodes, m.conn, m.resumedPct, m.offered, m.rate, m.p50, m.p99, m.latePct, strings.Join(each, " / "), m.nodesCPU, m.pgCPU, m.lbCPU, m.natsCPU,
			m.deviceBytes, m.dbBytes, m.natsBytes, m.dbGrowth, m.wal, m.dbPerDevice, m.changeRows, m.deviceReads, m.syncRows, m.idleNode, m.idlePG)
	}
	t.Log(b.String())
	fmt.Println(b.String())
}

func envInts(t *testing.T, name, def string) []int {
	v := os.Getenv(name)
	if v == "" {
		v = def
	}
	var out []int
	for _, f := range strings.Split(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			t.Fatalf("%s=%q: want positive integers, comma-separated", name, v)
		}
		out = append(out, n)
	}
	return out
}

func envDuration(t *testing.T, name, def string) time.Duration {
	v := os.Getenv(name)
	if v == "" {
		v = def
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		t.Fatalf("%s=%q: want a duration", name, v)
	}
	return d
}

const msPerTick = 10 // clock ticks of /proc/PID/stat: USER_HZ = 100

// measured is one configuration's figures, per accepted push unless named
// otherwise.
type measured struct {
	nodes                                          int
	conn                                           string // DROVER_BENCH_CONN's way of connecting
	offered, rate, p50, p99, latePct               float64
	resumedPct                                     float64   // of the emulator's TLS handshakes, warm-up included
	nodeCPU                                        []float64 // ms per push it accepted, each node
	nodesCPU, pgCPU, lbCPU, natsCPU                float64   // ms per push
	deviceBytes, dbBytes, natsBytes, dbGrowth, wal float64
	// rows per push: change log rows written, devices the nodes read
	// back, sync events recorded (all should stay near 0: a push is not
	// a change, and sync events are changes of sync state)
	changeRows, deviceReads, syncRows float64
	dbPerDevice                       float64 // database bytes per registered device, before any push
	// CPU ms per second with the fleet registered but silent: what the
	// cluster costs without pushes (polls, heartbeats, NATS), per node and
	// in PostgreSQL; included in the per-push figures above.
	idleNode, idlePG float64
}

// snapshot is what the lab's processes and hosts used so far.
type snapshot struct {
	nodeTicks          []int64
	accepted           []int64 // pushes each node accepted (drover_pushes_total)
	pg, lb, nats       int64
	nodeBytes          []int64
	dbBytes, natsBytes int64
	dbSize, walLSN     int64
	tables             map[string][4]int64 // per table: rows read by scans, fetched by index, inserted, updated
	commits            int64               // the nodes' grouped commits (drover_store_commit_records_count)
	changes, syncs     int64               // rows in cluster_changes and sync_events
	deviceReads        int64               // devices the nodes read back (drover_cluster_device_reads_total)
}

func (l *lab) snapshot(t *testing.T) snapshot {
	t.Helper()
	var s snapshot
	for _, nd := range l.nodes {
		s.commits += l.metric(nd, "drover_store_commit_records_count")
		if l.cluster {
			s.deviceReads += l.metric(nd, "drover_cluster_device_reads_total")
		}
		s.accepted = append(s.accepted, l.metric(nd, `drover_pushes_total{outcome="accepted"}`))
		s.nodeTicks = append(s.nodeTicks, cpuTicks(nd.cmd.Process.Pid, false))
		s.nodeBytes = append(s.nodeBytes, nd.host.Bytes())
	}
	s.pg = treeTicks(l.pg.PID())
	s.lb = cpuTicks(l.haproxy.Process.Pid, false)
	s.nats = cpuTicks(l.nats.Process.Pid, false)
	s.dbBytes, s.natsBytes = l.dbHost.Bytes(), l.natsHost.Bytes()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := l.db(ctx)
	defer c.Close(ctx)
	// The schema's tables with their indexes and TOAST; the WAL position.
	rows, err := c.Query(ctx, `SELECT relname, COALESCE(seq_tup_read, 0), COALESCE(idx_tup_fetch, 0), n_tup_ins, n_tup_upd
		FROM pg_stat_user_tables WHERE schemaname = current_schema()`)
	if err != nil {
		t.Fatal(err)
	}
	s.tables = map[string][4]int64{}
	for rows.Next() {
		var name string
		var v [4]int64
		if err := rows.Scan(&name, &v[0], &v[1], &v[2], &v[3]); err != nil {
			t.Fatal(err)
		}
		s.tables[name] = v
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.QueryRow(ctx, `SELECT (SELECT count(*) FROM sync_events), (SELECT count(*) FROM cluster_changes)`).Scan(&s.syncs, &s.changes); err != nil {
		t.Fatal(err)
	}
	if err := c.QueryRow(ctx, `SELECT COALESCE(SUM(pg_total_relation_size(c.oid)), 0)::bigint,
		(pg_current_wal_lsn() - '0/0'::pg_lsn)::bigint
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = current_schema() AND c.relkind = 'r'`).Scan(&s.dbSize, &s.walLSN); err != nil {
		t.Fatal(err)
	}
	return s
}

// benchConns are the emulator's flags for each way of connecting, and
// whether the nodes share session ticket keys.
var benchConns = map[string]struct {
	flags   []string
	tickets bool
}{
	"new":          {[]string{"--conn", "new"}, false},
	"resume":       {[]string{"--conn", "resume"}, true},
	"resume-tls12": {[]string{"--conn", "resume", "--tls-max-version", "1.2"}, true},
}

func measure(t *testing.T, n, devices int, interval, duration time.Duration, conn string) measured {
	l := newLab(t)
	if n > 1 && !l.cluster {
		t.Skipf("%d nodes need drover serve --cluster, which this build lacks", n)
	}
	bc := benchConns[conn]
	if bc.tickets {
		key := make([]byte, 32)
		if _, err := rand.Read(key); err != nil {
			t.Fatal(err)
		}
		l.ticketKeys = filepath.Join(l.dir, "ticket-keys")
		if err := os.WriteFile(l.ticketKeys, []byte(base64.StdEncoding.EncodeToString(key)+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	l.startNodes(n)
	l.register(devices)
	m := measured{nodes: n, conn: conn, offered: float64(devices) / interval.Seconds()}
	quiet := l.snapshot(t)
	m.dbPerDevice = float64(quiet.dbSize) / float64(devices)
	idle := envDuration(t, "DROVER_BENCH_IDLE", "10s")
	time.Sleep(idle) // the idle window is what is measured
	quiet2 := l.snapshot(t)
	for i := range l.nodes {
		m.idleNode += float64((quiet2.nodeTicks[i]-quiet.nodeTicks[i])*msPerTick) / idle.Seconds() / float64(n)
	}
	m.idlePG = float64((quiet2.pg-quiet.pg)*msPerTick) / idle.Seconds()
	// One emulator: its first interval warms connection pools and caches
	// and gives each device its TLS session; it is not counted. The
	// measured span is the nodes' accepted pushes between two snapshots.
	e := l.emulate(devices, append([]string{"--interval", interval.String(), "--duration", (interval + duration).String()}, bc.flags...)...)
	time.Sleep(interval)
	before := l.snapshot(t)
	time.Sleep(duration)
	after := l.snapshot(t)
	sum, _ := e.wait(t)
	push := sum.Op(results.OpPush)
	var accepted []int64
	for i := range l.nodes {
		accepted = append(accepted, after.accepted[i]-before.accepted[i])
	}
	p := float64(sumOf(accepted))
	if p == 0 {
		t.Fatalf("no push accepted: %+v", push.Counts)
	}
	m.rate = p / duration.Seconds()
	if cn := sum.Conns; cn.TLSFull+cn.TLSResumed > 0 {
		m.resumedPct = 100 * float64(cn.TLSResumed) / float64(cn.TLSFull+cn.TLSResumed)
	}
	if push.Latency != nil {
		m.p50 = float64(push.Latency.Quantile(0.5).Microseconds()) / 1000
		m.p99 = float64(push.Latency.Quantile(0.99).Microseconds()) / 1000
	}
	if done := push.Done(); done > 0 {
		m.latePct = 100 * float64(push.Late) / float64(done)
	}
	var nodeTicks, nodeBytes int64
	for i := range l.nodes {
		dt := after.nodeTicks[i] - before.nodeTicks[i]
		nodeTicks += dt
		nodeBytes += after.nodeBytes[i] - before.nodeBytes[i]
		m.nodeCPU = append(m.nodeCPU, float64(dt*msPerTick)/max(1, float64(accepted[i])))
	}
	m.nodesCPU = float64(nodeTicks*msPerTick) / p
	m.pgCPU = float64((after.pg-before.pg)*msPerTick) / p
	m.lbCPU = float64((after.lb-before.lb)*msPerTick) / p
	m.natsCPU = float64((after.nats-before.nats)*msPerTick) / p
	db, nats := after.dbBytes-before.dbBytes, after.natsBytes-before.natsBytes
	// A node's veth carries its devices' traffic (from HAProxy), its
	// database and its NATS traffic; the last two are the db and nats
	// hosts' own veths.
	m.deviceBytes = float64(nodeBytes-db-nats) / p
	m.dbBytes, m.natsBytes = float64(db)/p, float64(nats)/p
	m.dbGrowth = float64(after.dbSize-before.dbSize) / p
	m.wal = float64(after.walLSN-before.walLSN) / p
	// Where the database's work goes: rows per push by table (the
	// statistics lag by up to a second: an indication, not a count).
	time.Sleep(time.Second) // the statistics' lag: nothing to poll for
	final := l.snapshot(t)
	m.changeRows = float64(final.changes-before.changes) / p
	m.deviceReads = float64(final.deviceReads-before.deviceReads) / p
	m.syncRows = float64(final.syncs-before.syncs) / p
	var where []string
	for name, v := range final.tables {
		b := before.tables[name]
		var f [4]float64
		for i := range v {
			f[i] = float64(v[i]-b[i]) / p
		}
		if f != [4]float64{} {
			where = append(where, fmt.Sprintf("%s: scanned %.2f, index-fetched %.2f, inserted %.2f, updated %.2f", name, f[0], f[1], f[2], f[3]))
		}
	}
	slices.Sort(where)
	t.Logf("%d nodes, %.2f pushes per grouped commit; rows per push: %s", n, p/max(1, float64(after.commits-before.commits)), strings.Join(where, "; "))
	if out, err := exec.Command("uptime").Output(); err == nil {
		t.Logf("%d nodes: %s", n, strings.TrimSpace(string(out)))
	}
	return m
}

// median takes each figure's median over runs.
func median(ms []measured) measured {
	med := func(f func(measured) float64) float64 {
		v := make([]float64, len(ms))
		for i, m := range ms {
			v[i] = f(m)
		}
		slices.Sort(v)
		return v[len(v)/2]
	}
	out := measured{nodes: ms[0].nodes, conn: ms[0].conn}
	out.offered = med(func(m measured) float64 { return m.offered })
	out.rate = med(func(m measured) float64 { return m.rate })
	out.p50 = med(func(m measured) float64 { return m.p50 })
	out.p99 = med(func(m measured) float64 { return m.p99 })
	out.latePct = med(func(m measured) float64 { return m.latePct })
	out.resumedPct = med(func(m measured) float64 { return m.resumedPct })
	for i := range ms[0].nodeCPU {
		out.nodeCPU = append(out.nodeCPU, med(func(m measured) float64 { return m.nodeCPU[i] }))
	}
	out.nodesCPU = med(func(m measured) float64 { return m.nodesCPU })
	out.pgCPU = med(func(m measured) float64 { return m.pgCPU })
	out.lbCPU = med(func(m measured) float64 { return m.lbCPU })
	out.natsCPU = med(func(m measured) float64 { return m.natsCPU })
	out.deviceBytes = med(func(m measured) float64 { return m.deviceBytes })
	out.dbBytes = med(func(m measured) float64 { return m.dbBytes })
	out.natsBytes = med(func(m measured) float64 { return m.natsBytes })
	out.dbGrowth = med(func(m measured) float64 { return m.dbGrowth })
	out.wal = med(func(m measured) float64 { return m.wal })
	out.dbPerDevice = med(func(m measured) float64 { return m.dbPerDevice })
	out.changeRows = med(func(m measured) float64 { return m.changeRows })
	out.deviceReads = med(func(m measured) float64 { return m.deviceReads })
	out.syncRows = med(func(m measured) float64 { return m.syncRows })
	out.idleNode = med(func(m measured) float64 { return m.idleNode })
	out.idlePG = med(func(m measured) float64 { return m.idlePG })
	return out
}

func sumOf(v []int64) (n int64) {
	for _, x := range v {
		n += x
	}
	return n
}
