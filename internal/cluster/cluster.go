// Package cluster runs one node of a Drover cluster: several servers behind
// a load balancer sharing one PostgreSQL database (docs/cluster.md). The
// database is the truth: IDs, registrations and a change log written in
// the same transactions as the changes. NATS is the fast path: a node that
// committed a change says so, and the others read the change log at once;
// nodes also publish their pushes' summaries so that every node shows the
// whole fleet's liveness. Without NATS every node still polls the change
// log (every Poll) and reads other nodes' pushes from the database, so
// correctness holds and only the load on the database grows.
package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/drover/drover/internal/fleet"
	"github.com/drover/drover/internal/protocol"
	"github.com/drover/drover/internal/store/contract"
)

// Config configures a node.
type Config struct {
	Node    string // this node's name, unique in the cluster
	NATSURL string // "": no NATS (the database alone)
	Address string // where the node serves, shown in the node list
	// Poll is how often the change log is read without a NATS nudge;
	// StatesEvery how often other nodes' push summaries are read from the
	// database while some node cannot reach NATS (never while all can).
	Poll, StatesEvery, Heartbeat time.Duration
	Logger                       *slog.Logger
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	host, _ := os.Hostname()
	return Config{Node: host, NATSURL: "nats://127.0.0.1:4222", Poll: 250 * time.Millisecond,
		StatesEvery: time.Second, Heartbeat: time.Second}
}

// Subjects, under a prefix naming the cluster (its database).
const (
	subjChanges = ".changes" // payload: the node's name; read the change log now
	subjStates  = ".states"  // payload: a node's push summaries (JSON)
	subjPushes  = ".pushes"  // payload: a node's whole push events, for the leader's alerts (JSON)
)

// backlog is how much of its own push summaries a node keeps, to write
// them to the database when the cluster turns degraded: the others may
// have missed them since a node lost NATS (a heartbeat or two before).
const backlog = 10 * time.Second

// pushesKept is how long push summaries stay in the database.
const pushesKept = 2 * time.Minute

// gapWait is how long a hole in the change log's sequence numbers is
// waited for: a transaction that took its number may commit after a later
// one, or roll back and never fill it.
const gapWait = 10 * time.Second

// Node is one node of a cluster.
type Node struct {
	cfg   Config
	st    contract.Cluster
	fleet *fleet.Service
	fl    atomic.Pointer[fleet.Service] // fleet, for Status from other goroutines
	log   *slog.Logger
	self  fleet.ClusterNode

	nc      *nats.Conn
	pushSub *nats.Subscription // forwarded pushes, while leading (housekeep only)
	prefix  string
	wake    chan struct{}

	// change log position (run goroutine only)
	maxSeen int64
	missing map[int64]time.Time

	leader atomic.Bool
	natsUp atomic.Bool
	// viaDB: some live node cannot reach NATS (this one or another, by
	// the heartbeats), so every node writes its push summaries to the
	// database and reads the others' there.
	viaDB     atomic.Bool
	pushSeen  int64         // last push summary batch read (housekeep only)
	applied   atomic.Uint64 // change log entries applied
	stateRecs atomic.Uint64 // other nodes' push summaries applied
	lagNS     atomic.Int64  // commit-to-apply time of the last applied change
	pollErr   atomic.Pointer[string]
	lastPoll  atomic.Int64 // unix ns of the last successful poll

	pmu     sync.Mutex
	pending []summary         // this node's pushes not yet published
	recent  []batch           // published in the last backlog (housekeep only)
	resend  bool              // viaDB just began: write recent too (housekeep only)
	fwd     []fleet.PushEvent // the same, whole, while not leading
	forward func(fleet.PushEvent)

	// relays of remote sessions (relay.go)
	relayKey   []byte
	holds      func(dev uint64) bool
	selfPeer   func() Peer
	connectAsk func(dev uint64, until time.Time)
}

// summary is one push as other nodes learn it.
type summary struct {
	ID  uint64 `json:"d"`
	At  int64  `json:"t"` // unix ns
	Seq uint64 `json:"s"`
	Ver int64  `json:"v"`
	Err string `json:"e,omitempty"`
	// Fw is the firmware a push moved the device to (rare: an upgrade);
	// the others read the device back.
	Fw string `json:"f,omitempty"`
	// St is the pushed state, sent while the node indexes reported
	// fields (live labels, filters on state: docs/groups.md).
	St json.RawMessage `json:"st,omitempty"`
}

