package emulator

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/drover/drover/internal/emulator/results"
	"github.com/drover/drover/internal/protocol"
)

// Mode is a load model.
type Mode string

// Load models.
const (
	// ModeFleet is open loop: every device pushes once per Interval at its
	// own phase; latency counts from the intended send time.
	ModeFleet Mode = "fleet"
	// ModeBenchmark is closed loop: Workers push the devices Loops times
	// as fast as the server answers.
	ModeBenchmark Mode = "benchmark"
	// ModeRamp is closed loop with a rising number of workers, until drops,
	// retries or 5xx answers appear.
	ModeRamp Mode = "ramp"
	// ModeConnect holds every device's persistent connection for Duration
	// and, with CommandRate, measures command delivery over it.
	ModeConnect Mode = "connect"
)

// Config is one emulator process's run. DefaultConfig holds the defaults;
// fields marked "auto" are derived from others when zero.
type Config struct {
	Target           string // base URL of the server, http:// or https://
	EnrollmentSecret string
	CACertPEM        []byte // trusted certificates; nil: the system's
	Insecure         bool   // skip certificate verification
	// TLSKeyExchange is what the emulated devices offer, as the agent's
	// --tls-key-exchange (protocol.KeyExchangeGroups): "classic" (X25519,
	// P-256, P-384: no post-quantum key share computed per handshake),
	// "x25519", "p256" or "hybrid" (also X25519MLKEM768).
	TLSKeyExchange string
	// TLSMaxVersion caps the TLS version the devices offer: "1.2" (a
	// resumed session then needs no key exchange), "1.3" or "" (1.3).
	TLSMaxVersion string

	Devices int    // the whole fleet
	Shard   Shard  // this process's share (zero: 1/1)
	Seed    string // identity seed
	// MachineIDs is how machine IDs derive from the seed and the device
	// index: MachineIDsRandom (hashed; "" too) or MachineIDsSequential
	// (a zero-padded counter after a prefix from the seed); both 32
	// characters.
	MachineIDs string

	Mode     Mode
	Conn     ConnMode      // auto: new in fleet mode, keepalive otherwise
	Interval time.Duration // fleet push interval
	Duration time.Duration // fleet: run time (auto: 10 min); benchmark, ramp: limit (0: none)

	Workers int // benchmark workers; registration concurrency in benchmark and ramp
	Loops   int // benchmark loops over all devices (0: register only)

	RampStart        int     // first step's workers
	RampFactor       float64 // workers multiply by this each step
	RampStepDuration time.Duration
	RampMax          int // auto: min(devices of the shard, 16384)

	// Connect mode: commands per second over the whole fleet (each shard
	// sends its share), sent with AdminToken (an operator's API token).
	CommandRate float64
	AdminToken  string

	MaxInflight  int           // fleet: operations in flight at most
	Timeout      time.Duration // per request, connect and TLS included
	MaxRetries   int           // retries after 503/429 (negative: none)
	MaxRetryWait time.Duration // longest wait before a retry
	LateAfter    time.Duration // fleet: a send this much behind schedule is late

	SourceAddrs     []net.IP  // local addresses to dial from, round robin (nil: the system's choice)
	Template        *Template // push body (nil: DefaultTemplate)
	CredentialsFile string    // load and save device IDs and tokens ("": none)
	AcksFile        string    // one JSON line per accepted push ("": none; a shard writes FILE.k-of-n)

	DeviceType, Model, Firmware string // registration fields

	// Firmware rollouts (fleet mode, download.go): a device offered a
	// firmware downloads it at most DownloadRate bytes/s (0: as fast as the
	// link goes); DownloadFailRate (0..1) of the attempts are cut at a
	// random point and resumed with Range; InstallTime after reporting
	// installing, the device "reboots" into the new firmware.
	DownloadRate     int64
	DownloadFailRate float64
	InstallTime      time.Duration

	// Wiped agents (fleet mode, wipe.go): at WipeAt (auto: half of
	// Duration) a share Wipe (0..1) of the devices lose their agent state
	// but keep their machine ID; their re-enrollment requests are approved
	// with AdminToken when it is set.
	Wipe   float64
	WipeAt time.Duration

	RunID    string               // auto: time and random
	Progress func(Progress)       // called once per second and at the end
	Warn     func(string)         // called when a warning is raised during the run
	Logf     func(string, ...any) // informational messages (nil: none)
	// Records, when set, receives every result record written, as values.
	Records *results.Stream
}

// DefaultConfig is the defaults of every field, defined once here.
func DefaultConfig() Config {
	return Config{
		Devices: 1000, Seed: "drover", Mode: ModeFleet, Interval: 200 * time.Second,
		Workers: 8, Loops: 10, RampStart: 8, RampFactor: 2, RampStepDuration: 10 * time.Second,
		MaxInflight: 10000, Timeout: 30 * time.Second, MaxRetries: 5, MaxRetryWait: time.Minute,
		LateAfter: 100 * time.Millisecond, TLSKeyExchange: "classic", DeviceType: "router", Model: "EMU-R1", Firmware: "7.4.2",
		InstallTime: 5 * time.Second,
	}
}

