package converge

import (
	"bytes"
	"testing"
	"time"

	"github.com/fabric-mls/fabric/internal/components"
	"github.com/fabric-mls/fabric/internal/testpeer"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// A group idle past Config.IdleAfter leaves memory (a cold member is not
// resident, issue 21), and the next input restores its member from the
// stored state: the messages before and after the eviction are each
// received once (EVENT-001), in order. With snapshots every 4th
// transaction the stored state is older than the evicted one, so the
// restored member ratchets forward from it, as after a restart.
func TestIdleGroupIsRestoredOnDemand(t *testing.T) {
	e := newEnv(t)
	m := NewMetrics(nil)
	h := e.register(peer(t, "bob").AccountID(), 1)
	e.worker("w1", func(c *Config) { c.Metrics, c.IdleAfter, c.SnapshotEvery = m, 100*time.Millisecond, 4 })
	_, g := groupWithHosted(t, e, components.Set{}, h)
	e.waitEvents(h.rec.ClientID, 1)
	texts := []string{"before", "after one eviction", "after two"}
	for i, text := range texts {
		if i > 0 {
			e.waitCold(m)
		}
		msg := must[testpeer.Message](t)(g.SendText(text))
		e.publish(msg)
		evs := e.waitEvents(h.rec.ClientID, i+2)
		got := evs[i+1].Event
		if got.Kind != schema.KindMessageReceived || got.MessageReceived == nil || !bytes.Equal(got.MessageReceived.MessageID, msg.ID) {
			t.Fatalf("event %d: %+v", i+1, got)
		}
	}
}