// batch is push summaries published together.
type batch struct {
	at time.Time
	s  []summary
}

// New prepares a node over st: it notes the change log's end, so that
// what changes while the fleet loads is applied after. Call Run once the
// fleet is loaded.
func New(ctx context.Context, cfg Config, st contract.Cluster) (*Node, error) {
	def := DefaultConfig()
	if cfg.Node == "" {
		cfg.Node = def.Node
	}
	if cfg.Poll <= 0 {
		cfg.Poll = def.Poll
	}
	if cfg.StatesEvery <= 0 {
		cfg.StatesEvery = def.StatesEvery
	}
	if cfg.Heartbeat <= 0 {
		cfg.Heartbeat = def.Heartbeat
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	host, _ := os.Hostname()
	n := &Node{cfg: cfg, st: st, log: cfg.Logger, wake: make(chan struct{}, 1), missing: map[int64]time.Time{},
		self: fleet.ClusterNode{Name: cfg.Node, Host: host, PID: os.Getpid(), Address: cfg.Address, StartedAt: time.Now().UTC()}}
	var err error
	if n.maxSeen, err = st.LastChange(ctx); err != nil {
		return nil, err
	}
	if n.pushSeen, err = st.LastPushes(ctx); err != nil {
		return nil, err
	}
	id, err := st.ClusterID(ctx)
	if err != nil {
		return nil, err
	}
	n.prefix = "drover.cluster." + id
	if err := n.loadRelayKey(ctx); err != nil {
		return nil, err
	}
	// NATS is not connected yet: say it is up until the first beat of
	// Run knows, so that a starting node does not make every node move
	// push summaries to the database for a second (its own summaries
	// are kept and written then if NATS is not there).
	if err := n.beat(ctx, true); err != nil {
		return nil, err
	}
	st.OnChange(n.changed)
	return n, nil
}

// Run connects to NATS and keeps the node in step until ctx ends; fl is
// the loaded fleet.
func (n *Node) Run(ctx context.Context, fl *fleet.Service) {
	n.fleet = fl
	n.fl.Store(fl)
	n.connect()
	defer func() {
		if n.nc != nil {
			n.nc.Close()
		}
		lctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		n.st.Leave(lctx, n.cfg.Node)
	}()
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); n.follow(ctx) }()
	go func() { defer wg.Done(); n.housekeep(ctx) }()
	wg.Wait()
}

// connect opens the NATS connection; it keeps reconnecting by itself.
func (n *Node) connect() {
	if n.cfg.NATSURL == "" {
		return
	}
	nc, err := nats.Connect(n.cfg.NATSURL, nats.Name("drover "+n.cfg.Node), nats.MaxReconnects(-1),
		nats.ReconnectWait(250*time.Millisecond), nats.RetryOnFailedConnect(true), nats.Timeout(2*time.Second),
		nats.PingInterval(2*time.Second), nats.MaxPingsOutstanding(2),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			n.natsUp.Store(false)
			n.log.Warn("cluster: NATS connection lost; the database carries everything", "err", err)
		}),
		nats.ReconnectHandler(func(*nats.Conn) {
			n.natsUp.Store(true)
			n.log.Info("cluster: NATS connection back")
			n.nudge()
		}),
		nats.ConnectHandler(func(*nats.Conn) {
			n.natsUp.Store(true)
			n.log.Info("cluster: NATS connected", "url", RedactURLs(n.cfg.NATSURL))
		}))
	if err != nil {
		n.log.Warn("cluster: NATS unavailable; the database carries everything", "url", RedactURLs(n.cfg.NATSURL), "err", err)
		return
	}
	n.nc = nc
	n.natsUp.Store(nc.IsConnected())
	nc.Subscribe(n.prefix+subjChanges, func(m *nats.Msg) {
		if string(m.Data) != n.cfg.Node {
			n.nudge()
		}
	})
	nc.Subscribe(n.prefix+subjStates, func(m *nats.Msg) {
		var b struct {
			Node string    `json:"n"`
			S    []summary `json:"s"`
		}
		if json.Unmarshal(m.Data, &b) != nil || b.Node == n.cfg.Node {
			return
		}
		n.applyStates(b.S)
	})
	n.subscribeWhere()
	n.subscribeConnect()
}

