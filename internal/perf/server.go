package perf

import (
	"encoding/json"
	"fmt"
	"net/http"
	"runtime"

	"github.com/drover/drover/internal/hostinfo"
)

// serverInfo is a server's GET /api/v1/server (internal/server/serverinfo.go).
type serverInfo struct {
	hostinfo.Host
	GoVersion     string  `json:"go_version"`
	DroverVersion string  `json:"drover_version"`
	Backend       string  `json:"backend"`
	Persistence   string  `json:"persistence"`
	GOMAXPROCS    int     `json:"gomaxprocs"`
	RSSBytes      int64   `json:"rss_bytes"`
	CPUSeconds    float64 `json:"cpu_seconds"`
}

// serverInfo reads GET /api/v1/server with the admin token.
func (t *target) serverInfo() (serverInfo, error) {
	var in serverInfo
	req, err := http.NewRequest("GET", t.url+"/api/v1/server", nil)
	if err != nil {
		return in, err
	}
	req.Header.Set("Authorization", "Bearer "+t.admin)
	resp, err := t.client.Do(req)
	if err != nil {
		return in, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return in, fmt.Errorf("GET /api/v1/server: HTTP %d", resp.StatusCode)
	}
	err = json.NewDecoder(resp.Body).Decode(&in)
	return in, err
}

// describe records the server's machine in r: a local server's cgroup
// limits; a remote server's machine, limits, versions and store as its
// GET /api/v1/server tells (with --admin-token), the load machine then
// being only where the emulator ran.
func (t *target) describe(r *Result) {
	if t.local != nil {
		r.Env.setCgroup(hostinfo.ReadCgroup(t.local.cmd.Process.Pid))
		r.Env.Source = "this machine (/proc, the server's cgroup)"
		return
	}
	if t.admin == "" {
		r.Env.Source = "this machine, the load machine: give --admin-token to describe the server's (GET /api/v1/server)"
		return
	}
	in, err := t.serverInfo()
	if err != nil {
		r.Env.Source = "this machine, the load machine: the server's GET /api/v1/server failed (" + err.Error() + ")"
		return
	}
	t.info = &in
	load := r.Env
	env := hostEnvironment(in.Host, in.GoVersion, in.DroverVersion)
	env.Label, env.OpenFiles = load.Label, load.OpenFiles
	env.setCgroup(in.Cgroup)
	env.Source = "the server's GET /api/v1/server"
	env.Emulator = fmt.Sprintf("load machine %s (%s, %d cores / %d threads, %.0f MiB), in the drover perf process (GOMAXPROCS %d); the server at %s",
		load.Host, load.CPUModel, load.Cores, load.Threads, load.RAMMiB, runtime.GOMAXPROCS(0), t.url)
	r.Env = env
	r.Setup.Backend, r.Setup.Persistence = in.Backend, in.Persistence
	if in.GOMAXPROCS > 0 {
		r.Notes = appendOnce(r.Notes, fmt.Sprintf("The server runs %d handler threads (GOMAXPROCS).", in.GOMAXPROCS))
	}
}

func appendOnce(list []string, s string) []string {
	for _, v := range list {
		if v == s {
			return list
		}
	}
	return append(list, s)
}

// limitMemory makes a snapshot's machine memory the cgroup's when it has a
// limit: used is what the cgroup uses, available the rest of its limit.
func (s *snapshot) limitMemory(cg hostinfo.Cgroup) {
	if cg.MemoryMax <= 0 || cg.MemoryCurrent <= 0 {
		return
	}
	s.UsedMiB = mib(cg.MemoryCurrent)
	if avail := mib(max(0, cg.MemoryMax-cg.MemoryCurrent)); s.AvailMiB <= 0 || avail < s.AvailMiB {
		s.AvailMiB = avail
	}
}
