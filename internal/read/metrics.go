package read

import "github.com/prometheus/client_golang/prometheus"

// metrics of the read path. No label carries an id.
type metrics struct {
	requests *prometheus.CounterVec
	seconds  *prometheus.HistogramVec
	records  *prometheus.CounterVec
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
	}
	if reg != nil {
		m.requests = register(reg, m.requests)
		m.seconds = register(reg, m.seconds)
		m.records = register(reg, m.records)
	}
	return m
}

// register registers c, or returns the collector already registered under
// its name (several instances in one process share them).
func register[C prometheus.Collector](reg prometheus.Registerer, c C) C {
	if err := reg.Register(c); err != nil {
		if are, ok := err.(prometheus.AlreadyRegisteredError); ok {
			if existing, ok := are.ExistingCollector.(C); ok {
				return existing
			}
		}
	}
	return c
}
