package read

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fabric-mls/fabric/internal/clientstore"
	"github.com/fabric-mls/fabric/internal/quota"
)

// routes name the read API's routes in its metrics.
var routes = []string{"conversations", "conversation", "members", "messages", "message", "consent", "identities"}

// metrics of the read path. No label carries an id.
type metrics struct {
	requests *prometheus.CounterVec
	seconds  *prometheus.HistogramVec
	records  *prometheus.CounterVec
	// quotaRefusals counts requests refused past a tenant's quota.
	quotaRefusals *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fabric_read_requests_total", Help: "Read API requests, by route and answer code (ok or the error code).",
		}, []string{"route", "code"}),
		seconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "fabric_read_request_seconds", Help: "Read API request latency, by route.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
		}, []string{"route"}),
		records: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fabric_read_records_scanned_total", Help: "Stored records the read API read, by route.",
		}, []string{"route"}),
		quotaRefusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fabric_read_quota_refusals_total", Help: "Read API requests refused past a tenant's quota, by code (rate_limited, byte_rate_limited, reads_in_flight).",
		}, []string{"code"}),
	}
	for _, c := range []string{quota.ErrRateLimited.Code, quota.ErrByteRateLimited.Code, codeReadsInFlight} {
		m.quotaRefusals.WithLabelValues(c)
	}
	for _, r := range routes {
		m.requests.WithLabelValues(r, "ok")
		m.requests.WithLabelValues(r, "internal")
		m.seconds.WithLabelValues(r)
	}
	for _, r := range []string{"conversations", "messages"} {
		m.records.WithLabelValues(r)
	}
	if reg != nil {
		m.requests = clientstore.Register(reg, m.requests)
		m.seconds = clientstore.Register(reg, m.seconds)
		m.records = clientstore.Register(reg, m.records)
		m.quotaRefusals = clientstore.Register(reg, m.quotaRefusals)
	}
	return m
}
