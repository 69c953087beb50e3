package fanout

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/fabric-mls/fabric/internal/eventually"
	"github.com/fabric-mls/fabric/internal/fanout/queue"
	"github.com/fabric-mls/fabric/pkg/client"
	"github.com/fabric-mls/fabric/pkg/schema"
	"github.com/fabric-mls/fabric/pkg/wire"
)

// Over a real WebSocket with no credit returned: exactly 1024 events are
// held end to end, the next N are discarded and reported as one lagged with
// the exact N, before the next event.
func TestBoundThenOneLagged_EVENT030_EVENT031(t *testing.T) {
	e := newEnv(t)
	r := e.raw(token(t, tenantA, client1))
	sub := r.subscribe(1, client1, schema.EventFilter{Kinds: recvKinds})

	const over = 37
	for i := range queue.DefaultCapacity + over {
		e.publish(tenantA, client1, published{ev: received(groupA, i, nil)})
	}
	// The whole window arrives, in order: it is sent, not held back.
	for i := range queue.DefaultCapacity {
		f := r.read()
		if f.Op != wire.OpEvent || f.Sub != sub {
			t.Fatalf("frame %d: %+v", i, f)
		}
		if n := msgNo(decodeJSONEvent(t, f.Event)); n != i {
			t.Fatalf("event %d has number %d", i, n)
		}
	}
	eventually.True(t, "the discards", func() bool { return testutil.ToFloat64(e.g.metrics.discarded) == over })

	// Nothing more is sent while the SDK holds the whole window.
	r.send(wire.Frame{Op: wire.OpCredit, Sub: sub, N: queue.DefaultCapacity})
	f := r.read()
	ev := decodeJSONEvent(t, f.Event)
	if ev.Kind != schema.KindLagged || ev.Lagged.Discarded != over {
		t.Fatalf("want lagged{%d} first, got %+v", over, ev)
	}
	e.publish(tenantA, client1, published{ev: received(groupA, 5000, nil)})
	if n := msgNo(decodeJSONEvent(t, r.read().Event)); n != 5000 {
		t.Fatalf("after lagged got event %d", n)
	}
	if got := testutil.ToFloat64(e.g.metrics.lagged); got != 1 {
		t.Fatalf("lagged handed off %v times", got)
	}
}

// Through the SDK: an app that stops reading has 1024 events held; later
// events are discarded; when it reads again it gets the 1024, then one
// lagged with the exact count, then the next event.
func TestSDKBoundThenLagged_EVENT030_EVENT031(t *testing.T) {
	e := newEnv(t)
	c := e.connect(tenantA, []string{client1})
	s, err := c.Subscribe(context.Background(), client1, schema.EventFilter{Kinds: recvKinds})
	if err != nil {
		t.Fatal(err)
	}
	const over = 5
	stallPastTheBound(t, e, s, over)
	// The handoffs' credit reaches the gateway; then the next event has room.
	eventually.True(t, "the credit", func() bool { return e.held(tenantA, client1) == 0 })
	e.publish(tenantA, client1, published{ev: received(groupA, 9999, nil)})
	ev := next(t, s)
	if ev.Kind != schema.KindLagged || ev.Lagged.Discarded != over {
		t.Fatalf("want lagged{%d}, got %+v", over, ev.Lagged)
	}
	if n := msgNo(next(t, s)); n != 9999 {
		t.Fatalf("after lagged got %d", n)
	}
}

// A lagged carries the stream sequence of the last event it counts, and the
// SDK resumes after it: after a reconnect the discarded events are not
// replayed, since the lagged already reported them (EVENT-001, EVENT-031).
func TestResumeAfterLaggedSkipsTheCountedEvents_EVENT031(t *testing.T) {
	e := newEnv(t)
	c := e.connect(tenantA, []string{client1}, client.WithBackoff(500*time.Millisecond, time.Second))
	s, err := c.Subscribe(context.Background(), client1, schema.EventFilter{Kinds: recvKinds})
	if err != nil {
		t.Fatal(err)
	}
	const over = 5
	stallPastTheBound(t, e, s, over)
	if ev := next(t, s); ev.Kind != schema.KindLagged || ev.Lagged.Discarded != over {
		t.Fatalf("want lagged{%d}, got %+v", over, ev)
	}
	e.dropConnections(t)
	// Stored while disconnected: the resume replays it.
	e.publish(tenantA, client1, published{ev: received(groupA, 9999, nil)})
	if n := msgNo(next(t, s)); n != 9999 {
		t.Fatalf("after the resume got event %d, which the lagged counted", n)
	}
}

// stallPastTheBound publishes the bound and over more events to a
// subscription that reads nothing, waits for the over discards, then reads
// the 1024 held events in order.
func stallPastTheBound(t *testing.T, e *env, s *client.Subscription, over int) {
	t.Helper()
	for i := range queue.DefaultCapacity + over {
		e.publish(tenantA, client1, published{ev: received(groupA, i, nil)})
	}
	eventually.True(t, "the discards", func() bool { return testutil.ToFloat64(e.g.metrics.discarded) == float64(over) })
	for i := range queue.DefaultCapacity {
		if n := msgNo(next(t, s)); n != i {
			t.Fatalf("handoff %d is event %d", i, n)
		}
	}
}
