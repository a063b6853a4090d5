package server

import (
	"net/http"
	"os"
	"runtime"
	"time"

	"github.com/drover/drover/internal/hostinfo"
	"github.com/drover/drover/internal/store"
)

// serverInfo is GET /api/v1/server: the machine, the limits of the
// server's cgroup, and the process, for operators and `drover perf --url`.
type serverInfo struct {
	hostinfo.Host
	GoVersion     string    `json:"go_version"`
	DroverVersion string    `json:"drover_version"`
	Backend       string    `json:"backend"`     // sqlite, postgres, mariadb; "none" in memory
	Persistence   string    `json:"persistence"` // memory, write-through, write-back
	Cluster       bool      `json:"cluster"`
	GOMAXPROCS    int       `json:"gomaxprocs"` // handler threads
	PID           int       `json:"pid"`
	Started       time.Time `json:"started"`
	RSSBytes      int64     `json:"rss_bytes"`
	CPUSeconds    float64   `json:"cpu_seconds"` // user + system since start
}

// processStart is when this process started, for GET /api/v1/server.
var processStart = time.Now().UTC()

func (a *api) serverInfo(*http.Request) (any, error) {
	in := serverInfo{Host: hostinfo.ReadHost(), GoVersion: runtime.Version(), DroverVersion: Version(),
		Backend: a.backend, Persistence: a.persistence, Cluster: a.cnode != nil,
		GOMAXPROCS: runtime.GOMAXPROCS(0), PID: os.Getpid(), Started: processStart}
	if ps, err := hostinfo.ReadProc(os.Getpid()); err == nil {
		in.RSSBytes, in.CPUSeconds = ps.RSS, ps.CPUSecs
	}
	return in, nil
}

// backendOf names the backend of a persistence mode and DSN.
func backendOf(persistence, dsn string) string {
	if persistence == "memory" {
		return "none"
	}
	b, _, err := store.Parse(dsn)
	if err != nil {
		return "unknown"
	}
	return b
}
