package fanout

import (
	"context"
	"testing"
	"time"

	"github.com/fabric-mls/fabric/internal/bus/streams"
	"github.com/fabric-mls/fabric/internal/eventually"
	"github.com/fabric-mls/fabric/pkg/client"
	"github.com/fabric-mls/fabric/pkg/schema"
	"github.com/fabric-mls/fabric/pkg/wire"
)

// A subscription started from a time gets exactly the client's events
// stored at or after it, in order, then live ones, with none twice; one
// stored before it is not handed off. Live subscriptions keep EVENT-014.
func TestSubscribeSinceReplaysStoredThenLive(t *testing.T) {
	e := newEnv(t)
	before := e.publish(tenantA, client1, published{ev: received(groupA, 0, nil)})
	st, err := e.js.Stream(e.ctx, streams.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	m, err := st.GetMsg(e.ctx, before)
	if err != nil {
		t.Fatal(err)
	}
	start := time.UnixMilli(m.Time.UnixMilli() + 1)
	eventually.True(t, "the clock to pass the start", func() bool { return time.Now().After(start) })
	e.publish(tenantA, client1, published{ev: received(groupA, 1, nil)})
	e.publish(tenantA, client2, published{ev: received(groupA, 100, nil)})
	e.publish(tenantA, client1, published{ev: received(groupB, 2, nil)})

	c := e.connect(tenantA, []string{client1})
	live, err := c.Subscribe(context.Background(), client1, schema.EventFilter{Kinds: recvKinds})
	if err != nil {
		t.Fatal(err)
	}
	s, err := c.Subscribe(context.Background(), client1, schema.EventFilter{Kinds: recvKinds}, client.Since(start))
	if err != nil {
		t.Fatal(err)
	}
	e.publish(tenantA, client1, published{ev: received(groupA, 3, nil)})
	for _, want := range []int{1, 2, 3} {
		if n := msgNo(next(t, s)); n != want {
			t.Fatalf("since: got event %d, want %d", n, want)
		}
	}
	if n := msgNo(next(t, live)); n != 3 {
		t.Fatalf("live: got event %d, want 3 (EVENT-014)", n)
	}
	e.publish(tenantA, client1, published{ev: received(groupA, 4, nil)})
	if n := msgNo(next(t, s)); n != 4 {
		t.Fatalf("since: got event %d after 3, want 4", n)
	}
}

// From the start replays the client's first stored event even when it is
// the stream's first message (sequence 1), which after_seq cannot name.
func TestSubscribeFromStartReplaysFirstStoredEvent(t *testing.T) {
	e := newEnv(t)
	if seq := e.publish(tenantA, client1, published{ev: received(groupA, 0, nil)}); seq != 1 {
		t.Fatalf("first event stored at %d, want 1", seq)
	}
	e.publish(tenantA, client1, published{ev: received(groupA, 1, nil)})
	c := e.connect(tenantA, []string{client1}, jsonOpt())
	s, err := c.Subscribe(context.Background(), client1, schema.EventFilter{Kinds: recvKinds}, client.FromStart())
	if err != nil {
		t.Fatal(err)
	}
	e.publish(tenantA, client1, published{ev: received(groupA, 2, nil)})
	for want := range 3 {
		if n := msgNo(next(t, s)); n != want {
			t.Fatalf("got event %d, want %d", n, want)
		}
	}
}

// Past the replay limit a start from the stream ends in lagged, as a
// resume does (EVENT-031).
func TestSubscribeFromStartPastReplayLimitLagged_EVENT031(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.MaxReplay = 2 })
	for i := range 5 {
		e.publish(tenantA, client1, published{ev: received(groupA, i, nil)})
	}
	r := e.raw(token(t, tenantA, client1))
	all := schema.EventFilter{Kinds: recvKinds}
	r.send(wire.Frame{Op: wire.OpSubscribe, ID: 1, ClientID: client1, Filter: &all, FromStart: true})
	if f := r.read(); f.Op != wire.OpSubscribed {
		t.Fatalf("from start: %+v", f)
	}
	for _, want := range []int{0, 1} {
		if _, ev := r.readEvent(); msgNo(ev) != want {
			t.Fatalf("got %+v, want event %d", ev, want)
		}
	}
	if f, ev := r.readEvent(); ev.Kind != schema.KindLagged || ev.Lagged.Discarded != 3 || f.AtMost {
		t.Fatalf("got %+v (at_most %v), want lagged {3}", ev, f.AtMost)
	}
}

// Two starting points in one subscribe, or a start before the epoch, are a
// malformed frame, not a guess.
func TestSubscribeStartConflictsRefused(t *testing.T) {
	e := newEnv(t)
	after := e.publish(tenantA, client1, published{ev: received(groupA, 0, nil)})
	r := e.raw(token(t, tenantA, client1))
	all := schema.EventFilter{Kinds: recvKinds}
	for i, f := range []wire.Frame{
		{AfterSeq: after, FromStart: true},
		{AfterSeq: after, StartTime: time.Now().UnixMilli()},
		{StartTime: time.Now().UnixMilli(), FromStart: true},
		{StartTime: -1},
	} {
		f.Op, f.ID, f.ClientID, f.Filter = wire.OpSubscribe, uint64(i+1), client1, &all
		r.send(f)
		if got := r.read(); got.Op != wire.OpError || got.Code != wire.CodeMalformedFrame || got.ID != f.ID {
			t.Fatalf("%+v: got %+v, want malformed_frame", f, got)
		}
	}
}

// A subscription started from the stream keeps its place across a
// reconnect: it asks for its start again until it has received an event,
// then resumes after the last one; nothing is lost or repeated.
func TestSubscribeFromStartAcrossReconnect(t *testing.T) {
	e := newEnv(t)
	for i := range 3 {
		e.publish(tenantA, client1, published{ev: received(groupA, i, nil)})
	}
	c := e.connect(tenantA, []string{client1}, client.WithBackoff(10*time.Millisecond, 50*time.Millisecond))
	s, err := c.Subscribe(context.Background(), client1, schema.EventFilter{Kinds: recvKinds}, client.FromStart())
	if err != nil {
		t.Fatal(err)
	}
	abort := e.abortConnections
	abort()
	if n := msgNo(next(t, s)); n != 0 {
		t.Fatalf("got event %d, want 0", n)
	}
	abort()
	e.publish(tenantA, client1, published{ev: received(groupA, 3, nil)})
	for want := 1; want <= 3; want++ {
		if n := msgNo(next(t, s)); n != want {
			t.Fatalf("got event %d, want %d", n, want)
		}
	}
}