// followPushes subscribes to the pushes other nodes forward while this
// node leads, and only then: each forwarded push then crosses NATS to one
// node, not to all.
func (n *Node) followPushes(lead bool) {
	if n.nc == nil || n.forward == nil {
		return
	}
	if !lead {
		if n.pushSub != nil {
			n.pushSub.Unsubscribe()
			n.pushSub = nil
		}
		return
	}
	if n.pushSub != nil {
		return
	}
	sub, err := n.nc.Subscribe(n.prefix+subjPushes, func(m *nats.Msg) {
		if !n.leader.Load() {
			return
		}
		var evs []fleet.PushEvent
		if json.Unmarshal(m.Data, &evs) != nil {
			return
		}
		for _, ev := range evs {
			n.forward(ev)
		}
	})
	if err != nil {
		n.log.Warn("cluster: cannot follow forwarded pushes", "err", err)
		return
	}
	n.pushSub = sub
}

// changed runs after a local commit that wrote change log rows.
func (n *Node) changed() {
	if n.nc != nil && n.natsUp.Load() {
		n.nc.Publish(n.prefix+subjChanges, []byte(n.cfg.Node))
	}
}

func (n *Node) nudge() {
	select {
	case n.wake <- struct{}{}:
	default:
	}
}

// follow applies the change log: at every NATS nudge, and every Poll.
func (n *Node) follow(ctx context.Context) {
	t := time.NewTicker(n.cfg.Poll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-n.wake:
		}
		if err := n.poll(ctx); err != nil && ctx.Err() == nil {
			msg := err.Error()
			if n.pollErr.Swap(&msg) == nil {
				n.log.Error("cluster: reading the change log failed", "err", err)
			}
			continue
		}
		if n.pollErr.Swap(nil) != nil {
			n.log.Info("cluster: change log read again")
		}
		n.lastPoll.Store(time.Now().UnixNano())
	}
}

// poll reads the change log past the last entry seen, and the holes
// before it, and applies what other nodes changed.
func (n *Node) poll(ctx context.Context) error {
	now := time.Now()
	holes := make([]int64, 0, len(n.missing))
	for seq, since := range n.missing {
		if now.Sub(since) > gapWait {
			delete(n.missing, seq)
		} else {
			holes = append(holes, seq)
		}
	}
	for {
		from := n.maxSeen
		cs, err := n.st.ChangesAfter(ctx, from, holes, 1000)
		if err != nil {
			return err
		}
		after := 0 // entries past from (the rest filled holes)
		for _, c := range cs {
			if c.Seq > from {
				after++
			}
			if c.Node != n.cfg.Node {
				if err := n.fleet.ApplyChange(ctx, c); err != nil {
					return err
				}
				n.applied.Add(1)
				n.lagNS.Store(int64(time.Since(c.At)))
			}
			if c.Seq > n.maxSeen {
				for s := n.maxSeen + 1; s < c.Seq && len(n.missing) < 100000; s++ {
					n.missing[s] = now
				}
				n.maxSeen = c.Seq
			} else {
				delete(n.missing, c.Seq)
			}
		}
		if after < 1000 {
			return nil
		}
		holes = holes[:0]
	}
}

// housekeep beats the heartbeat, takes or keeps the leadership, publishes
// this node's pushes and, while some node cannot reach NATS, writes them
// to the database and reads the others' there.
func (n *Node) housekeep(ctx context.Context) {
	pub := time.NewTicker(500 * time.Millisecond)
	defer pub.Stop()
	beat := time.NewTicker(n.cfg.Heartbeat)
	defer beat.Stop()
	states := time.NewTicker(n.cfg.StatesEvery)
	defer states.Stop()
	var pruned time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-pub.C:
			n.publish(ctx)
		case <-beat.C:
			if err := n.beat(ctx, n.natsUp.Load()); err != nil && ctx.Err() == nil {
				n.log.Warn("cluster: heartbeat failed", "err", err)
			}
			n.checkNATS(ctx)
			lead, err := n.st.TryLeader(ctx)
			if err != nil && ctx.Err() == nil {
				n.log.Warn("cluster: leader lock", "err", err)
			}
			if n.leader.Swap(lead) != lead {
				n.log.Info("cluster: leadership", "leader", lead)
			}
			n.followPushes(lead)
			// Entries live an hour: pruning once a minute is plenty, and
			// bounds the cost of a plan the planner gets wrong (a table
			// not analyzed yet: a whole read of the log) to one a minute.
			if lead && time.Since(pruned) > time.Minute {
				pruned = time.Now()
				if _, err := n.st.PruneChanges(ctx, time.Now().Add(-time.Hour)); err != nil && ctx.Err() == nil {
					n.log.Warn("cluster: change log prune failed", "err", err)
				}
				if _, err := n.st.PrunePushes(ctx, time.Now().Add(-pushesKept)); err != nil && ctx.Err() == nil {
					n.log.Warn("cluster: push summaries prune failed", "err", err)
				}
			}
		case <-states.C:
			if n.viaDB.Load() {
				if err := n.readPushes(ctx); err != nil && ctx.Err() == nil {
					n.log.Warn("cluster: reading push summaries failed", "err", err)
				}
			}
		}
	}
}

