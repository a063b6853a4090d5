// Package agent is the Linux device agent: it registers a device with a
// Drover server, pushes the state it reads from /proc and /sys, and applies
// the configuration the server answers with through a hook command.
package agent

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/drover/drover/internal/buildinfo"
	"github.com/drover/drover/internal/fsutil"
	"github.com/drover/drover/internal/protocol"
	"github.com/drover/drover/internal/tunnel"
)

// Config is everything the agent can be told; Main fills it from flags.
type Config struct {
	Server       string
	EnrollSecret string
	// EnrollToken is an operator's single-use enrollment token; sent while
	// the device has no device key yet.
	EnrollToken string
	StateDir    string
	TLS         TLSOptions

	Hook             string        // shell command that applies a configuration
	HookTimeout      time.Duration // the hook is killed after this
	HookRetry        time.Duration // a failed version is tried again after this (0: only when a new version arrives)
	Collector        string        // shell command that prints signal and extra values
	CollectorTimeout time.Duration

	// Remote commands (commands.go): the kinds this device runs, the
	// executable set-config and hook run (argv, no shell), the command
	// reboot runs, and the logs read-log may read by name.
	CommandKinds  []string
	CommandHook   string
	RebootCommand []string
	Logs          map[string]string
	// Connect holds a persistent connection to the server, which then
	// reaches the device within a second (connect.go).
	Connect bool
	// TunnelAllow is what the server may reach through this device when
	// it asks for a tunnel (tunnel.go); empty: nothing.
	TunnelAllow *tunnel.AllowList
	// RemoteShell is the shell the server may start on this device, with
	// a terminal, for an operator (remote.go); "": none.
	RemoteShell string
	// FilesAllow is the directories the server may write files to and
	// read files from (remote.go); empty: none. FilesMaxSize bounds a
	// file either way.
	FilesAllow   *tunnel.FileRoots
	FilesMaxSize int64

	Identity  Identity // empty fields are read from the system
	MachineID string   // empty: the one kept in StateDir, derived once (identity.go)
	// IdentityScript is a shell command whose first line of output a new
	// state directory's machine ID is derived from, before any hardware
	// fact (identity.go).
	IdentityScript string

	Root       string   // where /proc, /sys and /etc are read ("/" on a device)
	DiskPath   string   // file system whose usage is reported
	Interfaces []string // glob patterns of reported interfaces; empty: all but lo

	MinBackoff     time.Duration // first retry delay after an error
	MaxBackoff     time.Duration // cap of the retry delay
	EnrollRetry    time.Duration // retry delay after a rejected enrollment secret
	RequestTimeout time.Duration
	CPUWindow      time.Duration // CPU is measured over this before the first push

	// Firmware updates (firmware.go): the hook that installs a firmware
	// file, its time limit, and the ed25519 public key firmware must be
	// signed with ("": signatures are not checked).
	FirmwareHook        string
	FirmwareHookTimeout time.Duration
	FirmwareKey         string

	Once   bool // register if needed, push once (twice when a configuration was applied) and return
	Logger *slog.Logger
}

// DefaultConfig holds the defaults of the flags.
func DefaultConfig() Config {
	return Config{
		StateDir:            "/var/lib/drover-agent",
		HookTimeout:         5 * time.Minute,
		FirmwareHookTimeout: 30 * time.Minute,
		HookRetry:           30 * time.Minute,
		CollectorTimeout:    20 * time.Second,
		Root:                "/",
		DiskPath:            "/",
		MinBackoff:          2 * time.Second,
		MaxBackoff:          5 * time.Minute,
		EnrollRetry:         10 * time.Minute,
		RequestTimeout:      30 * time.Second,
		FilesMaxSize:        64 << 20,
		CPUWindow:           time.Second,
		CommandKinds:        DefaultCommandKinds,
		RebootCommand:       []string{"/sbin/reboot"},
	}
}

// Version is the build's version.
func Version() string { return buildinfo.Version() }

// defaultInterval is used until the server names one.
const defaultInterval = time.Minute

// ErrPending means the registration waits for an operator's approval
// (docs/protocol.md#admission).
var ErrPending = errors.New("the registration waits for an operator's approval (202)")

