// Package hostinfo reads what a process and its machine have: CPUs, memory,
// load, a process's RSS and CPU time (/proc, parsed by
// github.com/prometheus/procfs), and the cgroup limits that
// bound them (cgroup.go). It imports nothing of Drover: the server reports
// it (GET /api/v1/server) and the performance suite records it.
package hostinfo

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/prometheus/procfs"
)

// ProcRoot is where /proc is read from (tests point it at fixtures).
var ProcRoot = "/proc"

// ProcStat is a process's resident memory and CPU time.
type ProcStat struct {
	RSS     int64   // bytes
	CPUSecs float64 // user + system
}

// procFS is ProcRoot as github.com/prometheus/procfs reads it.
func procFS() (procfs.FS, error) { return procfs.NewFS(ProcRoot) }

// ReadProc reads /proc/<pid>/status (VmRSS) and /proc/<pid>/stat (utime,
// stime).
func ReadProc(pid int) (ProcStat, error) {
	var ps ProcStat
	fs, err := procFS()
	if err != nil {
		return ps, err
	}
	p, err := fs.Proc(pid)
	if err != nil {
		return ps, err
	}
	status, err := p.NewStatus()
	if err != nil {
		return ps, err
	}
	if status.VmRSS == 0 {
		return ps, errors.New("status: no VmRSS (a zombie or kernel thread?)")
	}
	stat, err := p.Stat()
	if err != nil {
		return ps, fmt.Errorf("stat: %w", err)
	}
	return ProcStat{RSS: int64(status.VmRSS), CPUSecs: stat.CPUTime()}, nil
}

// MemInfo is the machine's memory, bytes. Used is total − available, what
// free(1) reports as used.
type MemInfo struct {
	Total, Available, Used int64
}

// ReadMemInfo reads /proc/meminfo.
func ReadMemInfo() (MemInfo, error) {
	fs, err := procFS()
	if err != nil {
		return MemInfo{}, err
	}
	mi, err := fs.Meminfo()
	if err != nil {
		return MemInfo{}, err
	}
	if mi.MemTotalBytes == nil || mi.MemAvailableBytes == nil {
		return MemInfo{}, errors.New("meminfo: MemTotal or MemAvailable missing")
	}
	m := MemInfo{Total: int64(*mi.MemTotalBytes), Available: int64(*mi.MemAvailableBytes)}
	m.Used = m.Total - m.Available
	return m, nil
}

// ReadLoad15 reads the 15-minute load average from /proc/loadavg.
func ReadLoad15() (float64, error) {
	fs, err := procFS()
	if err != nil {
		return 0, err
	}
	l, err := fs.LoadAvg()
	if err != nil {
		return 0, err
	}
	return l.Load15, nil
}

// CPUInfo is the processor as /proc/cpuinfo describes it.
type CPUInfo struct {
	Model   string
	Cores   int // physical cores
	Threads int // logical CPUs
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
	if c, err := ReadCPUInfo(); err == nil {
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
