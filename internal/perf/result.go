package perf

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/drover/drover/internal/emulator/results"
)

// Result is everything measured in one test: the raw material of the
// protocol. Derived figures are computed from it (Compute), never stored,
// so that a result file and its report cannot disagree.
type Result struct {
	Format     int          `json:"format"`
	Preset     Preset       `json:"preset"`
	Changes    string       `json:"changes,omitempty"` // how the preset was shortened ("" = full test)
	Command    string       `json:"command"`
	Started    time.Time    `json:"started"`
	Ended      time.Time    `json:"ended"`
	Env        environment  `json:"environment"`
	Setup      setup        `json:"setup"`
	Parts      []resultPart `json:"parts"`
	Thresholds thresholds   `json:"thresholds"`
	Notes      []string     `json:"notes,omitempty"`
}

// resultFormat is the version of the JSON layout.
const resultFormat = 1

// setup is how the server under test ran.
type setup struct {
	Target      string `json:"target"`
	Local       bool   `json:"local"` // started by drover perf on this machine
	Backend     string `json:"backend"`
	Persistence string `json:"persistence"`
	TLS         bool   `json:"tls"`
	Conn        string `json:"conn"` // emulator connection mode
	// What the emulated devices offered over TLS (as the agent's
	// --tls-max-version and --tls-key-exchange); empty in older results.
	TLSMaxVersion  string   `json:"tls_max_version,omitempty"`
	TLSKeyExchange string   `json:"tls_key_exchange,omitempty"`
	ServerArgs     []string `json:"server_args,omitempty"`
}

// resultPart is one run of the emulator against one server setting: a test has
// one part, a benchmark one per handler-thread count.
type resultPart struct {
	HandlerThreads int                `json:"handler_threads"`       // 0: as the server was configured
	Persistence    string             `json:"persistence,omitempty"` // registrar test: this run's server
	MachineIDs     string             `json:"machine_ids,omitempty"` // registrar test: sequential or random
	Repeat         int                `json:"repeat,omitempty"`      // registrar test: 1 for a cell's first run
	Started        time.Time          `json:"started"`
	Ended          time.Time          `json:"ended"`
	Push           opFigures          `json:"push"`
	Register       opFigures          `json:"register"`
	ConfigChanges  int                `json:"config_changes,omitempty"` // profile updates made during the run
	Empty          *snapshot          `json:"empty,omitempty"`          // fleet test: the server before registration
	Capacity       *capacity          `json:"capacity,omitempty"`       // overload test: the capacity measured first
	Rollout        *rolloutFigures    `json:"rollout,omitempty"`        // rollout test
	Before         snapshot           `json:"before"`
	After          snapshot           `json:"after"`
	Samples        []sample           `json:"samples,omitempty"`
	Series         []point            `json:"series,omitempty"`
	ScheduleStart  float64            `json:"schedule_start_s,omitempty"` // fleet, overload: the emulator's clock started this long after the series' start
	Log            logSummary         `json:"log"`
	LogReviewed    bool               `json:"log_reviewed"`
	ServerExit     string             `json:"server_exit,omitempty"` // the server ended during the run
	Restarts       int                `json:"restarts,omitempty"`    // remote: process start time changed
	Emulator       emuStats           `json:"emulator"`
	Conns          *results.Conns     `json:"conns,omitempty"`       // the emulator's connections and TLS handshakes
	SyncStates     map[string]float64 `json:"sync_states,omitempty"` // devices by sync state at the end
	Err            string             `json:"error,omitempty"`
}

// opFigures is the emulator's count of one kind of operation.
type opFigures struct {
	Accepted     int64            `json:"accepted"`
	Rejected     map[string]int64 `json:"rejected,omitempty"` // by HTTP status
	Dropped      map[string]int64 `json:"dropped,omitempty"`  // by reason
	Aborted      int64            `json:"aborted,omitempty"`  // cut off by the end of the run
	Retried      int64            `json:"retried,omitempty"`
	Resent       int64            `json:"resent,omitempty"`
	Reregistered int64            `json:"reregistered,omitempty"`
	Skipped      int64            `json:"skipped,omitempty"`      // fleet: a push not sent, device still busy
	Unregistered int64            `json:"unregistered,omitempty"` // not sent: registration failed
	Late         int64            `json:"late,omitempty"`
	ConfigsSeen  int64            `json:"configs_seen,omitempty"`
	RetryAfter   map[string]int64 `json:"retry_after,omitempty"` // 503/429 answers by Retry-After seconds
	ElapsedSec   float64          `json:"elapsed_s"`             // first attempt to last outcome
	LatencyMs    latency          `json:"latency_ms"`
}