// admissionCodes are the 403 codes of admission (the device itself is
// refused); any other 403 to a registration is a wrong enrollment secret.
var admissionCodes = map[string]bool{"device_blocked": true, "device_decommissioned": true, "not_preauthorized": true,
	"certificate_required": true, "invalid_enrollment_token": true}

// ErrEnrollment means the server refused the enrollment secret.
var ErrEnrollment = errors.New("the server rejected the enrollment secret (403): check --enroll-secret against the server's secrets.json")

// Agent is one running device agent.
type Agent struct {
	cfg           Config
	log           *slog.Logger
	client        *client
	sys           *system
	identity      Identity
	machineID     string
	st            persisted
	prevToken     string        // the token last refused, sent when registering again
	seq           uint64        // last sequence number sent
	interval      time.Duration // as the server last said
	intervalKnown bool
	reporting     bool // this push reports a hook's result
	pushed        bool // a push was accepted since the agent started
	// rebootAfterPush: a reboot command's result is queued; reboot once
	// a push carried it.
	rebootAfterPush bool
	// Persistent connection (connect.go): the token it authenticates
	// with, and the server's requests to push now.
	connToken atomic.Value // string
	nudges    chan struct{}
	linkOpen  atomic.Bool // the tunnel link is open (tunnel.go)
	// On demand (connect.go): the connection is held until onDemand
	// (unix ns) while demanding; runCtx is Run's.
	onDemand  atomic.Int64
	demanding atomic.Bool
	runCtx    context.Context
	bo        backoff
	lock      *os.File
	sleep     func(context.Context, time.Duration) bool // replaced in tests

	// Firmware update (firmware.go): fwMu guards st.Firmware against the
	// download goroutine, which fwStop cancels and which wakes the loop.
	fwMu       sync.Mutex
	fwStop     context.CancelFunc
	fwProgress atomic.Int64
	fwKey      ed25519.PublicKey
	wake       chan struct{}
}

