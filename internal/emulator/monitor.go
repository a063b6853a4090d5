package emulator

import (
	"bytes"
	"os"
	"strconv"
	"syscall"
	"time"
)

// monitor samples the emulator's own CPU and memory, and how busy the
// whole machine is.
type monitor struct {
	lastWall    time.Time
	lastCPU     time.Duration
	lastBusy    uint64
	lastTotal   uint64
	pageSize    int64
	statmBuf    []byte
	procStatBuf []byte
}

type sample struct {
	cpu         float64 // cores busy since the last sample
	cpuTotal    time.Duration
	rss         int64
	machineBusy float64 // 0..1 since the last sample; -1 unknown
}

func newMonitor() *monitor {
	m := &monitor{pageSize: int64(os.Getpagesize()), statmBuf: make([]byte, 256), procStatBuf: make([]byte, 4096)}
	m.lastWall = time.Now()
	m.lastCPU = processCPU()
	m.lastBusy, m.lastTotal = m.machineTimes()
	return m
}

func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func (m *monitor) sample() sample {
	now := time.Now()
	cpu := processCPU()
	s := sample{cpuTotal: cpu, rss: m.rss(), machineBusy: -1}
	if wall := now.Sub(m.lastWall); wall > 0 {
		s.cpu = float64(cpu-m.lastCPU) / float64(wall)
	}
	busy, total := m.machineTimes()
	if total > m.lastTotal {
		s.machineBusy = float64(busy-m.lastBusy) / float64(total-m.lastTotal)
	}
	m.lastWall, m.lastCPU, m.lastBusy, m.lastTotal = now, cpu, busy, total
	return s
}

// rss reads the resident set from /proc/self/statm (0 where unavailable).
func (m *monitor) rss() int64 {
	f, err := os.Open("/proc/self/statm")
	if err != nil {
		return 0
	}
	n, _ := f.Read(m.statmBuf)
	f.Close()
	fields := bytes.Fields(m.statmBuf[:n])
	if len(fields) < 2 {
		return 0
	}
	pages, _ := strconv.ParseInt(string(fields[1]), 10, 64)
	return pages * m.pageSize
}

// machineTimes reads busy and total jiffies from /proc/stat.
func (m *monitor) machineTimes() (busy, total uint64) {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return 0, 0
	}
	n, _ := f.Read(m.procStatBuf)
	f.Close()
	line, _, _ := bytes.Cut(m.procStatBuf[:n], []byte("\n"))
	fields := bytes.Fields(line)
	if len(fields) < 5 || string(fields[0]) != "cpu" {
		return 0, 0
	}
	fields = fields[1:min(len(fields), 9)] // user … steal; guest time is already in user
	for i, f := range fields {
		v, _ := strconv.ParseUint(string(f), 10, 64)
		total += v
		if i != 3 && i != 4 { // idle, iowait
			busy += v
		}
	}
	return busy, total
}
