package hostinfo

import (
	"bufio"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/drover/drover/internal/testwait"
)

func write(t *testing.T, path, s string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

func fixtures(t *testing.T) (proc, cg string) {
	proc, cg = t.TempDir(), t.TempDir()
	oldP, oldC := ProcRoot, CgroupRoot
	ProcRoot, CgroupRoot = proc, cg
	t.Cleanup(func() { ProcRoot, CgroupRoot = oldP, oldC })
	return proc, cg
}

// cgroup v2: cpu.max and memory.max of the process's cgroup and its
// ancestors, the smallest limit winning.
func TestReadCgroupV2(t *testing.T) {
	proc, cg := fixtures(t)
	write(t, filepath.Join(proc, "42", "cgroup"), "0::/perf/c1\n")
	write(t, filepath.Join(cg, "cgroup.controllers"), "cpu memory\n")
	write(t, filepath.Join(cg, "perf", "cpu.max"), "300000 100000\n")
	write(t, filepath.Join(cg, "perf", "memory.max"), "max\n")
	write(t, filepath.Join(cg, "perf", "c1", "cpu.max"), "max 100000\n")
	write(t, filepath.Join(cg, "perf", "c1", "memory.max"), strconv.Itoa(2<<30)+"\n")
	write(t, filepath.Join(cg, "perf", "c1", "memory.current"), "1048576\n")
	c := ReadCgroup(42)
	if c.Version != 2 || c.Path != "/perf/c1" || c.CPUs != 3 || c.MemoryMax != 2<<30 || c.MemoryCurrent != 1<<20 || !c.Limited() {
		t.Errorf("%+v", c)
	}
	if s := c.String(); s != "cgroup v2 /perf/c1: 3 CPU, 2048 MiB" {
		t.Errorf("String %q", s)
	}
	write(t, filepath.Join(proc, "43", "cgroup"), "0::/\n")
	if c := ReadCgroup(43); c.Version != 2 || c.Limited() {
		t.Errorf("root cgroup: %+v", c)
	}
}

// cgroup v1 (cpu and memory on v1 hierarchies): cfs quota / period and
// memory.limit_in_bytes, whose "no limit" is a huge number.
func TestReadCgroupV1(t *testing.T) {
	proc, cg := fixtures(t)
	write(t, filepath.Join(proc, "42", "cgroup"), "4:memory:/m\n2:cpu,cpuacct:/c\n0::/\n")
	write(t, filepath.Join(cg, "cpu", "c", "cpu.cfs_quota_us"), "50000\n")
	write(t, filepath.Join(cg, "cpu", "c", "cpu.cfs_period_us"), "100000\n")
	write(t, filepath.Join(cg, "cpu", "cpu.cfs_quota_us"), "-1\n")
	write(t, filepath.Join(cg, "memory", "m", "memory.limit_in_bytes"), "9223372036854771712\n")
	write(t, filepath.Join(cg, "memory", "m", "memory.usage_in_bytes"), "4096\n")
	c := ReadCgroup(42)
	if c.Version != 1 || c.CPUs != 0.5 || c.MemoryMax != 0 || c.MemoryCurrent != 4096 {
		t.Errorf("%+v", c)
	}
}

// The real thing: a cgroup with a CPU quota and a memory limit, a process
// moved into it, its limits read back from the kernel.
func TestLimitsOnThisHost(t *testing.T) {
	lim, err := NewLimits("drover-test-"+strconv.Itoa(os.Getpid()), 0.5, 256<<20)
	if errors.Is(err, ErrNoDelegation) {
		t.Skipf("cannot make a cgroup with CPU and memory limits here (needs root or a delegated cgroup v2 subtree, or the v1 cpu and memory hierarchies): %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := lim.Remove(); err != nil {
			t.Errorf("remove: %v", err)
		}
	})
	// The child takes 8 MB once told it has been moved.
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperHoldMemory$")
	cmd.Env = append(os.Environ(), "DROVER_HOSTINFO_HOLD=1")
	moved, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { moved.Close(); cmd.Process.Kill(); cmd.Wait() }()
	if err := lim.Add(cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	if _, err := moved.Write([]byte("moved\n")); err != nil {
		t.Fatal(err)
	}
	c := ReadCgroup(cmd.Process.Pid)
	if c.Version != lim.Version || c.CPUs != 0.5 || c.MemoryMax != 256<<20 {
		t.Errorf("cgroup of the moved process: %+v (made v%d)", c, lim.Version)
	}
	if !testwait.Until(5*time.Second, func() bool { c = ReadCgroup(cmd.Process.Pid); return c.MemoryCurrent >= 8e6 }) {
		t.Errorf("the cgroup's memory use does not show the 8 MB taken: %+v", c)
	}
}

// TestHelperHoldMemory is the process TestLimitsOnThisHost moves into its
// cgroup: once a line on stdin says it was moved, it takes 8 MB and holds
// them until stdin ends (or it is killed).
func TestHelperHoldMemory(t *testing.T) {
	if os.Getenv("DROVER_HOSTINFO_HOLD") != "1" {
		t.Skip("a helper process of TestLimitsOnThisHost")
	}
	in := bufio.NewReader(os.Stdin)
	if _, err := in.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 8<<20)
	for i := range b {
		b[i] = 1
	}
	io.Copy(io.Discard, in)
	if b[len(b)-1] != 1 {
		t.Fatal("lost")
	}
}
