package server

import (
	"net/http"
	"strconv"
	"time"

	"github.com/drover/drover/internal/buildinfo"
	"github.com/drover/drover/internal/fleet"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Outcomes counted by drover_registrations_total and drover_pushes_total.
const (
	outNew         = "new"
	outRenewed     = "renewed"
	outAccepted    = "accepted"
	outForbidden   = "forbidden"
	outUnauth      = "unauthorized"
	outInvalid     = "invalid"
	outOverloaded  = "overloaded"
	outUnavailable = "unavailable"
	outQuota       = "quota" // refused with 429: over the device's push quota
)

type metrics struct {
	reg *prometheus.Registry

	registrations *prometheus.CounterVec
	pushes        *prometheus.CounterVec
	badRequests   *prometheus.CounterVec
	duration      *prometheus.HistogramVec
	inflight      prometheus.Gauge
	connections   prometheus.Gauge // persistent device connections
	// connectionsEnded counts ended persistent connections by reason
	// (connect.go's endReasons).
	connectionsEnded *prometheus.CounterVec
	// The accept gate's waits (transport.Gate).
	acceptHeld, acceptHeldTime prometheus.Counter
	commitSize                 prometheus.Histogram
	commitTime                 prometheus.Histogram
	commitErrors               prometheus.Counter
	storeUp                    prometheus.Gauge
	// The store's background work (Server.observeUpkeep), by work.
	upkeepTime   *prometheus.HistogramVec
	upkeepItems  *prometheus.CounterVec
	upkeepErrors *prometheus.CounterVec
	quotaAnswers *prometheus.CounterVec
	// firmwareDownloads counts firmware file requests (a resumed
	// download is one more).
	firmwareDownloads prometheus.Counter
	auditFailures     prometheus.Counter // audit log writes that failed

	pushAccepted, regNew, regRenewed, regPending prometheus.Counter
	pushDuration, regDuration                    prometheus.Observer
}

func newMetrics() *metrics {
	m := &metrics{reg: prometheus.NewRegistry()}
	m.registrations = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "drover_registrations_total", Help: "Registration requests by outcome.",
	}, []string{"outcome"})
	m.pushes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "drover_pushes_total", Help: "Push requests by outcome.",
	}, []string{"outcome"})
	m.badRequests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "drover_request_errors_total", Help: "Requests answered with an error, by endpoint, HTTP status and error code.",
	}, []string{"endpoint", "status", "code"})
	m.duration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "drover_request_duration_seconds", Help: "Time to answer a request, by endpoint.",
		Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
	}, []string{"endpoint"})
	m.inflight = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "drover_inflight_requests", Help: "Device requests being handled.",
	})
	m.connections = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "drover_device_connections", Help: "Devices holding a persistent connection.",
	})
	m.connectionsEnded = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "drover_device_connections_ended_total", Help: "Persistent device connections ended, by reason: closed (by the device, or its connection failed), unanswered (no pong to the server's ping), replaced (by a newer connection of the device), protocol (a frame the server refuses), write_failed, stopping (server shutdown).",
	}, []string{"reason"})
	m.acceptHeld = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "drover_accept_held_total", Help: "Times the listeners stopped accepting because --max-busy-connections were busy.",
	})
	m.acceptHeldTime = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "drover_accept_held_seconds_total", Help: "Time the listeners did not accept because --max-busy-connections were busy.",
	})
	m.commitSize = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "drover_store_commit_records", Help: "Records per store commit (grouped commits).",
		Buckets: prometheus.ExponentialBuckets(1, 2, 16),
	})
	m.commitTime = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "drover_store_commit_duration_seconds", Help: "Time of one store commit, fsync included.",
		Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
	})
	m.commitErrors = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "drover_store_commit_errors_total", Help: "Store commits that failed.",
	})
	m.storeUp = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "drover_store_up", Help: "1 when the last store commit succeeded.",
	})
	m.storeUp.Set(1)
	m.upkeepTime = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "drover_store_upkeep_duration_seconds", Help: "Time of one step of the store's background work, by work (SQLite: checkpoint, wal_restart, state_log_merge, state_log_unlist, state_log_drop, history_stage, history_archive, history_drop; PostgreSQL: history_pack, history_index, history_swap).",
		Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
	}, []string{"work"})
	m.upkeepItems = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "drover_store_upkeep_items_total", Help: "What the store's background work moved, by work: WAL frames checkpointed, devices merged, rows archived or deleted.",
	}, []string{"work"})
	m.upkeepErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "drover_store_upkeep_errors_total", Help: "Steps of the store's background work that failed (retried later), by work.",
	}, []string{"work"})
	m.quotaAnswers = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "drover_push_quota_answers_total", Help: "Pushes refused with 429 for their quota, by answer: at_once, held (tarpit, until Retry-After), closed (the connection).",
	}, []string{"answer"})
	m.firmwareDownloads = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "drover_firmware_file_requests_total", Help: "Firmware file requests served (ranges and resumptions count each).",
	})
	m.auditFailures = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "drover_audit_write_errors_total", Help: "Changes made whose audit log row could not be written.",
	})
	bi := buildinfo.Read()
	buildInfo := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "drover_build_info", Help: "Always 1; the labels name the running build.",
		ConstLabels: prometheus.Labels{"version": bi.Version, "commit": bi.Commit, "goversion": bi.GoVersion},
	})
	buildInfo.Set(1)
	m.reg.MustRegister(buildInfo, m.registrations, m.pushes, m.badRequests, m.duration, m.inflight, m.connections, m.connectionsEnded,
		m.commitSize, m.commitTime, m.commitErrors, m.storeUp, m.upkeepTime, m.upkeepItems, m.upkeepErrors, m.quotaAnswers, m.firmwareDownloads, m.auditFailures,
		m.acceptHeld, m.acceptHeldTime,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	for _, o := range []string{outAccepted, outUnauth, outInvalid, outOverloaded, outUnavailable, outQuota} {
		m.pushes.WithLabelValues(o)
	}
	for _, r := range endReasons {
		m.connectionsEnded.WithLabelValues(r)
	}
	for _, o := range []string{outNew, outRenewed, outForbidden, outInvalid, outOverloaded, outUnavailable, outPending, outRateLimited, outRefused} {
		m.registrations.WithLabelValues(o)
	}
	m.pushAccepted = m.pushes.WithLabelValues(outAccepted)
	m.regNew, m.regRenewed = m.registrations.WithLabelValues(outNew), m.registrations.WithLabelValues(outRenewed)
	m.regPending = m.registrations.WithLabelValues(outPending)
	m.pushDuration, m.regDuration = m.duration.WithLabelValues("push"), m.duration.WithLabelValues("register")
	return m
}

