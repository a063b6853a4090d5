package hostinfo

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// procRoot points ProcRoot at a fixture directory with files (path ->
// content) for the test.
func procRoot(t *testing.T, files map[string]string) {
	t.Helper()
	dir := t.TempDir()
	old := ProcRoot
	ProcRoot = dir
	t.Cleanup(func() { ProcRoot = old })
	for name, content := range files {
		os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755)
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// A full /proc/<pid>/stat line of 52 fields.
func statLine(pid, comm string, utime, stime int) string {
	return fmt.Sprintf("%s (%s) S 1 4242 4242 0 -1 4194560 1000 0 0 0 %d %d 0 0 20 0 9 0 12345 2000000 11000 "+
		"18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0 0 0 0 0 0 0 0 0\n", pid, comm, utime, stime)
}

func TestParseProcFiles(t *testing.T) {
	procRoot(t, map[string]string{
		// A command name with spaces and parentheses; utime 250, stime 50 ticks.
		"4242/status": "Name:\tdrover\nVmPeak:\t  2000 kB\nVmRSS:\t   45056 kB\nThreads:\t9\n",
		"4242/stat":   statLine("4242", "drover (x) y", 250, 50),
		"2/status":    "Name:\tkthreadd\n",
		"2/stat":      statLine("2", "kthreadd", 0, 0),
		"meminfo":     "MemTotal:       24683632 kB\nMemFree:        20000000 kB\nMemAvailable:   23430000 kB\nBuffers: 1 kB\n",
		"cpuinfo": `processor	: 0
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
`,
	})
	ps, err := ReadProc(4242)
	if err != nil || ps.RSS != 45056<<10 {
		t.Errorf("VmRSS = %d, %v", ps.RSS, err)
	}
	if ps.CPUSecs != 3.0 {
		t.Errorf("cpu = %v; want 3 s", ps.CPUSecs)
	}
	if _, err := ReadProc(2); err == nil {
		t.Error("no VmRSS: want an error")
	}
	mi, err := ReadMemInfo()
	if err != nil || mi.Total != 24683632<<10 || mi.Used != (24683632-23430000)<<10 {
		t.Errorf("meminfo %+v, %v", mi, err)
	}
	ci, err := ReadCPUInfo()
	if err != nil || ci.Threads != 4 || ci.Cores != 2 || !strings.Contains(ci.Model, "i5-8350U") {
		t.Errorf("cpuinfo %+v %v", ci, err)
	}
	procRoot(t, map[string]string{"meminfo": "MemTotal: 1 kB\n", "cpuinfo": "processor\t: 0\nprocessor\t: 1\n"})
	if _, err := ReadMemInfo(); err == nil {
		t.Error("no MemAvailable: want an error")
	}
	// No topology (e.g. some VMs and ARM): cores = threads.
	if ci, err := ReadCPUInfo(); ci.Cores != 2 || ci.Threads != 2 {
		t.Errorf("cpuinfo without topology %+v %v", ci, err)
	}
}

func TestReadFromProcRoot(t *testing.T) {
	procRoot(t, map[string]string{
		"77/status": "VmRSS:\t1024 kB\n",
		"77/stat":   statLine("77", "d", 100, 100),
		"loadavg":   "0.50 0.40 0.31 2/300 999\n",
	})
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
