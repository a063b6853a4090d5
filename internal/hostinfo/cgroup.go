package hostinfo

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// CgroupRoot is where cgroup file systems are mounted (tests point it at
// fixtures).
var CgroupRoot = "/sys/fs/cgroup"

// Cgroup is the CPU and memory limits of a process's cgroup. Version 2
// reads cpu.max and memory.max of the unified hierarchy; version 1 (a host
// whose cpu and memory controllers are still on v1 hierarchies) reads
// cpu.cfs_quota_us / cpu.cfs_period_us and memory.limit_in_bytes.
type Cgroup struct {
	Version int    `json:"version"` // 2 or 1; 0: none found
	Path    string `json:"path,omitempty"`
	// CPUs is the CPU quota in CPUs (quota / period); 0: no limit.
	CPUs float64 `json:"cpus,omitempty"`
	// MemoryMax is the memory limit in bytes; 0: no limit.
	MemoryMax int64 `json:"memory_max_bytes,omitempty"`
	// MemoryCurrent is the memory the cgroup uses now (memory.current,
	// memory.usage_in_bytes); 0: not read.
	MemoryCurrent int64 `json:"memory_current_bytes,omitempty"`
}

// Limited says whether the cgroup bounds CPU or memory.
func (c Cgroup) Limited() bool { return c.CPUs > 0 || c.MemoryMax > 0 }

// String is e.g. "cgroup v2 /perf: 1 CPU, 2048 MiB".
func (c Cgroup) String() string {
	if c.Version == 0 {
		return "no cgroup"
	}
	cpu, mem := "no CPU limit", "no memory limit"
	if c.CPUs > 0 {
		cpu = strconv.FormatFloat(c.CPUs, 'f', -1, 64) + " CPU"
	}
	if c.MemoryMax > 0 {
		mem = strconv.FormatInt(c.MemoryMax>>20, 10) + " MiB"
	}
	return fmt.Sprintf("cgroup v%d %s: %s, %s", c.Version, c.Path, cpu, mem)
}

// ReadCgroup reads the limits of process pid's cgroup (0: this process).
// The limits of the cgroup's ancestors bound it too; the smallest wins.
func ReadCgroup(pid int) Cgroup {
	self := "self"
	if pid > 0 {
		self = strconv.Itoa(pid)
	}
	b, err := os.ReadFile(filepath.Join(ProcRoot, self, "cgroup"))
	if err != nil {
		return Cgroup{}
	}
	v1 := map[string]string{}
	var v2 string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 {
			continue
		}
		if f[0] == "0" && f[1] == "" {
			v2 = f[2]
			continue
		}
		for _, ctl := range strings.Split(f[1], ",") {
			v1[ctl] = f[2]
		}
	}
	if cpuP, memP := v1["cpu"], v1["memory"]; cpuP != "" || memP != "" {
		c := Cgroup{Version: 1, Path: memP}
		if c.Path == "" {
			c.Path = cpuP
		}
		if cpuP != "" {
			c.CPUs = minLimit(filepath.Join(CgroupRoot, "cpu"), cpuP, v1CPU)
		}
		if memP != "" {
			c.MemoryMax = int64(minLimit(filepath.Join(CgroupRoot, "memory"), memP, v1Mem))
			c.MemoryCurrent = readInt(filepath.Join(CgroupRoot, "memory", memP, "memory.usage_in_bytes"))
		}
		return c
	}
	root := unifiedRoot()
	if root == "" || v2 == "" {
		return Cgroup{}
	}
	c := Cgroup{Version: 2, Path: v2}
	c.CPUs = minLimit(root, v2, v2CPU)
	c.MemoryMax = int64(minLimit(root, v2, v2Mem))
	c.MemoryCurrent = readInt(filepath.Join(root, v2, "memory.current"))
	return c
}

// unifiedRoot is the cgroup v2 mount: CgroupRoot itself, or its "unified"
// directory on a hybrid host; "" when there is none.
func unifiedRoot() string {
	for _, d := range []string{CgroupRoot, filepath.Join(CgroupRoot, "unified")} {
		if _, err := os.Stat(filepath.Join(d, "cgroup.controllers")); err == nil {
			return d
		}
	}
	return ""
}

// minLimit walks from the cgroup at rel up to the root and returns the
// smallest positive limit read (0: none).
func minLimit(root, rel string, read func(dir string) float64) float64 {
	best := 0.0
	for p := filepath.Clean("/" + rel); ; p = filepath.Dir(p) {
		if v := read(filepath.Join(root, p)); v > 0 && (best == 0 || v < best) {
			best = v
		}
		if p == "/" {
			return best
		}
	}
}

func v2CPU(dir string) float64 {
	b, err := os.ReadFile(filepath.Join(dir, "cpu.max"))
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) != 2 || f[0] == "max" {
		return 0
	}
	q, err1 := strconv.ParseFloat(f[0], 64)
	per, err2 := strconv.ParseFloat(f[1], 64)
	if err1 != nil || err2 != nil || per <= 0 {
		return 0
	}
	return q / per
}

func v2Mem(dir string) float64 {
	b, err := os.ReadFile(filepath.Join(dir, "memory.max"))
	if err != nil || strings.TrimSpace(string(b)) == "max" {
		return 0
	}
	v, err := strconv.ParseFloat(strings.TrimSpace(string(b)), 64)
	if err != nil {
		return 0
	}
	return v
}

func v1CPU(dir string) float64 {
	q := readInt(filepath.Join(dir, "cpu.cfs_quota_us"))
	per := readInt(filepath.Join(dir, "cpu.cfs_period_us"))
	if q <= 0 || per <= 0 {
		return 0
	}
	return float64(q) / float64(per)
}

