package ingest

import (
	"sync"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/fabric-mls/fabric/internal/bus/streams"
	"github.com/fabric-mls/fabric/internal/eventually"
	"github.com/fabric-mls/fabric/internal/natsserver/natstest"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// newClusterEnv runs the workers against a three-node cluster with R3
// streams, each worker on another node. Replicated streams check
// Nats-Msg-Id before the expected sequence and answer a concurrent write to
// one subject with 10164 (research/nats.md section 2), so dedup is tested
// there too.
func newClusterEnv(t *testing.T, o envOpts) *env {
	t.Helper()
	ce := natstest.Start(t, natstest.ThreeNodes(), natstest.WithStreams(streams.Config{Replicas: 3, DuplicateWindow: o.window}))
	nc, js, c := ce.Conn, ce.JS, ce.Cluster
	var mu sync.Mutex
	next := 0
	e := &env{t: t, nc: nc, js: js, connect: func() (*nats.Conn, error) {
		mu.Lock()
		defer mu.Unlock()
		next++
		return c.Node(next % 3).Connect()
	}}
	e.addWorkers(o)
	return e
}

// On R3 streams, two workers on different nodes taking the same messages
// at once publish each exactly once, and a redelivery is a duplicate.
func TestExactlyOnceOnR3(t *testing.T) {
	t.Parallel()
	e := newClusterEnv(t, envOpts{workers: 2})
	g := newGroup(t)
	e.hostGroup(g.ID())
	const n = 10
	msgs := make([]schema.TransportMessage, n)
	for i := range msgs {
		msgs[i] = text(t, g, "r3").Transport
	}
	var wg sync.WaitGroup
	results := make([][]Result, 2)
	for i, w := range e.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = w.submit(t, msgs...)
		}()
	}
	wg.Wait()
	for i := range msgs {
		q := 0
		for _, r := range results {
			switch {
			case r[i].Status == schema.StatusQueued:
				q++
			case r[i].Category != schema.CategoryDuplicate:
				t.Fatalf("result %s/%s", r[i].Status, r[i].Category)
			}
		}
		if q != 1 {
			t.Fatalf("message %d queued %d times", i, q)
		}
	}
	if got := len(e.inputs()); got != n {
		t.Fatalf("FABRIC_IN holds %d messages, want %d", got, n)
	}
	wantResult(t, e.workers[1].submitOne(t, msgs[0]), nil, schema.StatusRejected, schema.CategoryDuplicate)

	// Unknown group, then the join, on the cluster too.
	other := newGroup(t)
	m := text(t, other, "later")
	wantResult(t, e.workers[0].submitOne(t, m.Transport), m.ID, schema.StatusRejected, schema.CategoryUnknownGroup)
	e.hostGroup(other.ID())
	eventually.True(t, "backfill", func() bool { return len(e.inputs()) == n+1 })
	e.workers[1].awaitOutcome(t, m.ID, schema.StatusQueued, "", schema.ClassApplication)
}
