// Package server is `drover serve`: the HTTPS endpoint that device agents and
// operators talk to, on top of the fleet core and a store.
package server

import (
	"context"
	"crypto/tls"
	"encoding/pem"
	"errors"
	"fmt"
	"golang.org/x/crypto/acme/autocert"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/drover/drover/internal/access"
	"github.com/drover/drover/internal/alert"
	"github.com/drover/drover/internal/buildinfo"
	"github.com/drover/drover/internal/cluster"
	"github.com/drover/drover/internal/fleet"
	"github.com/drover/drover/internal/server/transport"
	"github.com/drover/drover/internal/sessions"
	"github.com/drover/drover/internal/store"
	"github.com/drover/drover/internal/web"
	"github.com/prometheus/client_golang/prometheus"
)

// Version is the build's version.
func Version() string { return buildinfo.Version() }

// Server is a running Drover server.
type Server struct {
	cfg       Config
	log       *slog.Logger
	store     store.Store // nil in memory mode
	persist   fleet.Persister
	fleet     *fleet.Service
	m         *metrics
	Secrets   Secrets   // in force at the start; Reload may rotate those given
	Generated Generated // what this start generated (secrets.go)
	CertPEM   []byte    // the serving certificate, PEM
	httpsLn   net.Listener
	httpLn    net.Listener
	debugLn   net.Listener
	debugSrv  *http.Server                    // pprof, on debugLn; closed when Serve returns
	handler   http.Handler                    // routes.go
	start     startup                         // listening while loading (startup.go)
	cert      atomic.Pointer[tls.Certificate] // served on httpsLn; Reload replaces it
	acme      *autocert.Manager               // certificates of -acme-domains (tls.go), or nil
	servers   []*http.Server
	gate      *transport.Gate // the device listeners'
	storeErr  atomic.Pointer[string]
	draining  atomic.Bool
	stopHolds chan struct{} // closed on draining: held over-quota answers go out
	pruneDone chan struct{}
	hub       *hub            // devices' persistent connections (connect.go)
	alerts    *alert.Engine   // alerts.go
	acc       *access.Service // users, tokens, audit log (authz.go)
	node      *cluster.Node   // cluster mode (cluster.go); nil: not
	cstore    store.Cluster   // the store, in cluster mode

	metricsLn  net.Listener
	metricsSrv *http.Server // /metrics without credentials, on metricsLn; closed when Serve returns

	api *api

	// Reload's (reload.go): the configuration in force, secrets read
	// again from their files included, and the SMTP password from its
	// file.
	reloadMu     sync.Mutex
	live         Config
	smtpPassword string
}