// capacity is an overload test's first phase: pushes back to back.
type capacity struct {
	Workers    int       `json:"workers"`
	Seconds    float64   `json:"seconds"`
	Push       opFigures `json:"push"`
	PerSec     float64   `json:"per_s"`     // accepted pushes per second
	Offered    float64   `json:"offered_s"` // the overload phase's pushes per second
	IntervalMs float64   `json:"interval_ms"`
}

// latency percentiles in milliseconds.
type latency struct {
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P99  float64 `json:"p99"`
	Max  float64 `json:"max"`
	Mean float64 `json:"mean"`
}

func sumMap(m map[string]int64) int64 {
	var n int64
	for _, v := range m {
		n += v
	}
	return n
}

// Performed is the operations that got an outcome: accepted, rejected or
// dropped (aborted ones were cut off by the end of the run).
func (o opFigures) Performed() int64 { return o.Accepted + sumMap(o.Rejected) + sumMap(o.Dropped) }

// ErrOrRetried is the methodology's "error-or-retried pushes": rejected,
// dropped, retried after 503/429, and pushes never sent because the device
// was busy or unregistered.
func (o opFigures) ErrOrRetried() int64 {
	return sumMap(o.Rejected) + sumMap(o.Dropped) + o.Retried + o.Skipped + o.Unregistered
}

// snapshot is the server's and machine's state at one moment.
type snapshot struct {
	At       time.Time `json:"at"`
	RSSMiB   float64   `json:"rss_mib"`
	CPUSecs  float64   `json:"cpu_s"`
	UsedMiB  float64   `json:"os_used_mib,omitempty"` // 0: not measured (remote)
	AvailMiB float64   `json:"os_available_mib,omitempty"`
	Load15   float64   `json:"load15,omitempty"`
	Machine  bool      `json:"machine"` // OS memory and load were measured
}

// sample is one server sample during the run.
type sample struct {
	T        float64 `json:"t"` // seconds since the part started
	RSSMiB   float64 `json:"rss_mib"`
	CPUPct   float64 `json:"cpu_pct"` // of one core, since the previous sample
	UsedMiB  float64 `json:"os_used_mib,omitempty"`
	AvailMiB float64 `json:"os_available_mib,omitempty"`
	Load15   float64 `json:"load15,omitempty"`
}

// point is the emulator's view of one time bucket.
type point struct {
	T        float64 `json:"t"`   // bucket start, seconds since the part started
	Dur      float64 `json:"dur"` // bucket length, s
	Done     float64 `json:"done_per_s"`
	Accepted float64 `json:"accepted_per_s"`
	Errors   float64 `json:"errors_per_s"` // pushes and registrations: rejected, dropped, retried
	Regs     float64 `json:"registrations_per_s,omitempty"`
	P50      float64 `json:"p50_ms"`
	P90      float64 `json:"p90_ms"`
	P99      float64 `json:"p99_ms"`
}

// emuStats is the emulator's own cost: it must not be the bottleneck.
type emuStats struct {
	CPUAvg   float64  `json:"cpu_avg_cores"`
	CPUMax   float64  `json:"cpu_max_cores"`
	RSSMiB   float64  `json:"rss_max_mib"`
	Cores    int      `json:"cores"`
	Warnings []string `json:"warnings,omitempty"`
}

// Title is the protocol's title; a changed preset says so.
func (r *Result) Title() string {
	if r.Changes == "" {
		return r.Preset.Name
	}
	return r.Preset.Name + " (scaled down: " + r.Changes + ")"
}

// Save writes r as indented JSON.
func (r *Result) Save(path string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// LoadResult reads a result file.
func LoadResult(path string) (*Result, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var r Result
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if r.Format != resultFormat || r.Preset.Name == "" {
		return nil, fmt.Errorf("%s: not a drover perf result (format %d)", path, r.Format)
	}
	return &r, nil
}

// LoadResults reads result files; a directory contributes every *.json in
// it that is a result.
func LoadResults(paths ...string) ([]*Result, error) {
	var out []*Result
	for _, p := range paths {
		st, err := os.Stat(p)
		if err != nil {
			return nil, err
		}
		if !st.IsDir() {
			r, err := LoadResult(p)
			if err != nil {
				return nil, err
			}
			out = append(out, r)
			continue
		}
		files, _ := filepath.Glob(filepath.Join(p, "*.json"))
		sort.Strings(files)
		for _, f := range files {
			if r, err := LoadResult(f); err == nil {
				out = append(out, r)
			}
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no drover perf results in %s", strings.Join(paths, ", "))
	}
	return out, nil
}

// FileBase is the file name (without extension) of r's reports.
func (r *Result) FileBase() string {
	name := r.Preset.Name
	if r.Changes != "" {
		name += "-scaled"
	}
	return name
}
