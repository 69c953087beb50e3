package converge

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/fabric-mls/fabric/internal/bus/subject"
	"github.com/fabric-mls/fabric/internal/components"
	"github.com/fabric-mls/fabric/internal/eventually"
	"github.com/fabric-mls/fabric/internal/testpeer"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// TestMetrics: processing shows in the metrics, which lint clean and carry
// no id in a label.
func TestMetrics(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	h := e.register(peer(t, "bob").AccountID(), 1)
	e.worker("w1", func(c *Config) { c.Metrics = m })
	_, g := groupWithHosted(t, e, components.Set{}, h)
	e.publish(must[testpeer.Message](t)(g.SendText("counted")))
	e.waitEvents(h.rec.ClientID, 2)

	// The counters move after the events are stored (outcomes follow their
	// events), so they are awaited, not read at once.
	accepted := m.Inputs.WithLabelValues(string(schema.DispositionAccepted))
	settled := func() bool {
		return testutil.ToFloat64(m.Owned) == subject.Partitions && testutil.ToFloat64(accepted) == 2 &&
			testutil.ToFloat64(m.Events.WithLabelValues(string(schema.KindMessageReceived))) == 1
	}
	eventually.True(t, "the counters settle", settled)
	if got := testutil.ToFloat64(m.Owned); got != subject.Partitions {
		t.Errorf("owned partitions %v", got)
	}
	if got := testutil.ToFloat64(accepted); got != 2 {
		t.Errorf("accepted inputs %v, want 2", got)
	}
	if got := testutil.ToFloat64(m.Events.WithLabelValues(string(schema.KindMessageReceived))); got != 1 {
		t.Errorf("message.received events %v, want 1", got)
	}
	if n := testutil.CollectAndCount(m.Latency); n != 1 {
		t.Errorf("latency series %d", n)
	}
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint %s: %s", p.Metric, p.Text)
	}
}
