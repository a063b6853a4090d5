package perf

import (
	"bufio"
	"errors"
	"io"
	"math"
	"runtime"
	"strconv"
	"strings"

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
}

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

// parseMetrics reads the Prometheus text format for the few series perf
// uses; anything else is skipped.
func parseMetrics(r io.Reader) (metrics, error) {
	m := metrics{SyncStates: map[string]float64{}}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	var have int
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		name, labels, value, ok := splitSample(line)
		if !ok {
			continue
		}
		switch name {
		case "process_resident_memory_bytes":
			m.RSS, have = int64(value), have|1
		case "process_cpu_seconds_total":
			m.CPUSecs, have = value, have|2
		case "process_start_time_seconds":
			m.StartTime = value
		case "drover_devices":
			if s := labelValue(labels, "sync_state"); s != "" {
				m.SyncStates[s] = value
			}
		}
	}
	if err := sc.Err(); err != nil {
		return m, err
	}
	if have != 3 {
		return m, errors.New("metrics: no process_resident_memory_bytes or process_cpu_seconds_total (is this a Drover server on Linux?)")
	}
	return m, nil
}

// splitSample splits `name{labels} value [timestamp]`.
func splitSample(line string) (name, labels string, value float64, ok bool) {
	rest := line
	if i := strings.IndexByte(line, '{'); i >= 0 {
		j := strings.LastIndexByte(line, '}')
		if j < i {
			return "", "", 0, false
		}
		name, labels, rest = line[:i], line[i+1:j], line[j+1:]
	} else {
		sp := strings.IndexAny(line, " \t")
		if sp < 0 {
			return "", "", 0, false
		}
		name, rest = line[:sp], line[sp:]
	}
	f := strings.Fields(rest)
	if len(f) == 0 {
		return "", "", 0, false
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil || math.IsNaN(v) {
		return "", "", 0, false
	}
	return name, labels, v, true
}

func labelValue(labels, key string) string {
	for labels != "" {
		k, rest, ok := strings.Cut(labels, "=")
		if !ok || len(rest) < 2 || rest[0] != '"' {
			return ""
		}
		end := 1
		for end < len(rest) && rest[end] != '"' {
			if rest[end] == '\\' {
				end++
			}
			end++
		}
		if end >= len(rest) {
			return ""
		}
		if strings.TrimSpace(k) == key {
			v, err := strconv.Unquote(rest[:end+1])
			if err != nil {
				return ""
			}
			return v
		}
		labels = strings.TrimPrefix(strings.TrimSpace(rest[end+1:]), ",")
	}
	return ""
}
