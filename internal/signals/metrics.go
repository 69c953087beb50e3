package signals

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fabric-mls/fabric/internal/clientstore"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// Results of an accepted signal, the values of the result label.
const (
	resultEmitted   = "emitted"   // it emitted its event(s)
	resultUnchanged = "unchanged" // a state the client already had: nothing emitted
	resultReplayed  = "replayed"  // a repeated idempotency key
)

// metrics are the service's Prometheus collectors (prefix fabric_signals_).
// Labels take values from closed sets: kinds, results, error codes.
type metrics struct {
	accepted *prometheus.CounterVec // kind, result
	refusals *prometheus.CounterVec // code
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		accepted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fabric_signals_accepted_total",
			Help: "Signals accepted, by kind and result: emitted, unchanged or replayed.",
		}, []string{"kind", "result"}),
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fabric_signals_refusals_total",
			Help: "Signal requests refused or failed, by error code.",
		}, []string{"code"}),
	}
	if reg != nil {
		m.accepted = clientstore.Register(reg, m.accepted)
		m.refusals = clientstore.Register(reg, m.refusals)
	}
	// The label values known up front exist at zero from the start, so
	// rates and alerts over them work on a fresh process.
	for _, k := range acceptedKinds() {
		for _, r := range []string{resultEmitted, resultUnchanged, resultReplayed} {
			m.accepted.WithLabelValues(string(k), r)
		}
	}
	clientstore.ZeroRefusals(m.refusals)
	return m
}

// acceptedKinds are the kinds the accepted metric counts: every signal
// kind, and connection.state_changed, which the service computes from the
// stream states the runtime reports (EVENT-027).
func acceptedKinds() []schema.EventKind {
	ks := []schema.EventKind{schema.KindConnectionStateChanged}
	for k := range signalKinds {
		ks = append(ks, k)
	}
	return ks
}