// New checks cfg, takes the state directory and loads the agent's state.
// Close releases the directory.
func New(cfg Config) (*Agent, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Server == "" {
		return nil, errors.New("--server is required")
	}
	if cfg.StateDir == "" {
		return nil, errors.New("--state-dir must not be empty")
	}
	if cfg.MinBackoff <= 0 || cfg.MaxBackoff < cfg.MinBackoff {
		return nil, errors.New("--max-backoff must be at least the minimum backoff, and both positive")
	}
	if cfg.HookTimeout <= 0 || cfg.CollectorTimeout <= 0 || cfg.RequestTimeout <= 0 || cfg.EnrollRetry <= 0 {
		return nil, errors.New("timeouts must be positive")
	}
	if cfg.HookRetry < 0 {
		return nil, errors.New("--hook-retry must not be negative")
	}
	if cfg.FirmwareHookTimeout <= 0 {
		return nil, errors.New("--firmware-hook-timeout must be positive")
	}
	var fwKey ed25519.PublicKey
	if cfg.FirmwareKey != "" {
		k, err := LoadFirmwareKey(cfg.FirmwareKey)
		if err != nil {
			return nil, fmt.Errorf("--firmware-key: %w", err)
		}
		fwKey = k
	}
	c, err := newClient(cfg.Server, cfg.TLS, cfg.RequestTimeout)
	if err != nil {
		return nil, err
	}
	a := &Agent{
		cfg: cfg, log: cfg.Logger, client: c,
		sys: &system{root: cfg.Root, diskPath: cfg.DiskPath, interfaces: cfg.Interfaces, cpuWindow: cfg.CPUWindow, log: cfg.Logger},
		bo:  backoff{min: cfg.MinBackoff, max: cfg.MaxBackoff}, sleep: sleepCtx,
		interval: defaultInterval, fwKey: fwKey, wake: make(chan struct{}, 1),
	}
	a.identity = a.sys.identity()
	for _, o := range []struct {
		dst *string
		v   string
	}{
		{&a.identity.DeviceType, cfg.Identity.DeviceType}, {&a.identity.Model, cfg.Identity.Model},
		{&a.identity.Serial, cfg.Identity.Serial}, {&a.identity.Firmware, cfg.Identity.Firmware},
	} {
		if o.v != "" {
			*o.dst = o.v
		}
	}
	check := *a.registerRequest()
	check.MachineID = "checked-later"
	if check.EnrollmentSecret == "" {
		check.EnrollmentSecret = "checked-later"
	}
	if err := check.Validate(); err != nil {
		return nil, fmt.Errorf("device identity: %w", err)
	}
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return nil, err
	}
	if a.lock, err = os.OpenFile(filepath.Join(cfg.StateDir, lockFile), os.O_CREATE|os.O_RDWR, 0o600); err != nil {
		return nil, err
	}
	if err := lockDir(a.lock); err != nil {
		a.lock.Close()
		return nil, fmt.Errorf("another agent uses %s: %w", cfg.StateDir, err)
	}
	ok := false
	defer func() {
		if !ok {
			a.Close()
		}
	}()
	id, created, err := loadMachineID(cfg.StateDir, cfg.MachineID, func() (string, error) {
		id, source, err := DeriveMachineID(context.Background(), cfg.Root, cfg.IdentityScript)
		if err == nil {
			a.log.Info("machine ID derived", "machine_id", id, "source", source)
		}
		return id, err
	})
	if err != nil {
		return nil, fmt.Errorf("machine ID: %w", err)
	}
	if len(id) > protocol.MaxIDLen {
		return nil, fmt.Errorf("machine ID is longer than %d bytes", protocol.MaxIDLen)
	}
	a.machineID = id
	if a.st, err = loadState(cfg.StateDir); err != nil {
		a.log.Error("state lost; registering again", "err", err)
	}
	if created && a.st.Token != "" {
		a.log.Info("machine ID changed; registering again", "machine_id", id)
		a.st.DeviceID, a.st.Token, a.st.DeviceKey = "", "", ""
	}
	if a.st.Token != "" && a.st.Server != cfg.Server {
		a.log.Info("server changed; registering again", "was", a.st.Server, "server", cfg.Server)
		a.st.DeviceID, a.st.Token, a.st.DeviceKey = "", "", ""
	}
	a.seq = a.st.Seq
	ok = true
	return a, nil
}

// Close releases the state directory.
func (a *Agent) Close() error {
	if a.lock == nil {
		return nil
	}
	err := a.lock.Close()
	a.lock = nil
	return err
}

// MachineID is the identity the agent registers with.
func (a *Agent) MachineID() string { return a.machineID }

func (a *Agent) registerRequest() *protocol.RegisterRequest {
	return &protocol.RegisterRequest{
		MachineID: a.machineID, DeviceType: a.identity.DeviceType, Model: a.identity.Model,
		Firmware: a.identity.Firmware, Serial: a.identity.Serial, EnrollmentSecret: a.cfg.EnrollSecret,
		DeviceKey: a.st.DeviceKey, EnrollmentToken: a.enrollToken(),
	}
}

// enrollToken is sent until the device has a key: the token is single use.
func (a *Agent) enrollToken() string {
	if a.st.DeviceKey != "" {
		return ""
	}
	return a.cfg.EnrollToken
}

