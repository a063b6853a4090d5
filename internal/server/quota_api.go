package server

// Quotas and the profile policy in the operator API (docs/operations.md,
// "Quotas" and "Profile policy"), and their metrics.

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
	return map[string]any{"quotas": a.fleet.QuotaOptions(), "hits": a.fleet.QuotaHits(), "devices": a.fleet.QuotaDevices()}, nil
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
	var in struct {
		Until *time.Time `json:"until"`
		Note  string     `json:"note"`
	}
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
	return map[string]any{"device_id": strconv.FormatUint(id, 10), "restored": true}, nil
}

func (a *api) getProfilePolicy(r *http.Request) (any, error) {
	return a.fleet.ProfilePolicy(), nil
}

func (a *api) putProfilePolicy(r *http.Request) (any, error) {
	p := a.fleet.ProfilePolicy()
	if err := decodeStrict(r, "profile policy: ", &p); err != nil {
		return nil, err
	}
	return a.fleet.SetProfilePolicy(r.Context(), p)
}

func (a *api) pendingFirmware(r *http.Request) (any, error) {
	return map[string]any{"pending": a.fleet.PendingFirmware()}, nil
}

func (a *api) approveFirmware(r *http.Request) (any, error) {
	var in struct {
		DeviceType string `json:"device_type"`
		Firmware   string `json:"firmware"`
		Carry      string `json:"carry"`
	}
	if err := decodeStrict(r, "approval: ", &in); err != nil {
		return nil, err
	}
	p, err := a.fleet.ApproveFirmware(r.Context(), in.DeviceType, in.Firmware, in.Carry)
	if err != nil {
		return nil, err
	}
	return created(p), nil
}

func (a *api) deleteProfile(r *http.Request) (any, error) {
	id, err := pathID(r)
	if err != nil {
		return nil, err
	}
	if err := a.fleet.DeleteProfile(r.Context(), id); err != nil {
		return nil, ifNotFound(err, "profile "+strconv.FormatUint(id, 10))
	}
	return map[string]any{"deleted": strconv.FormatUint(id, 10)}, nil
}

// cleanupProfiles deletes unused profiles: {"min_age": seconds (default
// 3600), "dry_run": bool}.
func (a *api) cleanupProfiles(r *http.Request) (any, error) {
	in := struct {
		MinAge int  `json:"min_age"`
		DryRun bool `json:"dry_run"`
	}{MinAge: 3600}
	if err := decodeStrict(r, "cleanup: ", &in); err != nil {
		return nil, err
	}
	if in.MinAge < 0 {
		return nil, badField("min_age must be seconds, 0 or more")
	}
	return a.fleet.CleanupProfiles(r.Context(), time.Duration(in.MinAge)*time.Second, in.DryRun)
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
