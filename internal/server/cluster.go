package server

// Cluster mode (docs/cluster.md): joining the cluster, the node's loops
// and metrics, GET /api/v1/cluster.

import (
	"context"
	"net/http"
	"time"

	"github.com/drover/drover/internal/cluster"
	"github.com/drover/drover/internal/fleet"
	"github.com/prometheus/client_golang/prometheus"
)

// joinCluster, in cluster mode, prepares this node before the fleet loads
// (so that nothing changed meanwhile is missed) and points the fleet at
// the shared database.
func (s *Server) joinCluster(ctx context.Context, opts *fleet.Options) error {
	if s.cstore == nil {
		return nil
	}
	cfg := cluster.DefaultConfig()
	cfg.Node, cfg.NATSURL, cfg.Address, cfg.Logger = s.cfg.ClusterNode(), s.cfg.NATSURL, s.cfg.Listen, s.log
	if cfg.Address == "" {
		cfg.Address = s.cfg.HTTPListen
	}
	n, err := cluster.New(ctx, cfg, s.cstore)
	if err != nil {
		return err
	}
	s.node = n
	s.m.watchNode(n)
	opts.Cluster = s.cstore
	opts.ClusterRollouts = s.cstore
	opts.RolloutDriver = n.Leader // the leader drives the rollouts (docs/firmware.md)
	return nil
}

// startNode runs the cluster node until the returned stop is called.
func (s *Server) startNode() (stop func()) {
	if s.node == nil {
		return func() {}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.node.Run(ctx, s.fleet)
	}()
	return func() {
		cancel()
		<-done
	}
}

// degraded says what works less well than it should while the server is
// still ready ("" when nothing).
func (s *Server) degraded() string {
	if s.node == nil {
		return ""
	}
	st := s.node.Status()
	if st.ChangeLogErr != "" {
		return "cluster change log unreadable: " + st.ChangeLogErr
	}
	if !st.NATS {
		return cluster.ErrNoNATS.Error()
	}
	if st.SummariesViaDB {
		return cluster.ErrPeerNoNATS.Error()
	}
	return ""
}

// clusterView is GET /api/v1/cluster: this node and every node recorded.
type clusterView struct {
	Node  cluster.Status      `json:"node"`
	Nodes []fleet.ClusterNode `json:"nodes"`
	// Alive is how many nodes beat within the last 5 seconds.
	Alive int `json:"alive"`
}

func (a *api) getCluster(r *http.Request) (any, error) {
	if a.cnode == nil {
		return nil, &apiError{status: http.StatusNotFound, code: "not_found", msg: "this server does not run in cluster mode (--cluster)"}
	}
	nodes, err := a.cnode.Nodes(r.Context())
	if err != nil {
		return nil, err
	}
	v := clusterView{Node: a.cnode.Status(), Nodes: nodes}
	for _, n := range nodes {
		if time.Since(n.Heartbeat) < 5*time.Second {
			v.Alive++
		}
	}
	return v, nil
}

// watchNode exports the cluster node's state (per node: each node reports
// its own view).
func (m *metrics) watchNode(n *cluster.Node) {
	gauge := func(name, help string, f func(cluster.Status) float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, func() float64 { return f(n.Status()) })
	}
	b := func(v bool) float64 {
		if v {
			return 1
		}
		return 0
	}
	m.reg.MustRegister(
		gauge("drover_cluster_nats_up", "1 while this node is connected to NATS; 0: changes travel through the database only (slower, still correct).",
			func(s cluster.Status) float64 { return b(s.NATS) }),
		gauge("drover_cluster_summaries_via_db", "1 while some node cannot reach NATS: every node writes its push summaries to the database and reads the others' there.",
			func(s cluster.Status) float64 { return b(s.SummariesViaDB) }),
		gauge("drover_cluster_leader", "1 on the node that leads the cluster (alert checks, change log pruning).",
			func(s cluster.Status) float64 { return b(s.Leader) }),
		gauge("drover_cluster_change_log_up", "1 while this node reads the cluster's change log.",
			func(s cluster.Status) float64 { return b(s.ChangeLogErr == "") }),
		gauge("drover_cluster_change_lag_seconds", "Age of the last change another node made when this node applied it.",
			func(s cluster.Status) float64 { return s.Lag.Seconds() }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "drover_cluster_changes_applied_total",
			Help: "Change log entries (devices, profiles) other nodes wrote that this node applied."},
			func() float64 { return float64(n.Status().Applied) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "drover_cluster_device_reads_total",
			Help: "Devices this node read back from the database: change log entries, tokens its memory refused (at most one read per token per 10 s), registrations another node stored."},
			func() float64 { return float64(n.Status().DeviceReads) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "drover_cluster_command_queries_total",
			Help: "Pushes that asked the database about remote commands: a command queued for the device, or results; other pushes ask nothing."},
			func() float64 { return float64(n.Status().CommandQueries) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "drover_cluster_push_summaries_applied_total",
			Help: "Other nodes' pushes this node took into its view of the fleet (NATS or database)."},
			func() float64 { return float64(n.Status().States) }),
	)
}

// clusterNodes lists the nodes for the dashboard; nil when not a cluster.
func (s *Server) clusterNodes() func(context.Context) ([]fleet.ClusterNode, string, error) {
	if s.node == nil {
		return nil
	}
	return func(ctx context.Context) ([]fleet.ClusterNode, string, error) {
		nodes, err := s.node.Nodes(ctx)
		return nodes, s.cfg.ClusterNode(), err
	}
}
