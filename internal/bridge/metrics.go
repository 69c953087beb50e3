package bridge

import (
	"fmt"
	"slices"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fabric-mls/fabric/pkg/schema"
)

// metrics are the bridge's Prometheus collectors (prefix fabric_bridge_).
// Label values come from closed sets: no tenant, group or message id.
type metrics struct {
	messages *prometheus.CounterVec   // status, category: the destination's answer
	refused  *prometheus.CounterVec   // code
	retries  *prometheus.CounterVec   // reason
	requests *prometheus.HistogramVec // status class
	pending  prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		messages: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fabric_bridge_messages_total",
			Help: "Outbound messages the destination answered, by its status (queued, rejected, deferred) and category (duplicate, …).",
		}, []string{"status", "category"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fabric_bridge_refused_total",
			Help: "Outbound messages dropped because the destination refused them with a 4xx, by its error code.",
		}, []string{"code"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fabric_bridge_retries_total",
			Help: "Posts retried after a backoff, by reason: network, unavailable (5xx), rate_limited (429), bad_reply, token.",
		}, []string{"reason"}),
		requests: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "fabric_bridge_request_duration_seconds",
			Help:    "Time of one post to the destination's transport endpoint, by status class (2xx, 4xx, 5xx, error).",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 14),
		}, []string{"status"}),
		pending: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "fabric_bridge_pending_messages",
			Help: "Outbound messages stored on the source and not yet delivered to the bridge's consumer, as of the last acknowledged batch.",
		}),
	}
	// The label values known up front, at zero from the start.
	m.messages.WithLabelValues(string(schema.StatusQueued), "")
	m.messages.WithLabelValues(string(schema.StatusRejected), string(schema.CategoryDuplicate))
	m.messages.WithLabelValues(string(schema.StatusDeferred), string(schema.CategoryTransportDeferred))
	for _, code := range refusalCodes {
		m.refused.WithLabelValues(code)
	}
	for _, reason := range []string{"network", "unavailable", "rate_limited", "bad_reply", "token"} {
		m.retries.WithLabelValues(reason)
	}
	for _, status := range []string{"2xx", "4xx", "5xx", "error"} {
		m.requests.WithLabelValues(status)
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.messages, m.refused, m.retries, m.requests, m.pending} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("bridge: metrics: %w", err)
		}
	}
	return m, nil
}

// refusalCodes are the codes of the transport endpoint's 4xx refusals of a
// message (docs/ingest.md, Limits and errors); another is counted as other.
var refusalCodes = []string{"bad_request", "body_too_large", "batch_too_large", "message_too_large"}

// answered counts one result. Labels come from the destination, so only
// the spec's statuses and categories are kept; anything else is other.
func (m *metrics) answered(r result) {
	status, category := string(r.Status), string(r.Category)
	if !r.Status.Valid() {
		status = "other"
	}
	if r.Category != "" && !r.Category.Valid() {
		category = "other"
	}
	m.messages.WithLabelValues(status, category).Inc()
}

// refusedWith counts a message dropped on a refusal with code.
func (m *metrics) refusedWith(code string) {
	if !slices.Contains(refusalCodes, code) {
		code = "other"
	}
	m.refused.WithLabelValues(code).Inc()
}