func (a *Agent) save() {
	a.st.Server = a.cfg.Server
	a.fwMu.Lock()
	err := saveState(a.cfg.StateDir, &a.st)
	a.fwMu.Unlock()
	if err != nil {
		a.log.Error("saving state failed", "dir", a.cfg.StateDir, "err", err)
	}
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// Run registers when needed and pushes until ctx ends. It returns nil when
// ctx ends; with Once it returns after one push (and the report of an
// applied configuration).
func (a *Agent) Run(ctx context.Context) error {
	a.log.Info("agent starting", "server", a.cfg.Server, "machine_id", a.machineID, "device_id", a.st.DeviceID,
		"device_type", a.identity.DeviceType, "firmware", a.identity.Firmware, "state_dir", a.cfg.StateDir)
	justRegistered, reported := false, false
	if !a.cfg.Once {
		a.runCtx = ctx
	}
	if a.cfg.Connect && !a.cfg.Once {
		a.nudges = make(chan struct{}, 1)
		cctx, cancel := context.WithCancel(ctx)
		defer cancel()
		go a.holdConnection(cctx, ctx)
	}
	a.fwStart()
	defer a.fwCancel()
	for {
		a.connToken.Store(a.st.Token)
		if a.st.Token == "" {
			wait, err := a.register(ctx)
			if ctx.Err() != nil {
				return nil
			}
			if err != nil {
				if a.cfg.Once {
					return err
				}
				if !a.sleep(ctx, wait) {
					return nil
				}
				continue
			}
			justRegistered = true
		}
		start := time.Now()
		a.reporting = reported
		report, err := a.pushOnce(ctx)
		if ctx.Err() != nil {
			return nil
		}
		var wait time.Duration
		switch {
		case err == nil:
			a.bo.reset()
			justRegistered = false
			if report && !reported {
				reported = true
				continue // tell the server about the hook's result now
			}
			if len(a.st.Results) > 0 {
				// Command results go at once, however their command
				// arrived: also one in the answer to the push that
				// carried an earlier result. No loop: each command runs
				// once, and every push takes results away.
				reported = true
				continue
			}
			reported = false
			if a.cfg.Once {
				if a.st.ConfigError != "" {
					return fmt.Errorf("configuration version %d is not applied: %s", a.st.FailedVersion, a.st.ConfigError)
				}
				return nil
			}
			wait = a.interval - time.Since(start)
		case statusOf(err) == http.StatusUnauthorized:
			a.log.Warn("token refused; registering again", "err", err)
			a.prevToken, a.st.Token = a.st.Token, ""
			a.save()
			if !justRegistered {
				continue
			}
			if a.cfg.Once {
				return err
			}
			wait = a.bo.next() // a fresh token refused: do not loop
		default:
			if a.cfg.Once {
				return err
			}
			wait = a.retryDelay(err)
			a.log.Warn("push failed", "err", err, "retry_in", wait.Round(time.Millisecond))
		}
		a.connToken.Store(a.st.Token)
		if !a.wait(ctx, wait) {
			return nil
		}
	}
}

// retryDelay is how long to wait after a failed exchange.
func (a *Agent) retryDelay(err error) time.Duration {
	var ae *apiError
	if errors.As(err, &ae) && ae.retryAfter > 0 {
		return a.bo.retryAfterDelay(ae.retryAfter)
	}
	return a.bo.next()
}

// register obtains a token; on failure it returns how long to wait. It
// proves the device with its device key and its last token; while an
// operator has to approve the registration it waits as the server says.
func (a *Agent) register(ctx context.Context) (time.Duration, error) {
	if a.cfg.EnrollSecret == "" && a.st.DeviceKey == "" && a.cfg.EnrollToken == "" {
		err := errors.New("not registered and no --enroll-secret given")
		a.log.Error("cannot register", "err", err)
		return a.cfg.EnrollRetry, err
	}
	resp, err := a.client.register(ctx, a.registerRequest(), a.prevToken)
	if resp.DeviceKey != "" {
		a.st.DeviceKey = resp.DeviceKey // kept also while pending: it claims the request
		a.st.DeviceID = resp.DeviceID
		a.save()
	}
	var pe *pendingError
	switch {
	case errors.As(err, &pe):
		wait := a.bo.retryAfterDelay(max(pe.retryAfter, time.Minute))
		a.log.Warn("registration waits for an operator's approval", "device_id", resp.DeviceID, "retry_in", wait.Round(time.Second),
			"message", resp.Message)
		return wait, ErrPending
	case statusOf(err) == http.StatusForbidden || statusOf(err) == http.StatusConflict:
		refused := err
		var ae *apiError
		if errors.As(err, &ae) && ae.status == http.StatusForbidden && !admissionCodes[ae.code] {
			refused = ErrEnrollment
		}
		a.log.Error("registration refused", "err", refused, "retry_in", a.cfg.EnrollRetry)
		return a.cfg.EnrollRetry, refused
	case err != nil:
		wait := a.retryDelay(err)
		a.log.Warn("registration failed", "err", err, "retry_in", wait.Round(time.Millisecond))
		return wait, err
	}
	if a.st.DeviceID != "" && a.st.DeviceID != resp.DeviceID {
		a.log.Warn("server assigned a different device ID", "was", a.st.DeviceID, "device_id", resp.DeviceID)
	}
	a.st.DeviceID, a.st.Token, a.prevToken = resp.DeviceID, resp.Token, ""
	a.save()
	a.setInterval(resp.PushInterval)
	a.log.Info("registered", "device_id", resp.DeviceID, "new", resp.New, "push_interval", a.interval)
	return 0, nil
}

func (a *Agent) setInterval(seconds int) {
	if seconds < 1 {
		return
	}
	d := time.Duration(min(seconds, 7*24*3600)) * time.Second
	if d != a.interval && a.intervalKnown {
		a.log.Info("push interval changed", "push_interval", d)
	}
	a.interval, a.intervalKnown = d, true
}

// pushOnce collects and sends the state and applies a configuration in the
// answer. report is true when a hook ran, so its result should be pushed
// without waiting for the interval.
func (a *Agent) pushOnce(ctx context.Context) (report bool, err error) {
	st := a.collect(ctx)
	if ctx.Err() != nil {
		return false, ctx.Err()
	}
	a.seq++
	if a.seq > a.st.Seq {
		a.st.Seq = a.seq + seqBlock - 1
		a.save()
	}
	body := &pushBody{Seq: a.seq, ConfigVersion: a.st.ConfigVersion, ConfigError: a.st.ConfigError, State: st, Started: !a.pushed}
	body.Results = a.st.Results[:min(len(a.st.Results), protocol.MaxResultsPerPush)]
	reboot := a.rebootAfterPush && len(body.Results) == len(a.st.Results)
	body.FirmwareUpdate = a.fwReport()
	resp, err := a.client.push(ctx, a.st.Token, body)
	if err != nil {
		return false, err
	}
	a.pushed = true
	if len(body.Results) > 0 {
		a.st.Results = slices.Delete(slices.Clone(a.st.Results), 0, len(body.Results))
		a.save()
	}
	if reboot {
		a.reboot(ctx)
	}
	a.setInterval(resp.PushInterval)
	if resp.Connect > 0 {
		a.connectFor(time.Duration(min(resp.Connect, 24*3600)) * time.Second)
	}
	a.log.Debug("pushed", "seq", a.seq, "config_version", body.ConfigVersion, "state", describe(&st))
	if resp.Config != nil {
		report = a.apply(ctx, resp.Config)
	}
	if len(resp.Commands) > 0 && a.runCommands(ctx, resp.Commands) {
		report = true
	}
	if a.fwStep(ctx, resp.FirmwareUpdate) {
		report = true
	}
	return report || len(a.st.Results) > 0, nil
}

// pause waits d, or less when a firmware download ends; false when ctx
// ended.
func (a *Agent) pause(ctx context.Context, d time.Duration) bool {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-a.wake:
			cancel()
		case <-wctx.Done():
		}
	}()
	a.sleep(wctx, d)
	return ctx.Err() == nil
}

