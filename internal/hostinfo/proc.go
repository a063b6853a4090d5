// Package hostinfo reads what a process and its machine have: CPUs, memory,
// load, a process's RSS and CPU time (/proc), and the cgroup limits that
// bound them (cgroup.go). It imports nothing of Drover: the server reports
// it (GET /api/v1/server) and the performance suite records it.
package hostinfo

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
)

// ProcRoot is where /proc is read from (tests point it at fixtures).
var ProcRoot = "/proc"

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat times; 100 on every
// Linux architecture Go supports.
const clockTicks = 100

// ProcStat is a process's resident memory and CPU time.
type ProcStat struct {
	RSS     int64   // bytes
	CPUSecs float64 // user + system
}

// ReadProc reads /proc/<pid>/status (VmRSS) and /proc/<pid>/stat (utime,
// stime).
func ReadProc(pid int) (ProcStat, error) {
	var ps ProcStat
	dir := filepath.Join(ProcRoot, strconv.Itoa(pid))
	status, err := os.ReadFile(filepath.Join(dir, "status"))
	if err != nil {
		return ps, err
	}
	if ps.RSS, err = ParseStatusRSS(status); err != nil {
		return ps, err
	}
	stat, err := os.ReadFile(filepath.Join(dir, "stat"))
	if err != nil {
		return ps, err
	}
	ps.CPUSecs, err = ParseStatCPU(stat)
	return ps, err
}

func ParseStatusRSS(b []byte) (int64, error) {
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

// ParseStatCPU reads utime and stime, fields 14 and 15 of stat; the command
// name in parentheses may itself contain spaces and parentheses.
func ParseStatCPU(b []byte) (float64, error) {
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

// MemInfo is the machine's memory, bytes. Used is total − available, what
// free(1) reports as used.
type MemInfo struct {
	Total, Available, Used int64
}

// ReadMemInfo reads /proc/meminfo.
func ReadMemInfo() (MemInfo, error) {
	b, err := os.ReadFile(filepath.Join(ProcRoot, "meminfo"))
	if err != nil {
		return MemInfo{}, err
	}
	return ParseMemInfo(b)
}

func ParseMemInfo(b []byte) (MemInfo, error) {
	var m MemInfo
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

// ReadLoad15 reads the 15-minute load average from /proc/loadavg.
func ReadLoad15() (float64, error) {
	b, err := os.ReadFile(filepath.Join(ProcRoot, "loadavg"))
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return 0, errors.New("loadavg: too few fields")
	}
	return strconv.ParseFloat(f[2], 64)
}

// CPUInfo is the processor as /proc/cpuinfo describes it.
type CPUInfo struct {
	Model   string
	Cores   int // physical cores
	Threads int // logical CPUs
}

func ParseCPUInfo(b []byte) CPUInfo {
	var c CPUInfo
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

func OSRelease() string {
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

// Host describes this machine and the limits of this process's cgroup.
type Host struct {
	Name       string  `json:"host"`
	CPUModel   string  `json:"cpu_model"`
	Cores      int     `json:"cores"`   // physical
	Threads    int     `json:"threads"` // logical CPUs
	RAMBytes   int64   `json:"memory_bytes"`
	Kernel     string  `json:"kernel"`
	OS         string  `json:"os"`
	Cgroup     Cgroup  `json:"cgroup"`
	UsedBytes  int64   `json:"memory_used_bytes"`      // MemTotal − MemAvailable
	AvailBytes int64   `json:"memory_available_bytes"` // MemAvailable
	Load15     float64 `json:"load15"`
}

// ReadHost describes this machine; what cannot be read stays zero.
func ReadHost() Host {
	var h Host
	h.Name, _ = os.Hostname()
	if b, err := os.ReadFile(filepath.Join(ProcRoot, "cpuinfo")); err == nil {
		c := ParseCPUInfo(b)
		h.CPUModel, h.Cores, h.Threads = c.Model, c.Cores, c.Threads
	}
	if h.Threads == 0 {
		h.Threads, h.Cores = runtime.NumCPU(), runtime.NumCPU()
	}
	if m, err := ReadMemInfo(); err == nil {
		h.RAMBytes, h.UsedBytes, h.AvailBytes = m.Total, m.Used, m.Available
	}
	h.Load15, _ = ReadLoad15()
	if b, err := os.ReadFile(filepath.Join(ProcRoot, "sys/kernel/osrelease")); err == nil {
		h.Kernel = runtime.GOOS + " " + strings.TrimSpace(string(b))
	} else {
		h.Kernel = runtime.GOOS
	}
	h.OS = OSRelease()
	h.Cgroup = ReadCgroup(0)
	return h
}
