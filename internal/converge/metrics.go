package converge

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fabric-mls/fabric/pkg/schema"
)

// Metrics are converge's Prometheus metrics (prefix fabric_converge_). No
// label carries a tenant, group, client or message id.
type Metrics struct {
	// Inputs counts decided inputs by disposition.
	Inputs *prometheus.CounterVec
	// Latency is the processing time of an input's transaction.
	Latency prometheus.Histogram
	// Owned is the number of partitions the worker owns.
	Owned prometheus.Gauge
	// Lag is the consumers' num pending over owned partitions.
	Lag prometheus.Gauge
	// Events counts committed events by kind.
	Events *prometheus.CounterVec
	// Fenced counts commits the checkpoint fence refused.
	Fenced prometheus.Counter
	// Expirations counts cleanup passes that deleted messages.
	Expirations prometheus.Counter
	// Batches counts committed atomic batches by how many groups they
	// hold ("1" or "many").
	Batches *prometheus.CounterVec
	// Retries counts inputs that failed for an infrastructure reason and
	// are retried, in order, after a backoff.
	Retries prometheus.Counter
	// Stalled is the number of owned partitions whose next input has
	// failed and not yet succeeded: none of their groups advances.
	Stalled prometheus.Gauge
	// LostDeliveries counts gaps in a partition consumer's deliveries: a
	// message the server sent that never reached the worker.
	LostDeliveries prometheus.Counter
	// Resident is the number of groups whose hosted members are in
	// memory; one idle for Config.IdleAfter is dropped.
	Resident prometheus.Gauge
	// FailedInputs counts inputs failed terminally instead of being
	// retried without end, by reason: panic (applying it panicked),
	// unpublishable (what it makes is larger than the server takes) or
	// duplicate (its events were stored by another write).
	FailedInputs *prometheus.CounterVec
	// MemoryReleases counts the times the memory of dropped idle groups
	// was returned to the system (at most once per Config.IdleAfter).
	MemoryReleases prometheus.Counter
}

// NewMetrics creates the metrics and registers them with reg (when not nil).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Inputs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fabric_converge_inputs_total",
			Help: "Inputs decided, by disposition (accepted, deferred, stale, rejected).",
		}, []string{"disposition"}),
		Latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "fabric_converge_processing_seconds",
			Help:    "Time to process one input: load, MLS for every hosted member, state writes and the fenced commit.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}),
		Owned: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "fabric_converge_owned_partitions",
			Help: "Input partitions this worker owns.",
		}),
		Lag: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "fabric_converge_consumer_pending_messages",
			Help: "Inputs not yet delivered on the partitions this worker owns (consumer num pending).",
		}),
		Events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fabric_converge_events_total",
			Help: "Client events committed, by kind.",
		}, []string{"kind"}),
		FailedInputs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fabric_converge_failed_inputs_total",
			Help: "Inputs failed terminally (operation failed, outcome rejected) instead of retried without end, by reason (panic, unpublishable, duplicate).",
		}, []string{"reason"}),
		Fenced: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fabric_converge_fenced_commits_total",
			Help: "Commits refused by the checkpoint fence (another worker or an earlier attempt wrote first).",
		}),
		Batches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fabric_converge_batches_total",
			Help: "Atomic batches committed, by whether they hold one group or many.",
		}, []string{"groups"}),
		Expirations: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fabric_converge_cleanup_passes_total",
			Help: "Disappearing-message cleanup passes that deleted at least one message.",
		}),
		Retries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fabric_converge_input_retries_total",
			Help: "Inputs that failed for an infrastructure reason and are retried in order after a backoff.",
		}),
		Stalled: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "fabric_converge_stalled_partitions",
			Help: "Owned partitions whose next input failed and has not succeeded since: none of their groups advances.",
		}),
		LostDeliveries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fabric_converge_lost_deliveries_total",
			Help: "Gaps in a partition consumer's deliveries (a message sent that never arrived, as when a NATS node goes): the consumer delivers again from the input after the last received.",
		}),
		Resident: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "fabric_converge_resident_groups",
			Help: "Groups whose hosted members are in memory; a group idle for the idle time is dropped, and its next input restores it from its stored state.",
		}),
		MemoryReleases: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fabric_converge_memory_releases_total",
			Help: "Times the memory freed by dropping idle groups was returned to the system (at most once per idle time).",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.Inputs, m.Latency, m.Owned, m.Lag, m.Events, m.Fenced, m.FailedInputs, m.Expirations, m.Batches, m.Retries, m.Stalled, m.LostDeliveries, m.Resident, m.MemoryReleases)
	}
	// The label values known up front exist at zero from the start, so
	// rates and alerts over them work on a fresh worker.
	for _, d := range []schema.Disposition{schema.DispositionAccepted, schema.DispositionDeferred, schema.DispositionStale, schema.DispositionInvalidated} {
		m.Inputs.WithLabelValues(string(d))
	}
	m.Inputs.WithLabelValues(string(schema.StatusRejected))
	for _, k := range schema.AllKinds() {
		m.Events.WithLabelValues(string(k))
	}
	m.Batches.WithLabelValues("1")
	m.Batches.WithLabelValues("many")
	for _, r := range []string{failPanic, failUnpublishable, failDuplicate} {
		m.FailedInputs.WithLabelValues(r)
	}
	return m
}

func (m *Metrics) disposition(n outcomeNote) {
	d := string(n.Disposition)
	if d == "" {
		d = string(n.Status)
	}
	m.Inputs.WithLabelValues(d).Inc()
}