// collect reads the system, runs the collector and makes sure the result
// passes the server's validation.
func (a *Agent) collect(ctx context.Context) protocol.State {
	st := a.sys.collect(ctx)
	st.Firmware = a.identity.Firmware
	if a.cfg.Collector != "" {
		out, errOut, err := runShell(ctx, a.cfg.Collector, nil, a.env(), a.cfg.CollectorTimeout)
		if err != nil {
			msg := clean(firstNonEmpty(lastLine(errOut), err.Error()), protocol.MaxExtraValueLen)
			a.log.Warn("collector failed", "err", err, "stderr", lastLine(errOut))
			st.Extra["collector_error"] = msg
		}
		if len(out) > 0 {
			c, problems := parseCollector(out)
			if len(problems) > 0 {
				a.log.Warn("collector output partly ignored", "problems", strings.Join(problems, "; "))
			}
			c.merge(&st)
		}
	}
	if err := st.Validate(); err != nil {
		a.log.Error("collected state is invalid; sending it without signal and extra", "err", err)
		st.Signal, st.Extra = nil, nil
		if err := st.Validate(); err != nil {
			a.log.Error("collected state is invalid; sending an empty state", "err", err)
			st = protocol.State{}
		}
	}
	return st
}

// env is the environment of hooks and collectors.
func (a *Agent) env() []string {
	return []string{
		"DROVER_DEVICE_ID=" + a.st.DeviceID, "DROVER_MACHINE_ID=" + a.machineID,
		"DROVER_STATE_DIR=" + a.cfg.StateDir, "DROVER_SERVER=" + a.cfg.Server,
	}
}