// checkNATS decides whether push summaries travel through the database:
// while this node or any node that beat within 5 s cannot reach NATS.
func (n *Node) checkNATS(ctx context.Context) {
	via := !n.natsUp.Load()
	if !via {
		nodes, err := n.st.Nodes(ctx)
		if err != nil {
			return // keep the last decision
		}
		for _, o := range nodes {
			if o.Name != n.cfg.Node && !o.NATS && time.Since(o.Heartbeat) < 5*time.Second {
				via = true
				break
			}
		}
	}
	if n.viaDB.Swap(via) != via {
		n.log.Warn("cluster: push summaries through the database", "on", via)
		if via {
			n.resend = true
		}
	}
}

// readPushes applies the push summaries other nodes stored since the last
// read.
func (n *Node) readPushes(ctx context.Context) error {
	for {
		bs, err := n.st.PushesAfter(ctx, n.pushSeen, 100)
		if err != nil {
			return err
		}
		for _, b := range bs {
			n.pushSeen = b.Seq
			var s []summary
			if b.Node != n.cfg.Node && json.Unmarshal(b.Body, &s) == nil {
				n.applyStates(s)
			}
		}
		if len(bs) < 100 {
			return nil
		}
	}
}

func (n *Node) beat(ctx context.Context, natsUp bool) error {
	n.self.Heartbeat, n.self.NATS = time.Now().UTC(), natsUp
	return n.st.Heartbeat(ctx, n.self)
}

// Forward sets where the leader passes the pushes other nodes took (the
// alert engine); call it before Run.
func (n *Node) Forward(f func(fleet.PushEvent)) { n.forward = f }

// OnPush notes a push this node took, for the next publication; subscribe
// it to the fleet's pushes (fleet.Events.Pushed).
func (n *Node) OnPush(ev fleet.PushEvent) {
	n.pmu.Lock()
	if len(n.pending) < 100000 {
		sm := summary{ID: ev.DeviceID, At: ev.At.UnixNano(), Seq: ev.Seq, Ver: ev.ConfigVersion, Err: ev.ConfigError}
		if n.fleet != nil && n.fleet.Indexing() {
			sm.St = bytes.Clone(ev.RawState) // kept past the request
		}
		if ev.FirmwareChanged {
			sm.Fw = ev.Firmware
		}
		n.pending = append(n.pending, sm)
		if !n.leader.Load() && n.forward != nil {
			n.fwd = append(n.fwd, forwarded(ev))
		}
	}
	n.pmu.Unlock()
}

// forwarded is ev as the leader's alert rules need it: the state's
// uptime, CPU, temperature and disk (rules.go's values), not its
// interfaces, signal and extra fields; a copy, as ev.State belongs to the
// request.
func forwarded(ev fleet.PushEvent) fleet.PushEvent {
	if st := ev.State; st != nil {
		ev.State = &protocol.State{Uptime: clone(st.Uptime), CPU: clone(st.CPU), Temperature: clone(st.Temperature),
			DiskTotal: clone(st.DiskTotal), DiskUsed: clone(st.DiskUsed), Firmware: st.Firmware}
	}
	return ev
}

func clone[T any](p *T) *T {
	if p == nil {
		return nil
	}
	v := *p
	return &v
}