// handler serves the registry in the Prometheus text format.
func (m *metrics) handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}

// watchFleet exports the fleet's device and profile counts.
func (m *metrics) watchFleet(f *fleet.Service) {
	m.reg.MustRegister(&fleetCollector{fleet: f}, &admissionCollector{fleet: f}, &quotaCollector{fleet: f}, &rolloutCollector{fleet: f})
}

func (m *metrics) observeCommit(records int, took time.Duration, err error) {
	m.commitSize.Observe(float64(records))
	m.commitTime.Observe(took.Seconds())
	if err != nil {
		m.commitErrors.Inc()
		m.storeUp.Set(0)
	} else {
		m.storeUp.Set(1)
	}
}

func (m *metrics) observeUpkeep(work string, items int64, took time.Duration, err error) {
	m.upkeepTime.WithLabelValues(work).Observe(took.Seconds())
	if items > 0 { // a counter panics on a negative Add
		m.upkeepItems.WithLabelValues(work).Add(float64(items))
	}
	if err != nil {
		m.upkeepErrors.WithLabelValues(work).Inc()
	}
}

// fleetCollector reports device counts, computed when scraped.
type fleetCollector struct{ fleet *fleet.Service }

var (
	devicesDesc  = prometheus.NewDesc("drover_devices", "Registered devices by sync state.", []string{"sync_state"}, nil)
	livenessDesc = prometheus.NewDesc("drover_devices_liveness", "Registered devices by liveness.", []string{"liveness"}, nil)
	profilesDesc = prometheus.NewDesc("drover_profiles", "Configuration profiles.", nil, nil)
)

func (c *fleetCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- devicesDesc
	ch <- livenessDesc
	ch <- profilesDesc
}

func (c *fleetCollector) Collect(ch chan<- prometheus.Metric) {
	f := c.fleet
	syncs, lives, _ := f.Counts()
	for _, s := range fleet.AllSyncStates() {
		ch <- prometheus.MustNewConstMetric(devicesDesc, prometheus.GaugeValue, float64(syncs[s]), s.String())
	}
	for _, l := range fleet.AllLiveness() {
		ch <- prometheus.MustNewConstMetric(livenessDesc, prometheus.GaugeValue, float64(lives[l]), l.String())
	}
	ch <- prometheus.MustNewConstMetric(profilesDesc, prometheus.GaugeValue, float64(len(f.Profiles())))
}

// rolloutCollector reports the devices of unfinished rollouts by state.
type rolloutCollector struct{ fleet *fleet.Service }

var rolloutDesc = prometheus.NewDesc("drover_rollout_devices", "Devices of unfinished rollouts by rollout and state.", []string{"rollout", "state"}, nil)

func (c *rolloutCollector) Describe(ch chan<- *prometheus.Desc) { ch <- rolloutDesc }

func (c *rolloutCollector) Collect(ch chan<- prometheus.Metric) {
	for _, r := range c.fleet.Rollouts() {
		if r.State == fleet.RolloutDone || r.State == fleet.RolloutAborted {
			continue
		}
		for st, n := range r.Counts {
			ch <- prometheus.MustNewConstMetric(rolloutDesc, prometheus.GaugeValue, float64(n), strconv.FormatUint(r.ID, 10), st)
		}
	}
}
