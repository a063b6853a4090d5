package hostinfo

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseProcFiles(t *testing.T) {
	rss, err := ParseStatusRSS([]byte("Name:\tdrover\nVmPeak:\t  2000 kB\nVmRSS:\t   45056 kB\nThreads:\t9\n"))
	if err != nil || rss != 45056<<10 {
		t.Errorf("VmRSS = %d, %v", rss, err)
	}
	if _, err := ParseStatusRSS([]byte("Name:\tkthreadd\n")); err == nil {
		t.Error("no VmRSS: want an error")
	}
	// A command name with spaces and parentheses; utime 250, stime 50 ticks.
	stat := "4242 (drover (x) y) S 1 4242 4242 0 -1 4194560 1000 0 0 0 250 50 0 0 20 0 9 0 12345 2000000 11000 18446744073709551615"
	cpu, err := ParseStatCPU([]byte(stat))
	if err != nil || cpu != 3.0 {
		t.Errorf("cpu = %v, %v; want 3 s", cpu, err)
	}
	mi, err := ParseMemInfo([]byte("MemTotal:       24683632 kB\nMemFree:        20000000 kB\nMemAvailable:   23430000 kB\nBuffers: 1 kB\n"))
	if err != nil || mi.Total != 24683632<<10 || mi.Used != (24683632-23430000)<<10 {
		t.Errorf("meminfo %+v, %v", mi, err)
	}
	if _, err := ParseMemInfo([]byte("MemTotal: 1 kB\n")); err == nil {
		t.Error("no MemAvailable: want an error")
	}
	ci := ParseCPUInfo([]byte(`processor	: 0
model name	: Intel(R) Core(TM) i5-8350U CPU @ 1.70GHz
physical id	: 0
core id		: 0

processor	: 1
model name	: Intel(R) Core(TM) i5-8350U CPU @ 1.70GHz
physical id	: 0
core id		: 1

processor	: 2
model name	: Intel(R) Core(TM) i5-8350U CPU @ 1.70GHz
physical id	: 0
core id		: 0

processor	: 3
model name	: Intel(R) Core(TM) i5-8350U CPU @ 1.70GHz
physical id	: 0
core id		: 1
`))
	if ci.Threads != 4 || ci.Cores != 2 || !strings.Contains(ci.Model, "i5-8350U") {
		t.Errorf("cpuinfo %+v", ci)
	}
	// No topology (e.g. some VMs and ARM): cores = threads.
	if ci := ParseCPUInfo([]byte("processor\t: 0\nprocessor\t: 1\n")); ci.Cores != 2 || ci.Threads != 2 {
		t.Errorf("cpuinfo without topology %+v", ci)
	}
}

func TestReadFromProcRoot(t *testing.T) {
	dir := t.TempDir()
	old := ProcRoot
	ProcRoot = dir
	t.Cleanup(func() { ProcRoot = old })
	os.MkdirAll(filepath.Join(dir, "77"), 0o755)
	os.WriteFile(filepath.Join(dir, "77", "status"), []byte("VmRSS:\t1024 kB\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "77", "stat"), []byte("77 (d) S 1 1 1 0 -1 0 0 0 0 0 100 100 0 0"), 0o644)
	os.WriteFile(filepath.Join(dir, "loadavg"), []byte("0.50 0.40 0.31 2/300 999\n"), 0o644)
	ps, err := ReadProc(77)
	if err != nil || ps.RSS != 1<<20 || ps.CPUSecs != 2 {
		t.Errorf("ReadProc %+v %v", ps, err)
	}
	if l, err := ReadLoad15(); err != nil || l != 0.31 {
		t.Errorf("load15 %v %v", l, err)
	}
}

func TestReadOwnProcess(t *testing.T) {
	if _, err := os.Stat("/proc/self/status"); err != nil {
		t.Skip("no /proc")
	}
	ps, err := ReadProc(os.Getpid())
	if err != nil || ps.RSS < 1<<20 {
		t.Errorf("own process: %+v %v", ps, err)
	}
	h := ReadHost()
	if h.Threads < 1 || h.RAMBytes <= 0 || h.Name == "" {
		t.Errorf("host %+v", h)
	}
}
