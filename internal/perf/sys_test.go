package perf

import (
	"strings"
	"testing"

	"github.com/drover/drover/internal/hostinfo"
)

func TestReadEnvironment(t *testing.T) {
	env := readEnvironment("test")
	if env.Threads < 1 || env.RAMMiB <= 0 || env.GoVersion == "" {
		t.Errorf("environment %+v", env)
	}
	// A cgroup's limits below the machine's bound what the server may use.
	env.Threads, env.RAMMiB = 8, 16384
	env.setCgroup(hostinfo.Cgroup{Version: 2, Path: "/p", CPUs: 1.5, MemoryMax: 2 << 30})
	if env.cpus() != 1.5 || env.ram() != 2048 || !strings.Contains(env.Cgroup, "1.5 CPU, 2048 MiB") {
		t.Errorf("limited %+v: %v CPUs, %v MiB", env, env.cpus(), env.ram())
	}
	env.setCgroup(hostinfo.Cgroup{Version: 2, Path: "/p", CPUs: 32})
	if env.cpus() != 8 || env.ram() != 16384 || env.Cgroup == "" {
		t.Errorf("limits above the machine: %v CPUs, %v MiB", env.cpus(), env.ram())
	}
}

func TestParseMetrics(t *testing.T) {
	text := `# HELP process_resident_memory_bytes Resident memory size in bytes.
# TYPE process_resident_memory_bytes gauge
process_resident_memory_bytes 4.7185920e+07
process_cpu_seconds_total 12.5
process_start_time_seconds 1.7e+09
drover_devices{sync_state="in_sync"} 990
drover_devices{sync_state="pending"} 10
drover_devices{a="x,y",sync_state="w\"q"} 3
drover_pushes_total{outcome="accepted"} 1e+06
go_gc_duration_seconds{quantile="0.5"} NaN
`
	m, err := parseMetrics(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	if m.RSS != 47185920 || m.CPUSecs != 12.5 || m.StartTime != 1.7e9 || m.SyncStates["in_sync"] != 990 || m.SyncStates["pending"] != 10 {
		t.Errorf("%+v", m)
	}
	if _, err := parseMetrics(strings.NewReader("up 1\n")); err == nil {
		t.Error("no process metrics: want an error")
	}
	if v := m.SyncStates[`w"q`]; v != 3 {
		t.Errorf("label with an escaped quote: %v", m.SyncStates)
	}
	if _, err := parseMetrics(strings.NewReader("process_cpu_seconds_total 1\nprocess_resident_memory_bytes{ 2\n")); err == nil {
		t.Error("broken exposition: want an error")
	}
}