// New opens the store, loads the fleet and binds the listeners.
func New(ctx context.Context, cfg Config, log *slog.Logger) (*Server, error) {
	if err := cfg.readSecretFiles(); err != nil {
		return nil, err
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{cfg: cfg, log: log, m: newMetrics(), pruneDone: make(chan struct{}), hub: newHub()}
	ok := false
	defer func() {
		if !ok {
			s.gcAfterLoad(ctx)
			s.closeAll()
		}
	}()
	steps := []func(context.Context) error{
		s.loadSecrets,     // data directory and credentials
		s.listen,          // HTTPS, plain HTTP and debug listeners
		s.answerEarly,     // 503 to devices until the routes are in place
		s.gcForLoad,       // fewer collections while the fleet loads
		s.openPersistence, // store and write mode
		s.loadFleet,       // devices, profiles, labels, alert rules
		s.gcAfterLoad,     // the heap back to its target
		s.buildHandler,    // the routes table and the dashboard
	}
	for _, step := range steps {
		if err := step(ctx); err != nil {
			return nil, err
		}
	}
	s.routesInPlace() // the start-up answers end (startup.go)
	ok = true
	return s, nil
}

// loadSecrets reads or creates the credentials in the data directory; the
// configuration's own secrets win and are never written there.
func (s *Server) loadSecrets(context.Context) error {
	if err := os.MkdirAll(s.cfg.DataDir, 0o750); err != nil {
		return err
	}
	secrets, gen, err := loadSecrets(s.cfg.DataDir, Secrets{EnrollmentSecret: s.cfg.EnrollmentSecret, AdminToken: s.cfg.AdminToken})
	if err != nil {
		return err
	}
	s.Secrets, s.Generated, s.live = secrets, gen, s.cfg
	return nil
}

// openPersistence opens the store and the write mode over it.
func (s *Server) openPersistence(ctx context.Context) error {
	var err error
	switch s.cfg.Persistence {
	case "memory":
		s.persist = fleet.Memory{}
	case "write-through":
		if s.cfg.Cluster {
			if s.cstore, err = store.OpenCluster(ctx, s.cfg.dbDSN(), s.cfg.ClusterNode()); err != nil {
				return err
			}
			s.store = s.cstore
		} else if s.store, err = s.openStoreWaiting(ctx); err != nil {
			return err
		}
		s.watchUpkeep()
		s.persist = fleet.NewWriteThroughWith(s.store, fleet.WriteThroughOptions{
			MaxPending: s.cfg.MaxPendingWrites, Observe: s.observeCommit, CommitInterval: s.cfg.CommitInterval, CommitBatch: s.cfg.CommitBatch})
	case "write-back":
		if s.store, err = s.openStoreWaiting(ctx); err != nil {
			return err
		}
		s.watchUpkeep()
		s.persist = fleet.NewWriteBack(s.store, fleet.WriteBackOptions{FlushInterval: s.cfg.FlushInterval, Observe: s.observeCommit, Logger: s.log})
	default:
		return fmt.Errorf("persistence %q is not available in this build", s.cfg.Persistence)
	}
	return nil
}

// observeCommit counts a store commit and keeps the last failure for
// readiness.
func (s *Server) observeCommit(n int, took time.Duration, err error) {
	s.m.observeCommit(n, took, err)
	if err != nil {
		msg := err.Error()
		if s.storeErr.Swap(&msg) == nil {
			s.log.Error("store commit failed", "records", n, "err", err)
		}
	} else if s.storeErr.Swap(nil) != nil {
		s.log.Info("store commit recovered")
	}
}

// slowUpkeep is how long one step of the store's background work may take
// before it is logged: the merger's and drops' steps hold the writer (and the
// pushes' commits wait as long), a checkpoint's fsync slows the commits'.
const slowUpkeep = time.Second

// watchUpkeep exports the store's background work (SQLite's, PostgreSQL's
// history packing; MariaDB has none) and logs its slow and failed steps.
func (s *Server) watchUpkeep() {
	observe := s.store.Extras().ObserveUpkeep
	if observe == nil {
		return
	}
	var failing sync.Map // work → true while it fails
	observe(func(work string, items int64, took time.Duration, err error) {
		s.m.observeUpkeep(work, items, took, err)
		if err != nil {
			if _, was := failing.Swap(work, true); !was {
				s.log.Warn("store upkeep failed", "work", work, "err", err)
			}
			return
		}
		failing.Delete(work)
		if took >= slowUpkeep {
			s.log.Warn("slow store upkeep", "work", work, "items", items, "took", took.Round(time.Millisecond))
		}
	})
}

// loadFleet loads the fleet from the store, with its labels and the alert
// engine that watches it.
func (s *Server) loadFleet(ctx context.Context) error {
	start := time.Now()
	policy, err := parsePolicy(s.cfg.Admission)
	if err != nil {
		return err
	}
	opts := fleet.Options{
		EnrollmentSecret: s.Secrets.EnrollmentSecret, DefaultPushInterval: s.cfg.PushInterval, Logger: s.log,
		Admission: policy, RequireCertificate: s.cfg.RequireClientCert,
		Quotas: s.cfg.quotas(), Progress: &s.start.loading,
	}
	s.start.setPhase(phaseLoading)
	if err := s.joinCluster(ctx, &opts); err != nil {
		return err
	}
	s.fleet, err = fleet.New(ctx, fleet.StoresOf(s.store), s.persist, opts)
	if err != nil {
		return err
	}
	s.m.watchFleet(s.fleet)
	s.fleet.Subscribe(fleet.Events{
		CommandsQueued: s.hub.notify, // devices on /api/v1/connect push at once
		DeviceMoved:    s.hub.notify,
		ProfileChanged: func(profile uint64) {
			go s.hub.notifyWhere(func(id uint64) bool { return s.fleet.ProfileOf(id) == profile })
		},
		ConfigChanged: func(affects func(id uint64) bool) { go s.hub.notifyWhere(affects) },
	})
	if s.node != nil {
		s.fleet.Subscribe(fleet.Events{Pushed: s.node.OnPush}) // published to the other nodes
	}
	if err := s.setupAlerts(ctx); err != nil {
		return err
	}
	st := s.fleet.Stats()
	s.log.Info("fleet loaded", "devices", st.Devices, "profiles", len(s.fleet.Profiles()), "took", time.Since(start).Round(time.Millisecond),
		"persistence", s.cfg.Persistence, "db", redactDSN(s.cfg.dbDSN()))
	s.adviseDatabase(ctx, st.Devices)
	return nil
}

// buildHandler builds the API and the dashboard behind one routes table.
func (s *Server) buildHandler(context.Context) error {
	ao := access.Options{Store: s.accessStore(), AdminToken: s.Secrets.AdminToken, Logger: s.log}
	if s.cstore != nil {
		// A user or token changed here holds on every node at once: the
		// others drop their cache when they read the change log entry.
		ao.OnChange = func(ctx context.Context) { s.fleet.NoteChange(ctx, fleet.ChangeAccess, 0) }
	}
	s.acc = access.New(ao)
	if s.cstore != nil {
		s.fleet.OnChange(fleet.ChangeAccess, func(context.Context, fleet.Change) error { s.acc.Forget(); return nil })
	}
	a := &api{
		fleet: s.fleet, alerts: s.alerts, m: s.m, log: s.log,
		acc:   s.acc,
		slots: make(chan struct{}, s.cfg.MaxInflight), ready: s.ready, writable: s.writable, degraded: s.degraded, cnode: s.node,
		backend: backendOf(s.cfg.Persistence, s.cfg.dbDSN()), persistence: s.cfg.Persistence,
		regLimit: newRegLimiter(s.cfg.registerLimits()),
		fw:       firmwareFiles{dir: s.cfg.firmwareDir(), max: s.cfg.FirmwareMaxSize, downloadMax: s.cfg.FirmwareDownloadMax},
	}
	a.setMetricsToken(s.cfg.MetricsToken)
	s.api = a
	if s.cstore != nil {
		a.fw.blobs = s.cstore // uploads shared through the database
	} else {
		a.fw.checkFiles(s.fleet.Firmware(), s.log)
	}
	if s.cfg.NodeName != "" {
		a.node = []string{s.cfg.NodeName}
	} else if s.cfg.Cluster {
		a.node = []string{s.cfg.ClusterNode()}
	}
	a.hub = s.hub
	a.tunnels = newTunnels(s.cfg.Tunnel, s.hub)
	a.tunnels.opt = s.cfg.remoteOptions()
	a.fileMax = s.cfg.RemoteFileMaxSize
	a.tunnels.register(s.m.reg)
	if s.node != nil {
		a.relays = &relays{node: s.node, tr: map[cluster.Peer]*http.Transport{},
			count: prometheus.NewCounter(prometheus.CounterOpts{Name: "drover_tunnel_relayed_total",
				Help: "Remote sessions this node relayed to the node holding the device's connection (cluster mode)."})}
		s.m.reg.MustRegister(a.relays.count)
		s.node.ServeLocate(s.hub.holds, s.relaySelf)
		// A device's push may reach any node: each asks it to connect.
		a.tunnels.onAsk = s.node.AskConnect
		s.node.OnConnectAsk(func(dev uint64, until time.Time) { a.tunnels.askConnect(dev, until, false) })
	}
	s.stopHolds = make(chan struct{})
	a.tarpit.Stop, a.tarpit.MaxHold = s.stopHolds, s.cfg.QuotaHold
	ov := &overloadWatch{refused: a.refused.Load}
	sso, err := s.cfg.oidc()
	if err != nil {
		return err
	}
	ui, err := web.New(web.Options{OIDC: sso,
		Fleet: s.fleet, Alerts: s.alerts, Access: s.acc, Audit: a.Audited, Ready: s.ready, Overloaded: ov.reason, Logger: s.log,
		Sessions: s.sessionStore(), SharedSessions: s.cfg.Cluster, Cluster: s.clusterNodes(),
		Terminal: a.DashboardTerminal, Download: a.DashboardDownload, Upload: a.DashboardUpload,
		UploadFirmware: a.storeFirmware, DeleteFirmware: a.removeFirmware, TransferTimeout: s.cfg.FirmwareDownloadMax,
	})
	if err != nil {
		return err
	}
	a.ui = ui
	s.handler = a.routes()
	return nil
}

// listen binds the configured listeners and makes their servers.
func (s *Server) listen(context.Context) error {
	errLog := slog.NewLogLogger(s.log.Handler(), slog.LevelDebug)
	newHTTP := func() *http.Server {
		return &http.Server{
			Handler: s.front(), ErrorLog: errLog, MaxHeaderBytes: 16 << 10, ConnContext: transport.WithConn, ConnState: s.start.connState,
			ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second,
			WriteTimeout: 30 * time.Second, IdleTimeout: 120 * time.Second,
		}
	}
	s.gate = transport.NewGate(s.cfg.MaxBusyConns, s.m.acceptHeld, s.m.acceptHeldTime)
	if s.cfg.Listen != "" {
		cert, generated, err := loadCertificate(&s.cfg)
		if err != nil {
			return fmt.Errorf("tls: %w", err)
		}
		if generated {
			s.log.Info("generated self-signed certificate", "path", s.cfg.DataDir+"/tls/cert.pem")
		}
		for _, der := range cert.Certificate {
			s.CertPEM = append(s.CertPEM, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})...)
		}
		ln, err := s.deviceListener("https", s.cfg.Listen)
		if err != nil {
			return err
		}
		s.cert.Store(&cert)
		if s.acme, err = newACME(&s.cfg); err != nil {
			ln.Close()
			return err
		}
		if s.httpsLn, err = tlsListener(s.gate.Listener(ln), s.getCertificate, &s.cfg); err != nil {
			ln.Close()
			return err
		}
		if err := clientAuth(s.httpsLn.(*tlsLn).cfg, s.cfg.ClientCA); err != nil {
			ln.Close()
			return err
		}
		srv := newHTTP()
		srv.TLSConfig = s.httpsLn.(*tlsLn).cfg
		s.servers = append(s.servers, srv)
	}
	if s.cfg.HTTPListen != "" {
		ln, err := s.deviceListener("http", s.cfg.HTTPListen)
		if err != nil {
			return err
		}
		s.httpLn = s.gate.Listener(ln)
		srv := newHTTP()
		if s.acme != nil {
			srv.Handler = s.acme.HTTPHandler(s.front()) // http-01 challenges; the rest as usual
		}
		s.servers = append(s.servers, srv)
	}
	if s.cfg.DebugListen != "" {
		ln, err := net.Listen("tcp", s.cfg.DebugListen)
		if err != nil {
			return err
		}
		mux := http.NewServeMux()
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		s.debugLn = ln
		s.debugSrv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, ErrorLog: errLog}
	}
	if s.cfg.MetricsListen != "" {
		ln, err := net.Listen("tcp", s.cfg.MetricsListen)
		if err != nil {
			return err
		}
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", s.m.handler())
		s.metricsLn = ln
		s.metricsSrv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, WriteTimeout: 30 * time.Second, ErrorLog: errLog}
	}
	return nil
}

