package converge

import (
	"fmt"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/fabric-mls/fabric/internal/components"
	"github.com/fabric-mls/fabric/internal/testpeer"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// TestPipelinedRunOnceInOrder_EVENT001: a backlog of one group arrives in
// one fetch and is committed as several pipelined transactions (one
// applied while the one before is stored); every message is delivered
// once, in stream order, and every input's outcome is recorded.
func TestPipelinedRunOnceInOrder_EVENT001(t *testing.T) {
	t.Parallel()
	// A backlog waiting when the worker starts, and a burst arriving while
	// it runs (taken from the fetch while a batch is in flight).
	for _, running := range []bool{false, true} {
		t.Run(fmt.Sprintf("worker-running=%v", running), func(t *testing.T) {
			t.Parallel()
			pipelinedRun(t, running)
		})
	}
}

func pipelinedRun(t *testing.T, running bool) {
	const n = 700 // more than one pipelined transaction holds
	e := newEnv(t)
	h := e.register(peer(t, "bob").AccountID(), 1)
	m := NewMetrics(nil)
	if running {
		e.worker("w1", func(c *Config) { c.Metrics = m })
	}
	_, g := groupWithHosted(t, e, components.Set{}, h)
	sent := make([]testpeer.Message, n)
	for i := range sent {
		sent[i] = must[testpeer.Message](t)(g.SendText("x"))
	}
	for _, s := range sent {
		if _, err := e.js.PublishMsgAsync(inputMsg(t, s)); err != nil {
			t.Fatal(err)
		}
	}
	if !running {
		e.worker("w1", func(c *Config) { c.Metrics = m })
	}
	evs := e.waitEvents(h.rec.ClientID, n+1)
	uniqueIDs(t, evs)
	if evs[0].Event.Kind != schema.KindConversationJoined {
		t.Fatalf("first event %s", evs[0].Event.Kind)
	}
	for i, s := range sent {
		if r := evs[i+1].Event.MessageReceived; r == nil || !r.MessageID.Equal(s.ID) {
			t.Fatalf("event %d is not message %d", i+1, i)
		}
	}
	for _, i := range []int{0, n / 2, n - 1} {
		if o := e.settledOutcome(sent[i].ID); o.Disposition != schema.DispositionAccepted {
			t.Fatalf("message %d outcome %s/%s", i, o.Status, o.Disposition)
		}
	}
	if b := testutil.ToFloat64(m.Batches.WithLabelValues("1")); b < 3 {
		t.Fatalf("%v batches; want the welcome's and at least two for the messages", b)
	}
}
