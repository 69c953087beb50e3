package fanout

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fabric-mls/fabric/pkg/wire"
)

// metrics are the gateway's Prometheus metrics. Labels are bounded: no
// tenant, client or group ever becomes a label.
type metrics struct {
	connections   *prometheus.GaugeVec
	subscriptions prometheus.Gauge
	taps          prometheus.Gauge
	queueDepth    prometheus.Histogram
	received      prometheus.Counter
	handedOff     prometheus.Counter
	discarded     prometheus.Counter
	lagged        prometheus.Counter
	latency       prometheus.Histogram
	gaps          prometheus.Counter
	repaired      prometheus.Counter
	replayed      prometheus.Counter
	unrepaired    prometheus.Counter
	undecodable   prometheus.Counter
	protocolErrs  *prometheus.CounterVec
	refusals      *prometheus.CounterVec
	// connectionTokens counts minted connection tokens.
	connectionTokens prometheus.Counter
	// connectRefusals counts WebSockets refused at their connect frame.
	connectRefusals *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		connections: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "fabric_fanout_connections",
			Help: "Open event connections, by transport.",
		}, []string{"transport"}),
		subscriptions: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "fabric_fanout_subscriptions",
			Help: "Live subscriptions.",
		}),
		taps: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "fabric_fanout_taps",
			Help: "Core NATS subscriptions on republished client event subjects.",
		}),
		queueDepth: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "fabric_fanout_queue_depth",
			Help:    "Events held for a subscription (queued plus uncredited) when an event is offered to it.",
			Buckets: []float64{0, 1, 4, 16, 64, 256, 512, 1023, 1024},
		}),
		received: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fabric_fanout_events_received_total",
			Help: "Events the taps received or repaired.",
		}),
		handedOff: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fabric_fanout_events_sent_total",
			Help: "Event frames written to apps, lagged included.",
		}),
		discarded: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fabric_fanout_discarded_events_total",
			Help: "Events discarded because a subscription's queue was full (EVENT-030).",
		}),
		lagged: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fabric_fanout_lagged_events_total",
			Help: "Lagged events handed off (EVENT-031).",
		}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "fabric_fanout_handoff_latency_seconds",
			Help:    "Time from an event's storage in the stream to its frame being written.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2.5, 14),
		}),
		gaps: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fabric_fanout_gaps_total",
			Help: "Gaps in a tap's republished sequence.",
		}),
		repaired: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fabric_fanout_gap_repairs_total",
			Help: "Events fetched from the stream to repair gaps.",
		}),
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fabric_fanout_quota_refusals_total",
			Help: "Connections and resuming subscriptions refused by a tenant's quota, by error code.",
		}, []string{"code"}),
		replayed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fabric_fanout_replayed_events_total",
			Help: "Events replayed from the stream to resume a subscription after a reconnect.",
		}),
		unrepaired: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fabric_fanout_gap_unrepaired_total",
			Help: "Gaps that could not be repaired completely and were reported as discards.",
		}),
		undecodable: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fabric_fanout_undecodable_events_total",
			Help: "Event messages that did not decode and were skipped.",
		}),
		protocolErrs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fabric_fanout_protocol_errors_total",
			Help: "Error frames sent to apps, by code.",
		}, []string{"code"}),
		connectionTokens: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fabric_fanout_connection_tokens_total",
			Help: "Connection tokens minted for backends to hand to their pages.",
		}),
	}
	m.connectRefusals = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fabric_fanout_connect_refusals_total",
		Help: "WebSockets opened without an Authorization header and closed at their connect frame, by code.",
	}, []string{"code"})
	for _, c := range []prometheus.Collector{m.connectionTokens, m.connectRefusals, m.connections, m.subscriptions, m.taps, m.queueDepth, m.received,
		m.handedOff, m.discarded, m.lagged, m.latency, m.gaps, m.repaired, m.replayed, m.unrepaired, m.undecodable, m.protocolErrs, m.refusals} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	// Every label value known up front exists at zero from the start, so
	// rates and alerts work on a fresh gateway.
	for _, t := range []string{transportWebSocket, transportSSE} {
		m.connections.WithLabelValues(t)
	}
	for _, c := range wire.Codes {
		m.protocolErrs.WithLabelValues(c)
	}
	for _, c := range wire.CloseCodes {
		m.connectRefusals.WithLabelValues(c)
	}
	for _, c := range []string{CodeTooManyConnections, CodeReplayBudget} {
		m.refusals.WithLabelValues(c)
	}
	return m, nil
}