// HTTPSAddr is the bound HTTPS address, or "".
func (s *Server) HTTPSAddr() string {
	if s.httpsLn == nil {
		return ""
	}
	return s.httpsLn.Addr().String()
}

// DebugAddr is the bound debug (pprof) address, or "".
func (s *Server) DebugAddr() string {
	if s.debugLn == nil {
		return ""
	}
	return s.debugLn.Addr().String()
}

// MetricsAddr is the bound address of the metrics listener, or "".
func (s *Server) MetricsAddr() string {
	if s.metricsLn == nil {
		return ""
	}
	return s.metricsLn.Addr().String()
}

// HTTPAddr is the bound plain-HTTP address, or "".
func (s *Server) HTTPAddr() string {
	if s.httpLn == nil {
		return ""
	}
	return s.httpLn.Addr().String()
}

// Fleet exposes the fleet core (for in-process tests and tools).
func (s *Server) Fleet() *fleet.Service { return s.fleet }

func (s *Server) ready() error {
	if s.draining.Load() {
		return errors.New("shutting down")
	}
	if err := s.writable(); err != nil {
		return err
	}
	if e := s.storeErr.Load(); e != nil {
		return errors.New("store failing: " + *e)
	}
	return nil
}

// accessStore keeps users, tokens and the audit log: the store, or memory
// in memory mode.
func (s *Server) accessStore() access.Store {
	if s.store == nil {
		return access.NewMem()
	}
	return s.store
}

