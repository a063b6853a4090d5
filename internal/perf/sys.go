package perf

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
)

// procRoot is where /proc is read from (tests point it at fixtures).
var procRoot = "/proc"

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat times; 100 on every
// Linux architecture Go supports.
const clockTicks = 100

// procStat is a process's resident memory and CPU time.
type procStat struct {
	RSS     int64   // bytes
	CPUSecs float64 // user + system
}

// readProc reads /proc/<pid>/status (VmRSS) and /proc/<pid>/stat (utime,
// stime).
func readProc(pid int) (procStat, error) {
	var ps procStat
	dir := filepath.Join(procRoot, strconv.Itoa(pid))
	status, err := os.ReadFile(filepath.Join(dir, "status"))
	if err != nil {
		return ps, err
	}
	if ps.RSS, err = parseStatusRSS(status); err != nil {
		return ps, err
	}
	stat, err := os.ReadFile(filepath.Join(dir, "stat"))
	if err != nil {
		return ps, err
	}
	ps.CPUSecs, err = parseStatCPU(stat)
	return ps, err
}

func parseStatusRSS(b []byte) (int64, error) {
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(v)
			if len(f) != 2 || f[1] != "kB" {
				return 0, fmt.Errorf("status: odd VmRSS line %q", line)
			}
			kb, err := strconv.ParseInt(f[0], 10, 64)
			return kb << 10, err
		}
	}
	return 0, errors.New("status: no VmRSS (a zombie or kernel thread?)")
}

// parseStatCPU reads utime and stime, fields 14 and 15 of stat; the command
// name in parentheses may itself contain spaces and parentheses.
func parseStatCPU(b []byte) (float64, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, errors.New("stat: no command name")
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state); utime is field 14.
	if len(f) < 13 {
		return 0, errors.New("stat: too few fields")
	}
	ut, err1 := strconv.ParseUint(f[11], 10, 64)
	st, err2 := strconv.ParseUint(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("stat: %w", err)
	}
	return float64(ut+st) / clockTicks, nil
}

// memInfo is the machine's memory, bytes. Used is total − available, what
// free(1) reports as used.
type memInfo struct {
	Total, Available, Used int64
}

// readMemInfo reads /proc/meminfo.
func readMemInfo() (memInfo, error) {
	b, err := os.ReadFile(filepath.Join(procRoot, "meminfo"))
	if err != nil {
		return memInfo{}, err
	}
	return parseMemInfo(b)
}

func parseMemInfo(b []byte) (memInfo, error) {
	var m memInfo
	var have int
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		f := strings.Fields(v)
		if len(f) == 0 {
			continue
		}
		n, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			continue
		}
		switch k {
		case "MemTotal":
			m.Total, have = n<<10, have|1
		case "MemAvailable":
			m.Available, have = n<<10, have|2
		}
	}
	if have != 3 {
		return m, errors.New("meminfo: MemTotal or MemAvailable missing")
	}
	m.Used = m.Total - m.Available
	return m, nil
}

// readLoad15 reads the 15-minute load average from /proc/loadavg.
func readLoad15() (float64, error) {
	b, err := os.ReadFile(filepath.Join(procRoot, "loadavg"))
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return 0, errors.New("loadavg: too few fields")
	}
	return strconv.ParseFloat(f[2], 64)
}

// cpuInfo is the processor as /proc/cpuinfo describes it.
type cpuInfo struct {
	Model   string
	Cores   int // physical cores
	Threads int // logical CPUs
}

func parseCPUInfo(b []byte) cpuInfo {
	var c cpuInfo
	cores := map[string]bool{}
	phys, core := "", ""
	flush := func() {
		if core != "" {
			cores[phys+"/"+core] = true
		}
		phys, core = "", ""
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			if strings.TrimSpace(line) == "" {
				flush()
			}
			continue
		}
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		switch k {
		case "processor":
			c.Threads++
		case "model name", "Model", "cpu model":
			if c.Model == "" {
				c.Model = v
			}
		case "physical id":
			phys = v
		case "core id":
			core = v
		}
	}
	flush()
	c.Cores = len(cores)
	if c.Cores == 0 || c.Cores > c.Threads {
		c.Cores = c.Threads
	}
	return c
}

// environment is where a test ran.
type environment struct {
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
	OpenFiles     uint64  `json:"open_files,omitempty"`
}

// readEnvironment describes this machine.
func readEnvironment(droverVersion string) environment {
	e := environment{GoVersion: runtime.Version(), DroverVersion: droverVersion}
	e.Host, _ = os.Hostname()
	if b, err := os.ReadFile(filepath.Join(procRoot, "cpuinfo")); err == nil {
		c := parseCPUInfo(b)
		e.CPUModel, e.Cores, e.Threads = c.Model, c.Cores, c.Threads
	}
	if e.Threads == 0 {
		e.Threads, e.Cores = runtime.NumCPU(), runtime.NumCPU()
	}
	if m, err := readMemInfo(); err == nil {
		e.RAMMiB = mib(m.Total)
	}
	if b, err := os.ReadFile(filepath.Join(procRoot, "sys/kernel/osrelease")); err == nil {
		e.Kernel = runtime.GOOS + " " + strings.TrimSpace(string(b))
	} else {
		e.Kernel = runtime.GOOS
	}
	e.OS = osRelease()
	return e
}

func osRelease() string {
	b, err := os.ReadFile("/etc/os-release")
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "PRETTY_NAME="); ok {
			return strings.Trim(v, `"`)
		}
	}
	return ""
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
