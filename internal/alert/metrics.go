package alert

import "github.com/prometheus/client_golang/prometheus"

var (
	activeDesc = prometheus.NewDesc("drover_alerts_active", "Alerts raised and not cleared, by rule.", []string{"rule"}, nil)
	eventsDesc = prometheus.NewDesc("drover_alert_events_total", "Alert events since start, by rule and state (raised, cleared).",
		[]string{"rule", "state"}, nil)
	notifyDesc = prometheus.NewDesc("drover_alert_notifications_total",
		"Notification attempts by channel (webhook, email) and outcome (delivered, failed, retried, dropped).", []string{"channel", "outcome"}, nil)
	queuedDesc = prometheus.NewDesc("drover_alert_notifications_queued", "Alert events waiting to be notified.", nil, nil)
	storeDesc  = prometheus.NewDesc("drover_alert_store_up", "1 when the last write of alert events succeeded.", nil, nil)
)

// Collector exposes the engine's metrics, computed when scraped.
func (e *Engine) Collector() prometheus.Collector { return collector{e} }

type collector struct{ e *Engine }

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{activeDesc, eventsDesc, notifyDesc, queuedDesc, storeDesc} {
		ch <- d
	}
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	for _, r := range *c.e.rules.Load() {
		ch <- prometheus.MustNewConstMetric(activeDesc, prometheus.GaugeValue, float64(r.stats.active.Load()), r.Name)
		ch <- prometheus.MustNewConstMetric(eventsDesc, prometheus.CounterValue, float64(r.stats.raised.Load()), r.Name, Raised)
		ch <- prometheus.MustNewConstMetric(eventsDesc, prometheus.CounterValue, float64(r.stats.cleared.Load()), r.Name, Cleared)
	}
	counts := c.e.NotificationCounts()
	for _, chn := range []string{"webhook", "email"} {
		for _, o := range []string{"delivered", "failed", "retried", "dropped"} {
			ch <- prometheus.MustNewConstMetric(notifyDesc, prometheus.CounterValue, float64(counts[[2]string{chn, o}]), chn, o)
		}
	}
	queued, _ := c.e.Queued()
	n := 0
	for _, q := range queued {
		n += q
	}
	ch <- prometheus.MustNewConstMetric(queuedDesc, prometheus.GaugeValue, float64(n))
	up := 0.0
	if c.e.StoreOK() {
		up = 1
	}
	ch <- prometheus.MustNewConstMetric(storeDesc, prometheus.GaugeValue, up)
}