// sessionStore is where the dashboard keeps logins: the store, or memory
// in memory mode.
func (s *Server) sessionStore() sessions.Store {
	if s.store == nil {
		return sessions.NewMem()
	}
	return s.store
}

// writable is nil unless another server took the store's instance lock.
func (s *Server) writable() error {
	if s.store == nil {
		return nil
	}
	return s.store.LockLost()
}

// Serve answers requests until ctx ends, then drains in-flight requests and
// pending writes and closes the store.
func (s *Server) Serve(ctx context.Context) error {
	errc := s.start.errc // the servers answer since New (startup.go)
	for _, ln := range s.deviceListeners() {
		proto := "https"
		if ln == s.httpLn {
			proto = "http"
		}
		s.log.Info("listening", "proto", proto, "addr", ln.Addr().String())
	}
	if s.debugSrv != nil {
		s.log.Info("debug listener", "addr", s.debugLn.Addr().String())
		go s.debugSrv.Serve(s.debugLn)
	}
	pruneCtx, stopPrune := context.WithCancel(context.Background())
	go s.pruneLoop(pruneCtx)
	go s.watchCertFiles(pruneCtx, s.cfg.TLSCertCheck)
	rolloutCtx, stopRollouts := context.WithCancel(context.Background())
	rolloutsDone := make(chan struct{})
	go func() {
		defer close(rolloutsDone)
		s.fleet.RunRollouts(rolloutCtx, s.cfg.RolloutInterval)
	}()
	cmdDone := make(chan struct{})
	go func() {
		defer close(cmdDone)
		s.commandLoop(pruneCtx, 30*time.Second)
	}()
	stopAlerts := s.startAlerts()
	stopNode := s.startNode()

	var serveErr error
	select {
	case <-ctx.Done():
		reason := "signal"
		if c := context.Cause(ctx); c != nil && c != ctx.Err() {
			reason = c.Error() // e.g. a handover (SIGUSR2)
		}
		s.log.Info("shutting down", "reason", reason)
	case serveErr = <-errc:
		s.log.Error("listener failed", "err", serveErr)
	}
	s.draining.Store(true)
	// net/http drops a request read once Shutdown began: stop accepting
	// first, and let the connections accepted so far send theirs.
	s.stopAccepting(5 * time.Second)
	if s.stopHolds != nil {
		close(s.stopHolds)
	}
	stopPrune()
	<-s.pruneDone
	<-cmdDone
	s.hub.close()
	if s.api != nil && s.api.tunnels != nil {
		s.api.tunnels.close()
	}
	shutCtx, cancel := context.WithTimeout(context.Background(), s.cfg.ShutdownTimeout)
	defer cancel()
	var wg sync.WaitGroup
	for _, srv := range s.servers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := srv.Shutdown(shutCtx); err != nil {
				s.log.Warn("shutdown: requests still in flight", "err", err)
				srv.Close()
			}
		}()
	}
	wg.Wait()
	stopRollouts() // after the last push: its rollout state is written
	<-rolloutsDone
	stopAlerts()
	stopNode()
	if err := s.persist.Close(shutCtx); err != nil {
		serveErr = errors.Join(serveErr, fmt.Errorf("draining writes: %w", err))
	}
	if s.store != nil {
		if err := s.store.Close(); err != nil {
			serveErr = errors.Join(serveErr, fmt.Errorf("closing store: %w", err))
		}
	}
	if s.debugSrv != nil {
		s.debugSrv.Close() // profiles being taken are cut short
	}
	if s.metricsSrv != nil {
		s.metricsSrv.Close()
	}
	s.log.Info("stopped")
	return serveErr
}