// Progress is a live view of a run.
type Progress struct {
	Phase       string // "register", "push" or "done"
	Elapsed     time.Duration
	Remaining   time.Duration // -1: unknown
	Push, Reg   results.Counts
	PushRate    float64 // operations finished per second in the last interval
	RegRate     float64
	PushP99     time.Duration // last interval (shards: the slowest shard's)
	Inflight    int
	Concurrency int
	CPU         float64 // emulator cores busy
	RSS         int64
	// Firmware downloads (fleet mode): bytes received so far, downloads
	// under way.
	DownloadBytes  int64
	DownloadActive int64
	Final          bool
}

// Validate checks c and fills the "auto" fields. Run does it too.
func (c *Config) Validate() error {
	if c.Target == "" {
		return errors.New("no target URL")
	}
	if c.Devices <= 0 {
		return errors.New("devices must be positive")
	}
	c.Shard = c.Shard.norm()
	if c.Shard.K < 1 || c.Shard.K > c.Shard.N {
		return fmt.Errorf("shard %d/%d: want 1 ≤ k ≤ n", c.Shard.K, c.Shard.N)
	}
	switch c.Mode {
	case ModeFleet, ModeBenchmark, ModeRamp, ModeConnect:
	default:
		return fmt.Errorf("mode %q: want fleet, benchmark, ramp or connect", c.Mode)
	}
	switch c.MachineIDs {
	case "":
		c.MachineIDs = MachineIDsRandom
	case MachineIDsRandom, MachineIDsSequential:
	default:
		return fmt.Errorf("machine IDs %q: want random or sequential", c.MachineIDs)
	}
	if c.Mode == ModeConnect && c.Duration == 0 {
		c.Duration = time.Minute
	}
	if c.Wipe < 0 || c.Wipe > 1 || c.WipeAt < 0 {
		return errors.New("wipe must be a share from 0 to 1, wipe-at not negative")
	}
	if c.Wipe > 0 && c.Mode != ModeFleet {
		return errors.New("wipe needs the fleet mode")
	}
	if c.CommandRate < 0 || (c.CommandRate > 0 && c.AdminToken == "") {
		return errors.New("command rate must not be negative, and commands need an admin token")
	}
	if c.Conn == "" {
		c.Conn = ConnKeepAlive
		if c.Mode == ModeFleet {
			c.Conn = ConnNew
		}
	}
	switch c.Conn {
	case ConnNew, ConnResume, ConnKeepAlive:
	default:
		return fmt.Errorf("conn %q: want new, resume or keepalive", c.Conn)
	}
	if c.TLSKeyExchange == "" {
		c.TLSKeyExchange = protocol.KeyExchangeClassic
	}
	if _, err := protocol.KeyExchangeGroups(c.TLSKeyExchange); err != nil {
		return err
	}
	if _, err := protocol.TLSMaxVersion(c.TLSMaxVersion); err != nil {
		return err
	}
	if c.Interval <= 0 || c.Duration < 0 {
		return errors.New("interval and duration must be positive")
	}
	if c.Mode == ModeFleet && c.Duration == 0 {
		c.Duration = 10 * time.Minute
	}
	if c.Wipe > 0 {
		if c.WipeAt == 0 {
			c.WipeAt = c.Duration / 2
		}
		if c.WipeAt >= c.Duration {
			return errors.New("wipe-at must be before the end of the run")
		}
	}
	if c.Workers <= 0 || c.Loops < 0 {
		return errors.New("workers and loops must be positive")
	}
	if c.RampFactor <= 1 {
		return errors.New("ramp factor must be > 1")
	}
	if c.RampStepDuration < time.Second {
		return errors.New("ramp step duration must be at least 1 s")
	}
	shardDevices := (c.Devices + c.Shard.N - c.Shard.K) / c.Shard.N
	if c.RampMax == 0 {
		c.RampMax = min(shardDevices, 16384)
	}
	if c.Mode == ModeRamp && (c.RampStart < 1 || c.RampMax < c.RampStart) {
		return fmt.Errorf("ramp from %d to %d workers: want 1 ≤ start ≤ max", c.RampStart, c.RampMax)
	}
	if c.Mode == ModeRamp && c.RampMax > shardDevices {
		return fmt.Errorf("ramp max %d is more than the shard's %d devices (a device pushes one request at a time)", c.RampMax, shardDevices)
	}
	if c.MaxInflight <= 0 || c.Timeout <= 0 || c.MaxRetryWait <= 0 || c.LateAfter <= 0 {
		return errors.New("max inflight, timeout, max retry wait and late-after must be positive")
	}
	c.MaxRetries = max(c.MaxRetries, 0)
	if c.DownloadRate < 0 || c.DownloadFailRate < 0 || c.DownloadFailRate >= 1 || c.InstallTime < 0 {
		return errors.New("download rate and install time must be ≥ 0, the download failure rate within 0..1 (1 excluded)")
	}
	if c.RunID == "" {
		var b [6]byte
		rand.Read(b[:])
		c.RunID = time.Now().UTC().Format("20060102T150405Z") + "-" + hex.EncodeToString(b[:])
	}
	if c.Logf == nil {
		c.Logf = func(string, ...any) {}
	}
	return nil
}
