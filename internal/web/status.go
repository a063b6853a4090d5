package web

import (
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/drover/drover/internal/fleet"
)

// Status is the fleet's status light with its reasons.
type Status struct {
	Level   string    `json:"level"` // green, yellow or red
	Reasons []string  `json:"reasons"`
	Devices int       `json:"devices"`
	Sync    [4]int    `json:"-"` // by fleet.SyncState
	Live    [4]int    `json:"-"` // by fleet.Liveness
	Alerts  int       `json:"alerts"`
	At      time.Time `json:"-"` // when the counts were taken
}

// countsTTL bounds how often the device counts are computed: counting a
// million devices takes about 50 ms.
const countsTTL = 2 * time.Second

// status computes the light; device counts may be up to countsTTL old.
func (h *Handler) status() Status {
	now := h.now()
	h.mu.Lock()
	cached := h.cachedStatus
	h.mu.Unlock()
	st := Status{At: cached.At, Level: "green", Sync: cached.Sync, Live: cached.Live, Devices: cached.Devices}
	if cached.At.IsZero() || now.Sub(cached.At) >= countsTTL || now.Before(cached.At) {
		st.Sync, st.Live, st.Devices = h.fleet.Counts()
		st.At = now
		h.mu.Lock()
		h.cachedStatus = st
		h.mu.Unlock()
	}
	if h.eng != nil {
		st.Alerts = h.eng.ActiveCount()
	}
	var red, yellow []string
	if err := h.opts.Ready(); err != nil {
		red = append(red, "Service problem: "+err.Error())
	}
	if why := h.opts.Overloaded(); why != "" {
		red = append(red, "Overloaded: "+why)
	}
	if h.eng != nil && !h.eng.StoreOK() {
		red = append(red, "Alert events cannot be stored (see the server log)")
	}
	plural := func(n int, one, many string) string {
		if n == 1 {
			return "1 " + one
		}
		return fmt.Sprintf("%s %s", thousands(n), many)
	}
	if n := st.Alerts; n > 0 {
		yellow = append(yellow, plural(n, "alert raised", "alerts raised"))
	}
	if n := st.Sync[fleet.SyncPending]; n > 0 {
		yellow = append(yellow, plural(n, "device sync pending", "devices sync pending"))
	}
	if n := st.Sync[fleet.SyncError]; n > 0 {
		yellow = append(yellow, plural(n, "device failed to apply its configuration", "devices failed to apply their configuration"))
	}
	if n := st.Live[fleet.Offline]; n > 0 {
		yellow = append(yellow, plural(n, "device offline", "devices offline"))
	}
	if n := st.Live[fleet.Late]; n > 0 {
		yellow = append(yellow, plural(n, "device late", "devices late"))
	}
	switch {
	case len(red) > 0:
		st.Level, st.Reasons = "red", append(red, yellow...)
	case len(yellow) > 0:
		st.Level, st.Reasons = "yellow", yellow
	case st.Devices == 0:
		st.Reasons = []string{"No devices registered yet; the service is working"}
	default:
		msg := fmt.Sprintf("All %s devices synchronized and on time; no alerts", thousands(st.Devices))
		if n := st.Sync[fleet.Arriving]; n > 0 {
			msg = fmt.Sprintf("No problems: %s devices synchronized and on time, %s registered and not pushed yet; no alerts",
				thousands(st.Devices-n), thousands(n))
		}
		st.Reasons = []string{msg}
	}
	return st
}

// statusJSON feeds the overview's periodic refresh.
func (h *Handler) statusJSON(w http.ResponseWriter, r *http.Request, s *session) {
	st := h.status()
	out := map[string]any{
		"level": st.Level, "reasons": st.Reasons, "devices": st.Devices, "alerts": st.Alerts,
		"sync": map[string]int{}, "liveness": map[string]int{},
	}
	for _, v := range fleet.AllSyncStates() {
		out["sync"].(map[string]int)[v.String()] = st.Sync[v]
	}
	for _, v := range fleet.AllLiveness() {
		out["liveness"].(map[string]int)[v.String()] = st.Live[v]
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(out)
}