// apply runs the hook for a configuration unless this version failed
// recently. It returns whether the hook ran.
func (a *Agent) apply(ctx context.Context, c *protocol.Config) bool {
	// Versions are compared for equality (docs/protocol.md): a layered
	// configuration's next version may be a lower number.
	if c.Version == a.st.ConfigVersion {
		a.log.Warn("server sent the configuration version already applied",
			"version", c.Version, "applied_version", a.st.ConfigVersion)
		return false
	}
	if c.Version == a.st.FailedVersion && (a.reporting || a.cfg.HookRetry <= 0 || time.Since(a.st.FailedAt) < a.cfg.HookRetry) {
		return false
	}
	res := a.runHook(ctx, c)
	if ctx.Err() != nil {
		return false
	}
	if res.err == "" {
		a.log.Info("configuration applied", "version", c.Version, "output", res.output)
		a.st.ConfigVersion, a.st.ConfigError = c.Version, ""
		a.st.FailedVersion, a.st.FailedAt = 0, time.Time{}
	} else {
		a.log.Error("configuration hook failed", "version", c.Version, "err", res.err, "output", res.output)
		a.st.ConfigError = res.err
		a.st.FailedVersion, a.st.FailedAt = c.Version, time.Now().UTC()
	}
	a.save()
	return true
}

// runHook hands the configuration to the hook: on stdin, in
// config-pending.json, with the version in DROVER_CONFIG_VERSION. Exit
// status 0 means applied; otherwise the last line the hook printed (stderr
// first) is the error reported to the server.
func (a *Agent) runHook(ctx context.Context, c *protocol.Config) hookResult {
	if a.cfg.Hook == "" {
		return hookResult{err: "no configuration hook is installed on this device (drover agent --hook)"}
	}
	pending := filepath.Join(a.cfg.StateDir, pendingFile)
	applied := filepath.Join(a.cfg.StateDir, appliedFile)
	data := []byte(c.Data)
	if len(data) == 0 {
		data = []byte("null")
	}
	data = append(data[:len(data):len(data)], '\n')
	if err := fsutil.WriteFileAtomic(pending, data, 0o600); err != nil {
		return hookResult{err: clean("agent could not write the configuration: "+err.Error(), protocol.MaxConfigErrorLen)}
	}
	env := append(a.env(),
		fmt.Sprintf("DROVER_CONFIG_VERSION=%d", c.Version),
		"DROVER_CONFIG_FILE="+pending,
		"DROVER_APPLIED_CONFIG_FILE="+applied,
		fmt.Sprintf("DROVER_APPLIED_VERSION=%d", a.st.ConfigVersion),
	)
	a.log.Info("applying configuration", "version", c.Version, "hook", a.cfg.Hook)
	out, errOut, err := runShell(ctx, a.cfg.Hook, data, env, a.cfg.HookTimeout)
	output := clean(strings.TrimSpace(string(errOut)+"\n"+string(out)), 2048)
	if err != nil {
		msg := firstNonEmpty(lastLine(errOut), lastLine(out))
		if msg == "" || strings.HasPrefix(err.Error(), "timed out") {
			msg = "hook " + err.Error()
		}
		return hookResult{err: clean(msg, protocol.MaxConfigErrorLen), output: output}
	}
	if err := os.Rename(pending, applied); err != nil {
		a.log.Warn("keeping the applied configuration failed", "err", err)
	}
	return hookResult{output: output}
}
