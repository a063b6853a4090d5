package server

import (
	"encoding/csv"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/drover/drover/internal/fleet"
)

// CSV export of the devices list and of a device's history: asked with
// ?format=csv or Accept: text/csv; JSON otherwise. Rows are written as they
// are read, a page of devices at a time, so a whole fleet streams in
// constant memory (in ID order a page costs its own devices; another order
// costs a pass over the fleet per page of 1,000).

// streamBody is an apiFunc answer wrap hands the ResponseWriter to.
type streamBody func(w http.ResponseWriter)

// wantCSV tells whether r asks for CSV.
func wantCSV(r *http.Request) (bool, error) {
	switch r.URL.Query().Get("format") {
	case "csv":
		return true, nil
	case "json":
		return false, nil
	case "":
		return strings.Contains(r.Header.Get("Accept"), "text/csv"), nil
	}
	return false, badField("format must be json or csv")
}

func csvHeaders(w http.ResponseWriter, name string) *csv.Writer {
	h := w.Header()
	h.Set("Content-Type", "text/csv; charset=utf-8")
	h.Set("Content-Disposition", `attachment; filename="`+name+`.csv"`)
	w.WriteHeader(http.StatusOK)
	return csv.NewWriter(w)
}

// csvTime is a time as the JSON answers give it (RFC 3339, UTC), or "".
func csvTime(t *time.Time) string {
	if t == nil || t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339Nano)
}

var deviceCSVHeader = []string{"id", "machine_id", "device_type", "model", "firmware", "serial", "registered_at", "last_seen",
	"seq", "sync_state", "liveness", "applied_version", "desired_version", "config_error", "profile_id", "push_interval", "admission"}

// devicesCSV streams every device of q (its Limit is the page size).
func (a *api) devicesCSV(q fleet.Query) streamBody {
	return func(w http.ResponseWriter) {
		cw := csvHeaders(w, "devices")
		cw.Write(deviceCSVHeader)
		rc := http.NewResponseController(w)
		for {
			// The server's write timeout bounds a page, not the whole
			// export: a client that keeps reading gets every device.
			rc.SetWriteDeadline(time.Now().Add(30 * time.Second))
			res, err := a.fleet.Query(q)
			if err != nil {
				a.log.Warn("devices CSV export cut short", "err", err)
				return // the body ends without its last rows; the client sees a short file
			}
			for _, d := range res.Devices {
				reg := d.RegisteredAt
				cw.Write([]string{strconv.FormatUint(d.ID, 10), d.MachineID, d.DeviceType, d.Model, d.Firmware, d.Serial,
					csvTime(&reg), csvTime(d.LastSeen), strconv.FormatUint(d.Seq, 10), d.SyncState, d.Liveness,
					strconv.FormatInt(d.AppliedVersion, 10), strconv.FormatInt(d.DesiredVersion, 10), d.ConfigError,
					strconv.FormatUint(d.ProfileID, 10), strconv.Itoa(d.PushInterval), d.Admission})
			}
			cw.Flush()
			if res.Next == "" || cw.Error() != nil {
				return
			}
			q.After = res.Next
		}
	}
}

var historyCSVHeader = []string{"at", "seq", "uptime", "cpu", "mem_used", "mem_total", "disk_used", "disk_total",
	"temperature", "rx_bytes", "tx_bytes", "rssi", "rsrp", "rsrq", "sinr"}

// historyCSV writes samples, oldest first.
func historyCSV(samples []fleet.Sample) streamBody {
	return func(w http.ResponseWriter) {
		cw := csvHeaders(w, "history")
		cw.Write(historyCSVHeader)
		for _, s := range samples {
			at := s.At
			cw.Write([]string{csvTime(&at), strconv.FormatUint(s.Seq, 10), optInt(s.Uptime), optFloat(s.CPU),
				optInt(s.MemUsed), optInt(s.MemTotal), optInt(s.DiskUsed), optInt(s.DiskTotal), optFloat(s.Temperature),
				optU(s.RxBytes), optU(s.TxBytes), optFloat(s.RSSI), optFloat(s.RSRP), optFloat(s.RSRQ), optFloat(s.SINR)})
		}
		cw.Flush()
	}
}

func optInt(v *int64) string {
	if v == nil {
		return ""
	}
	return strconv.FormatInt(*v, 10)
}

func optU(v *uint64) string {
	if v == nil {
		return ""
	}
	return strconv.FormatUint(*v, 10)
}

func optFloat(v *float64) string {
	if v == nil {
		return ""
	}
	return strconv.FormatFloat(*v, 'g', -1, 64)
}
