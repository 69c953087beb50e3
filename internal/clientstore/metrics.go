package clientstore

import (
	"context"
	"errors"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fabric-mls/fabric/internal/clientstore/outbox"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// metrics are the store's Prometheus collectors (prefix
// fabric_clientstore_). Labels take values from closed sets only: kinds and
// error codes, never a tenant or an id.
type metrics struct {
	events   *prometheus.CounterVec // kind
	refusals *prometheus.CounterVec // code
	epochs   prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fabric_clientstore_events_total",
			Help: "Events the client stores emitted after storing a change, by kind.",
		}, []string{"kind"}),
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fabric_clientstore_refusals_total",
			Help: "Client store requests refused or failed, by error code.",
		}, []string{"code"}),
		epochs: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fabric_clientstore_hmac_epoch_increases_total",
			Help: "HMAC epoch increases this process observed while open (EVENT-026).",
		}),
	}
	if reg != nil {
		m.events = Register(reg, m.events)
		m.refusals = Register(reg, m.refusals)
		m.epochs = Register(reg, m.epochs)
	}
	// The label values known up front exist at zero from the start, so
	// rates and alerts over them work on a fresh process.
	for _, k := range []schema.EventKind{schema.KindIdentityRegistered, schema.KindConsentChanged, schema.KindHmacKeysUpdated,
		schema.KindHandleChanged, schema.KindOwnInstallationAdded, schema.KindOwnInstallationRevoked} {
		m.events.WithLabelValues(string(k))
	}
	ZeroRefusals(m.refusals)
	return m
}

// ZeroRefusals creates the refusal codes every API answers at zero.
func ZeroRefusals(refusals *prometheus.CounterVec) {
	for _, c := range []string{"unauthenticated", "forbidden", "bad_request", "internal"} {
		refusals.WithLabelValues(c)
	}
}

// Register registers c with reg, or returns the collector already
// registered under its name, so two instances in one process share it.
func Register[C prometheus.Collector](reg prometheus.Registerer, c C) C {
	err := reg.Register(c)
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(C); ok {
			return existing
		}
	}
	return c
}

// counting wraps publish to count the events it emits.
func (m *metrics) counting(publish outbox.PublishFunc) outbox.PublishFunc {
	return func(ctx context.Context, ev outbox.Event) error {
		err := publish(ctx, ev)
		if err == nil {
			m.events.WithLabelValues(string(ev.Event.Kind)).Inc()
		}
		return err
	}
}