func (s *Server) pruneLoop(ctx context.Context) {
	defer close(s.pruneDone)
	history, audit := s.cfg.HistoryRetention, s.cfg.AuditRetention
	if s.store == nil || history <= 0 && audit <= 0 {
		return
	}
	every := time.Hour
	if history > 0 {
		every = max(min(history/24, time.Hour), time.Minute)
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		if history > 0 {
			n, err := s.fleet.PruneHistory(ctx, history)
			if err != nil && ctx.Err() == nil {
				s.log.Warn("history prune failed", "err", err)
			} else if n > 0 {
				s.log.Info("history pruned", "samples", n)
			}
		}
		if audit > 0 {
			n, err := s.acc.PruneAudit(ctx, audit)
			if err != nil && ctx.Err() == nil {
				s.log.Warn("audit log prune failed", "err", err)
			} else if n > 0 {
				s.log.Info("audit log pruned", "rows", n)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// closeAll releases what New opened when New fails.
func (s *Server) closeAll() {
	for _, srv := range s.servers {
		srv.Close()
	}
	for _, ln := range []net.Listener{s.httpsLn, s.httpLn, s.debugLn, s.metricsLn} {
		if ln != nil {
			ln.Close()
		}
	}
	if s.persist != nil {
		s.persist.Close(context.Background())
	}
	if s.store != nil {
		s.store.Close()
	}
}

// openStore opens the database a DSN names, taking its instance lock.
func openStore(ctx context.Context, dsn string) (store.Store, error) {
	return store.Open(ctx, dsn, store.Options{})
}

// redactDSN is a DSN as the log shows it: the password of its user
// (scheme://user:password@…) and a password parameter (…?password=…)
// as ***.
func redactDSN(dsn string) string {
	at := strings.LastIndexByte(dsn, '@')
	scheme := strings.Index(dsn, "://")
	if at >= 0 && scheme >= 0 && at > scheme {
		if user, _, ok := strings.Cut(dsn[scheme+3:at], ":"); ok {
			dsn = dsn[:scheme+3] + user + ":***" + dsn[at:]
		}
	}
	if q := strings.IndexByte(dsn, '?'); q >= 0 {
		params := strings.Split(dsn[q+1:], "&")
		for i, p := range params {
			if k, _, ok := strings.Cut(p, "="); ok && strings.EqualFold(k, "password") {
				params[i] = k + "=***"
			}
		}
		dsn = dsn[:q+1] + strings.Join(params, "&")
	}
	return dsn
}
