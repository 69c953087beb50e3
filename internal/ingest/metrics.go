package ingest

import (
	"context"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fabric-mls/fabric/internal/bus/subject"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// metrics are the role's Prometheus collectors (prefix fabric_ingest_).
// Labels take values from closed sets only: no tenant, group or message id
// ever becomes a label (DESIGN §4, privacy).
type metrics struct {
	inputs   *prometheus.CounterVec   // transport, class, status, category
	bytes    *prometheus.CounterVec   // transport
	requests *prometheus.HistogramVec // transport
	stage    *prometheus.HistogramVec // stage
	refusals *prometheus.CounterVec   // code
	retained *prometheus.CounterVec   // reason
	released *prometheus.CounterVec   // reason
	retries  *prometheus.CounterVec   // reason
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		inputs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fabric_ingest_inputs_total",
			Help: "Transport messages processed, by intake transport, input class, status and category.",
		}, []string{"transport", "class", "status", "category"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fabric_ingest_bytes_total",
			Help: "Transport payload bytes received, by intake transport.",
		}, []string{"transport"}),
		requests: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "fabric_ingest_request_duration_seconds",
			Help:    "Time to answer one intake request, by intake transport.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
		}, []string{"transport"}),
		stage: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "fabric_ingest_stage_duration_seconds",
			Help:    "Time one request spends in a pipeline stage: peel, dedup, outcome, publish.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16),
		}, []string{"stage"}),
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fabric_ingest_refusals_total",
			Help: "Intake requests refused as a whole, by error code.",
		}, []string{"code"}),
		retained: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fabric_ingest_retained_total",
			Help: "Objects retained on FABRIC_RETAINED, by reason.",
		}, []string{"reason"}),
		released: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fabric_ingest_released_total",
			Help: "Retained objects that entered convergence or were settled, by reason.",
		}, []string{"reason"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fabric_ingest_retained_retries_total",
			Help: "Retries of retained objects after a key set change or a join, by reason.",
		}, []string{"reason"}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.inputs, m.bytes, m.requests, m.stage, m.refusals, m.retained, m.released, m.retries} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	m.zero()
	return m, nil
}

// zero creates the label combinations known up front at zero, so rates and
// alerts over them work on a fresh process.
func (m *metrics) zero() {
	for _, t := range []string{"http", "nats"} {
		m.bytes.WithLabelValues(t)
		m.requests.WithLabelValues(t)
		for _, c := range []schema.InputClass{schema.ClassWelcome, schema.ClassCommit, schema.ClassProposal, schema.ClassApplication} {
			m.inputs.WithLabelValues(t, string(c), string(schema.StatusQueued), "")
		}
		m.inputs.WithLabelValues(t, string(schema.ClassSealed), string(schema.StatusDeferred), string(schema.CategoryTransportDeferred))
		m.inputs.WithLabelValues(t, string(schema.ClassMalformed), string(schema.StatusRejected), string(schema.CategoryInvalidEncoding))
	}
	for _, st := range []string{"peel", "dedup", "outcome", "publish"} {
		m.stage.WithLabelValues(st)
	}
	for _, c := range []string{"unauthenticated", "forbidden", "bad_request", "resource_refused"} {
		m.refusals.WithLabelValues(c)
	}
	for _, r := range []string{reasonDeferred, reasonUnknown} {
		m.retained.WithLabelValues(r)
		m.released.WithLabelValues(r)
		m.retries.WithLabelValues(r)
	}
}

// retainedDesc describes the retained-objects gauge: what FABRIC_RETAINED
// holds, for every tenant, read from the stream when scraped.
var retainedDesc = prometheus.NewDesc("fabric_ingest_retained_objects",
	"Objects retained on FABRIC_RETAINED (all tenants), by reason, read at scrape time.",
	[]string{"reason"}, nil)

// retainedCollector reads the retained-object counts from the stream.
type retainedCollector struct{ s *Service }

func (c retainedCollector) Describe(ch chan<- *prometheus.Desc) { ch <- retainedDesc }

func (c retainedCollector) Collect(ch chan<- prometheus.Metric) {
	if !c.s.started.Load() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	for _, reason := range []string{reasonDeferred, reasonUnknown} {
		filter, err := subject.RetainedReason(reason)
		if err != nil {
			continue
		}
		info, err := c.s.retainedStream.Info(ctx, jetstream.WithSubjectFilter(filter))
		if err != nil {
			continue
		}
		var n uint64
		for _, k := range info.State.Subjects {
			n += k
		}
		ch <- prometheus.MustNewConstMetric(retainedDesc, prometheus.GaugeValue, float64(n), reason)
	}
}