// publish sends the pushes noted since the last time over NATS, in
// messages of at most 2000 (NATS's default payload limit is 1 MiB), and
// to the database while some node cannot reach NATS (with the last
// backlog's when that just began).
func (n *Node) publish(ctx context.Context) {
	n.pmu.Lock()
	p, fwd := n.pending, n.fwd
	n.pending, n.fwd = nil, nil
	n.pmu.Unlock()
	now := time.Now()
	if len(p) > 0 {
		n.recent = append(n.recent, batch{now, p})
	}
	k := 0
	for k < len(n.recent) && now.Sub(n.recent[k].at) > backlog {
		k++
	}
	n.recent = n.recent[k:]
	if n.viaDB.Load() {
		out := p
		if n.resend {
			out = nil
			for _, b := range n.recent {
				out = append(out, b.s...)
			}
		}
		n.savePushes(ctx, out)
	}
	if len(p) == 0 || n.nc == nil || !n.natsUp.Load() {
		return
	}
	for len(fwd) > 0 {
		k := min(len(fwd), 500)
		b, err := json.Marshal(fwd[:k])
		if err == nil {
			n.nc.Publish(n.prefix+subjPushes, b)
		}
		fwd = fwd[k:]
	}
	for len(p) > 0 {
		k := min(len(p), 2000)
		b, _ := json.Marshal(struct {
			Node string    `json:"n"`
			S    []summary `json:"s"`
		}{n.cfg.Node, p[:k]})
		n.nc.Publish(n.prefix+subjStates, b)
		p = p[k:]
	}
}

// savePushes writes summaries to the database, in rows of at most 5000.
func (n *Node) savePushes(ctx context.Context, s []summary) {
	for len(s) > 0 {
		k := min(len(s), 5000)
		b, _ := json.Marshal(s[:k])
		if err := n.st.SavePushes(ctx, b); err != nil {
			if ctx.Err() == nil {
				n.log.Warn("cluster: storing push summaries failed", "err", err)
			}
			return // resend stays set: the backlog goes with the next
		}
		s = s[k:]
	}
	n.resend = false
}

func (n *Node) applyStates(s []summary) {
	if n.fleet == nil {
		return
	}
	recs := make([]fleet.StateRecord, len(s))
	for i, v := range s {
		recs[i] = fleet.StateRecord{DeviceID: v.ID, LastSeen: time.Unix(0, v.At), Seq: v.Seq, AppliedVersion: v.Ver, ConfigError: v.Err, Firmware: v.Fw, State: v.St}
	}
	n.stateRecs.Add(uint64(n.fleet.ApplyStates(recs)))
}

// Status is a node's view of the cluster, for readiness and metrics.
type Status struct {
	Node         string `json:"node"`
	Leader       bool   `json:"leader"`
	NATS         bool   `json:"nats"`           // connected
	ChangeLogErr string `json:"change_log_err"` // the last read's failure, "" when it works
	// Applied counts change log entries applied; States other nodes' push
	// summaries taken; Lag is the last applied change's age when applied.
	Applied uint64        `json:"applied"`
	States  uint64        `json:"states"`
	Lag     time.Duration `json:"lag_ns"`
	// SummariesViaDB: some node cannot reach NATS, push summaries travel
	// through the database.
	SummariesViaDB bool `json:"summaries_via_db"`
	// DeviceReads counts devices this node read back from the database
	// (change log entries, tokens memory refused, registrations).
	DeviceReads uint64 `json:"device_reads"`
	// CommandQueries counts pushes that asked the database about remote
	// commands (one queued for the device, or results).
	CommandQueries uint64 `json:"command_queries"`
}

// Status returns the node's status.
func (n *Node) Status() Status {
	st := Status{Node: n.cfg.Node, Leader: n.leader.Load(), NATS: n.natsUp.Load(), Applied: n.applied.Load(),
		States: n.stateRecs.Load(), Lag: time.Duration(n.lagNS.Load()), SummariesViaDB: n.viaDB.Load()}
	if fl := n.fl.Load(); fl != nil {
		st.DeviceReads, st.CommandQueries = fl.ClusterDeviceReads(), fl.ClusterCommandQueries()
	}
	if e := n.pollErr.Load(); e != nil {
		st.ChangeLogErr = *e
	}
	return st
}

// Leader says whether this node leads (runs the alert checks).
func (n *Node) Leader() bool { return n.leader.Load() }

// Nodes lists the cluster's nodes as recorded.
func (n *Node) Nodes(ctx context.Context) ([]fleet.ClusterNode, error) { return n.st.Nodes(ctx) }

// ErrNoNATS is the readiness detail of a node without NATS.
var ErrNoNATS = errors.New("NATS unreachable: changes travel through the database (slower, still correct)")

// ErrPeerNoNATS is the readiness detail of a node whose NATS works while
// another node's does not.
var ErrPeerNoNATS = errors.New("a node cannot reach NATS: push summaries travel through the database (slower, still correct)")
