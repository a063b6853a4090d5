package perf

import (
	"errors"
	"fmt"
	"io"
	"runtime"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/drover/drover/internal/hostinfo"
)

// environment is where a test ran: the server's machine (this one, or a
// remote server's as its GET /api/v1/server describes it).
type environment struct {
	Label         string  `json:"label,omitempty"` // --env-label, e.g. C1
	Host          string  `json:"host"`
	CPUModel      string  `json:"cpu_model"`
	Cores         int     `json:"cores"`
	Threads       int     `json:"threads"`
	RAMMiB        float64 `json:"ram_mib"`
	Kernel        string  `json:"kernel"`
	OS            string  `json:"os"`
	GoVersion     string  `json:"go_version"`
	DroverVersion string  `json:"drover_version"`
	Emulator      string  `json:"emulator"` // where the emulator ran
	// LoadMachines are the workers the emulated fleet was split over
	// (--workers); none: the drover perf process.
	LoadMachines []loadMachine `json:"load_machines,omitempty"`
	OpenFiles    uint64        `json:"open_files,omitempty"`
	// The server's cgroup limits: CPUs (quota / period) and memory; 0: none.
	CPULimit    float64 `json:"cpu_limit,omitempty"`
	MemLimitMiB float64 `json:"memory_limit_mib,omitempty"`
	Cgroup      string  `json:"cgroup,omitempty"`
	// Source says where the figures above come from.
	Source string `json:"source,omitempty"`
	// CPUProbeStartUS and CPUProbeEndUS are hostinfo.ProbeCPU on the
	// drover perf machine before and after the test, µs: a thread's speed
	// that day, which on a shared VM can differ twofold between days.
	CPUProbeStartUS float64 `json:"cpu_probe_start_us,omitempty"`
	CPUProbeEndUS   float64 `json:"cpu_probe_end_us,omitempty"`
}

// probeCPU is hostinfo.ProbeCPU in µs.
func probeCPU() float64 { return float64(hostinfo.ProbeCPU().Nanoseconds()) / 1000 }

// cpus is the CPU threads the server may use: the cgroup's quota when it
// is below the machine's threads.
func (e environment) cpus() float64 {
	if e.CPULimit > 0 && (e.Threads == 0 || e.CPULimit < float64(e.Threads)) {
		return e.CPULimit
	}
	return float64(e.Threads)
}

// ram is the memory the server may use, MiB: the cgroup's limit when it
// is below the machine's RAM.
func (e environment) ram() float64 {
	if e.MemLimitMiB > 0 && (e.RAMMiB == 0 || e.MemLimitMiB < e.RAMMiB) {
		return e.MemLimitMiB
	}
	return e.RAMMiB
}

// setCgroup records a cgroup's limits.
func (e *environment) setCgroup(cg hostinfo.Cgroup) {
	e.CPULimit, e.MemLimitMiB, e.Cgroup = cg.CPUs, mib(cg.MemoryMax), ""
	if cg.Limited() {
		e.Cgroup = cg.String()
	}
}

// readEnvironment describes this machine.
func readEnvironment(droverVersion string) environment {
	return hostEnvironment(hostinfo.ReadHost(), runtime.Version(), droverVersion)
}

func hostEnvironment(h hostinfo.Host, goVersion, droverVersion string) environment {
	return environment{Host: h.Name, CPUModel: h.CPUModel, Cores: h.Cores, Threads: h.Threads, RAMMiB: mib(h.RAMBytes),
		Kernel: h.Kernel, OS: h.OS, GoVersion: goVersion, DroverVersion: droverVersion}
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

// metrics are the values `drover perf` reads from a server's /metrics.
type metrics struct {
	RSS       int64   // process_resident_memory_bytes
	CPUSecs   float64 // process_cpu_seconds_total
	StartTime float64 // process_start_time_seconds: a change means a restart
	// Devices by sync state (drover_devices).
	SyncStates map[string]float64
}

// parseMetrics reads the Prometheus text format (expfmt, the parser of
// Prometheus itself) and keeps the few series perf uses.
func parseMetrics(r io.Reader) (metrics, error) {
	m := metrics{SyncStates: map[string]float64{}}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(r)
	if err != nil {
		return m, fmt.Errorf("metrics: %w", err)
	}
	first := func(name string) (float64, bool) {
		if f := families[name]; f != nil && len(f.Metric) > 0 {
			return sampleValue(f.Metric[0]), true
		}
		return 0, false
	}
	rss, ok1 := first("process_resident_memory_bytes")
	cpu, ok2 := first("process_cpu_seconds_total")
	if !ok1 || !ok2 {
		return m, errors.New("metrics: no process_resident_memory_bytes or process_cpu_seconds_total (is this a Drover server on Linux?)")
	}
	m.RSS, m.CPUSecs = int64(rss), cpu
	m.StartTime, _ = first("process_start_time_seconds")
	if f := families["drover_devices"]; f != nil {
		for _, s := range f.Metric {
			for _, l := range s.Label {
				if l.GetName() == "sync_state" && l.GetValue() != "" {
					m.SyncStates[l.GetValue()] = sampleValue(s)
				}
			}
		}
	}
	return m, nil
}

// sampleValue is the value of a gauge, counter or untyped sample.
func sampleValue(s *dto.Metric) float64 {
	switch {
	case s.Gauge != nil:
		return s.Gauge.GetValue()
	case s.Counter != nil:
		return s.Counter.GetValue()
	case s.Untyped != nil:
		return s.Untyped.GetValue()
	}
	return 0
}
