package server

// Quotas in the operator API (docs/operations.md, "Quotas"): the quotas
// in force, one device's, lifting and restoring it, and their metrics.

import (
	"net/http"
	"strconv"
	"time"

	"github.com/drover/drover/internal/fleet"
	"github.com/prometheus/client_golang/prometheus"
)

// quotas are the configured per-device quotas.
func (c *Config) quotas() fleet.QuotaOptions {
	return fleet.QuotaOptions{
		PushRate: c.QuotaPushRate, PushBurst: c.QuotaPushBurst,
		HistorySamples: c.QuotaHistorySamples, HistoryBytes: c.QuotaHistoryBytes, HistoryRetention: c.HistoryRetention,
	}
}

// quotaError is the 429 of a push over quota: Retry-After in whole seconds,
// rounded up, so that a device coming back then is accepted. Not spread:
// each device's wait is its own.
func quotaError(err error) *apiError {
	secs := 1
	if qe, ok := err.(*fleet.QuotaError); ok {
		secs = quotaSeconds(qe.RetryAfter)
	}
	return &apiError{status: http.StatusTooManyRequests, code: "quota_exceeded",
		msg: quotaMessage(secs), outcome: outQuota, retryAfter: secs}
}

// quotaSeconds is a quota wait in whole seconds, rounded up, at least 1.
func quotaSeconds(wait time.Duration) int {
	return int((max(wait, time.Second) + time.Second - 1) / time.Second)
}

func quotaMessage(secs int) string {
	return "this device pushes more often than its profile allows; push again in " + strconv.Itoa(secs) + " s"
}

func (a *api) listQuotas(r *http.Request) (any, error) {
	return quotaList{a.fleet.QuotaOptions(), a.fleet.QuotaHits(), a.fleet.QuotaDevices()}, nil
}

func (a *api) getDeviceQuota(r *http.Request) (any, error) {
	id, err := pathID(r)
	if err != nil {
		return nil, err
	}
	if h, ok := a.fleet.QuotaOf(id); ok {
		return h, nil
	}
	if _, err := a.fleet.Device(r.Context(), id); err != nil {
		return nil, ifNotFound(err, "device "+strconv.FormatUint(id, 10))
	}
	return fleet.QuotaHit{DeviceID: id, Counts: map[string]uint64{}}, nil
}

// liftQuota lifts a device's quotas: {"until": RFC 3339 (optional), "note": "…"}.
func (a *api) liftQuota(r *http.Request) (any, error) {
	id, err := pathID(r)
	if err != nil {
		return nil, err
	}
	var in quotaLiftBody
	if err := decodeStrict(r, "quota lift: ", &in); err != nil {
		return nil, err
	}
	if err := fleet.CheckLiftNote(in.Note); err != nil {
		return nil, err
	}
	var until time.Time
	if in.Until != nil {
		until = *in.Until
		if !until.After(time.Now()) {
			return nil, badField("until must be in the future")
		}
	}
	l, err := a.fleet.LiftQuota(r.Context(), id, until, in.Note)
	return l, ifNotFound(err, "device "+strconv.FormatUint(id, 10))
}

func (a *api) restoreQuota(r *http.Request) (any, error) {
	id, err := pathID(r)
	if err != nil {
		return nil, err
	}
	if err := a.fleet.RestoreQuota(r.Context(), id); err != nil {
		return nil, ifNotFound(err, "lifted or hit quota of device "+strconv.FormatUint(id, 10))
	}
	return quotaRestored{strconv.FormatUint(id, 10), true}, nil
}

// quotaCollector exports quota hits, computed when scraped.
type quotaCollector struct{ fleet *fleet.Service }

var (
	quotaHitsDesc = prometheus.NewDesc("drover_quota_hits_total",
		"Quota hits by reason: push_rate (push refused with 429), history (sample not kept: too many per interval), profile_create (new firmware linked: creations used up).", []string{"reason"}, nil)
	quotaDevicesDesc = prometheus.NewDesc("drover_quota_devices", "Devices listed as having hit a quota (at most 10,000), and devices with lifted quotas.", []string{"kind"}, nil)
	thinnedDesc      = prometheus.NewDesc("drover_history_samples_dropped_total", "History samples not kept, by the bound that dropped them: interval (samples per push interval) or bytes (bytes per device).", []string{"bound"}, nil)
	pendingDesc      = prometheus.NewDesc("drover_firmware_pending", "Firmware linked to another firmware's profile, waiting for an operator's approval.", nil, nil)
)

func (c *quotaCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- quotaHitsDesc
	ch <- quotaDevicesDesc
	ch <- thinnedDesc
	ch <- pendingDesc
}

func (c *quotaCollector) Collect(ch chan<- prometheus.Metric) {
	f := c.fleet
	for reason, n := range f.QuotaHits() {
		ch <- prometheus.MustNewConstMetric(quotaHitsDesc, prometheus.CounterValue, float64(n), reason)
	}
	hit, lifted := 0, 0
	for _, d := range f.QuotaDevices() {
		if len(d.Counts) > 0 {
			hit++
		}
		if d.Lifted {
			lifted++
		}
	}
	ch <- prometheus.MustNewConstMetric(quotaDevicesDesc, prometheus.GaugeValue, float64(hit), "hit")
	ch <- prometheus.MustNewConstMetric(quotaDevicesDesc, prometheus.GaugeValue, float64(lifted), "lifted")
	per, bytes := f.HistoryThinned()
	ch <- prometheus.MustNewConstMetric(thinnedDesc, prometheus.CounterValue, float64(per), "interval")
	ch <- prometheus.MustNewConstMetric(thinnedDesc, prometheus.CounterValue, float64(bytes), "bytes")
	ch <- prometheus.MustNewConstMetric(pendingDesc, prometheus.GaugeValue, float64(len(f.PendingFirmware())))
}