// v1Mem reads memory.limit_in_bytes; "no limit" is a huge page-rounded
// number there.
func v1Mem(dir string) float64 {
	v := readInt(filepath.Join(dir, "memory.limit_in_bytes"))
	if v <= 0 || v >= math.MaxInt64/2 {
		return 0
	}
	return float64(v)
}

func readInt(path string) int64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0
	}
	return v
}

// ErrNoDelegation says why a cgroup with limits cannot be made here.
var ErrNoDelegation = errors.New("no writable cgroup with the cpu and memory controllers")

// Limits is a cgroup made to run processes under a CPU quota and a memory
// limit (NewLimits); Remove deletes it once its processes have ended.
type Limits struct {
	Version int
	dirs    []string // the cgroup directories made (v1: one per controller)
	procs   []string // their cgroup.procs files
}

// NewLimits makes a child cgroup named name with cpus CPUs (0: no quota)
// and memBytes of memory (0: no limit): under cgroup v2 when the cpu and
// memory controllers can be enabled, else on the v1 cpu and memory
// hierarchies. It needs root (or a delegated cgroup); the error wraps
// ErrNoDelegation with the reason when neither works.
func NewLimits(name string, cpus float64, memBytes int64) (*Limits, error) {
	const period = 100000
	quota := func() string { return strconv.FormatInt(int64(math.Round(cpus*period)), 10) }
	var why []string
	if root := unifiedRoot(); root != "" {
		l, err := newV2(root, name, cpus, memBytes, quota()+" "+strconv.Itoa(period))
		if err == nil {
			return l, nil
		}
		why = append(why, "cgroup v2: "+err.Error())
	} else {
		why = append(why, "cgroup v2: not mounted at "+CgroupRoot)
	}
	cpuDir, memDir := filepath.Join(CgroupRoot, "cpu", name), filepath.Join(CgroupRoot, "memory", name)
	l := &Limits{Version: 1}
	err := func() error {
		for _, d := range []string{cpuDir, memDir} {
			if err := os.Mkdir(d, 0o755); err != nil {
				return err
			}
			l.dirs = append(l.dirs, d)
			l.procs = append(l.procs, filepath.Join(d, "cgroup.procs"))
		}
		if cpus > 0 {
			if err := os.WriteFile(filepath.Join(cpuDir, "cpu.cfs_period_us"), []byte(strconv.Itoa(period)), 0); err != nil {
				return err
			}
			if err := os.WriteFile(filepath.Join(cpuDir, "cpu.cfs_quota_us"), []byte(quota()), 0); err != nil {
				return err
			}
		}
		// Charge the memory a process already has to the cgroup it
		// moves into (v1 leaves it behind otherwise); older kernels only.
		os.WriteFile(filepath.Join(memDir, "memory.move_charge_at_immigrate"), []byte("3"), 0)
		if memBytes > 0 {
			return os.WriteFile(filepath.Join(memDir, "memory.limit_in_bytes"), []byte(strconv.FormatInt(memBytes, 10)), 0)
		}
		return nil
	}()
	if err == nil {
		return l, nil
	}
	l.Remove()
	why = append(why, "cgroup v1: "+err.Error())
	return nil, fmt.Errorf("%w (%s)", ErrNoDelegation, strings.Join(why, "; "))
}

// newV2 makes the child under this process's own cgroup's parent (a
// cgroup with processes of its own cannot enable controllers for its
// children).
func newV2(root, name string, cpus float64, memBytes int64, cpuMax string) (*Limits, error) {
	parent := root
	if own := ReadCgroup(0); own.Version == 2 && own.Path != "" {
		parent = filepath.Join(root, filepath.Dir(own.Path))
	}
	ctl, err := os.ReadFile(filepath.Join(parent, "cgroup.controllers"))
	if err != nil {
		return nil, err
	}
	have := strings.Fields(string(ctl))
	for _, c := range []string{"cpu", "memory"} {
		if !contains(have, c) {
			return nil, fmt.Errorf("controller %s not available in %s", c, parent)
		}
	}
	if err := os.WriteFile(filepath.Join(parent, "cgroup.subtree_control"), []byte("+cpu +memory"), 0); err != nil {
		return nil, fmt.Errorf("enabling cpu and memory in %s: %w", parent, err)
	}
	dir := filepath.Join(parent, name)
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, err
	}
	l := &Limits{Version: 2, dirs: []string{dir}, procs: []string{filepath.Join(dir, "cgroup.procs")}}
	if cpus > 0 {
		if err := os.WriteFile(filepath.Join(dir, "cpu.max"), []byte(cpuMax), 0); err != nil {
			l.Remove()
			return nil, err
		}
	}
	if memBytes > 0 {
		if err := os.WriteFile(filepath.Join(dir, "memory.max"), []byte(strconv.FormatInt(memBytes, 10)), 0); err != nil {
			l.Remove()
			return nil, err
		}
	}
	return l, nil
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// Add moves process pid into the cgroup.
func (l *Limits) Add(pid int) error {
	for _, p := range l.procs {
		if err := os.WriteFile(p, []byte(strconv.Itoa(pid)), 0); err != nil {
			return fmt.Errorf("moving %d into %s: %w", pid, filepath.Dir(p), err)
		}
	}
	return nil
}

// Remove deletes the cgroup (its processes must have ended).
func (l *Limits) Remove() error {
	var errs []error
	for _, d := range l.dirs {
		if err := os.Remove(d); err != nil && !os.IsNotExist(err) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
