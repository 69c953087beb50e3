package fanout

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fabric-mls/fabric/internal/bus"
	"github.com/fabric-mls/fabric/pkg/client"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// Callbacks of one subscription never overlap and run in emission order.
func TestOneCallbackAtATime_EVENT050(t *testing.T) {
	e := newEnv(t)
	c := e.connect(tenantA, []string{client1})
	const total = 40
	var running, maxRunning atomic.Int32
	var mu sync.Mutex
	var order []int
	all := make(chan struct{})
	s, err := c.SubscribeFunc(context.Background(), client1, schema.EventFilter{Kinds: recvKinds},
		func(_ context.Context, ev schema.ClientEvent) error {
			n := running.Add(1)
			for {
				m := maxRunning.Load()
				if n <= m || maxRunning.CompareAndSwap(m, n) {
					break
				}
			}
			time.Sleep(time.Millisecond) // widen any overlap
			running.Add(-1)
			mu.Lock()
			order = append(order, msgNo(ev))
			if len(order) == total {
				close(all)
			}
			mu.Unlock()
			return nil
		})
	if err != nil {
		t.Fatal(err)
	}
	for i := range total {
		e.publish(tenantA, client1, published{ev: received(groupA, i, nil)})
	}
	<-all
	if m := maxRunning.Load(); m != 1 {
		t.Fatalf("%d callbacks ran at once", m)
	}
	for i, n := range order {
		if n != i {
			t.Fatalf("callback %d got event %d", i, n)
		}
	}
	_ = s.Close()
	<-s.Done()
}

// A callback that fails or panics is contained: later events keep coming,
// and neither its subscription, another one, nor the client ends.
func TestFailedCallbackContained_EVENT051(t *testing.T) {
	e := newEnv(t)
	var reported atomic.Int32
	c := e.connect(tenantA, []string{client1}, client.WithErrorHandler(func(err error) {
		var pe *client.CallbackPanicError
		if errors.As(err, &pe) || err.Error() == "boom" {
			reported.Add(1)
		}
	}))
	got := make(chan int, 16)
	s, err := c.SubscribeFunc(context.Background(), client1, schema.EventFilter{Kinds: recvKinds},
		func(_ context.Context, ev schema.ClientEvent) error {
			n := msgNo(ev)
			got <- n
			switch n {
			case 1:
				panic("callback panics")
			case 2:
				return errors.New("boom")
			}
			return nil
		})
	if err != nil {
		t.Fatal(err)
	}
	other, err := c.Subscribe(context.Background(), client1, schema.EventFilter{Kinds: recvKinds})
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 4; i++ {
		e.publish(tenantA, client1, published{ev: received(groupA, i, nil)})
	}
	for i := 1; i <= 4; i++ {
		if n := <-got; n != i {
			t.Fatalf("callback %d got %d", i, n)
		}
		if n := msgNo(next(t, other)); n != i {
			t.Fatalf("other subscription got %d", n)
		}
	}
	if reported.Load() != 2 {
		t.Fatalf("reported %d failures, want 2", reported.Load())
	}
	if s.Err() != nil || other.Err() != nil {
		t.Fatal("a failed callback ended a subscription")
	}
	// The client still works: a new subscription succeeds.
	if _, err := c.Subscribe(context.Background(), client1, schema.EventFilter{Kinds: recvKinds}); err != nil {
		t.Fatal(err)
	}
	_ = s.Close()
	<-s.Done()
}

// Calls from inside a callback complete without waiting for it: a
// subscribe, ending its own subscription, and closing the client.
func TestCallsFromCallbackComplete_EVENT052(t *testing.T) {
	e := newEnv(t)
	c := e.connect(tenantA, []string{client1})
	steps := make(chan string, 4)
	release := make(chan struct{})
	var self *client.Subscription
	ready := make(chan struct{})
	s, err := c.SubscribeFunc(context.Background(), client1, schema.EventFilter{Kinds: recvKinds},
		func(ctx context.Context, ev schema.ClientEvent) error {
			<-ready
			if _, err := c.Subscribe(ctx, client1, schema.EventFilter{Kinds: recvKinds}); err != nil {
				steps <- "subscribe failed: " + err.Error()
			} else {
				steps <- "subscribed"
			}
			_ = self.Close()
			steps <- "unsubscribed"
			_ = c.Close()
			steps <- "closed"
			<-release // the callback is still running: nothing above waited for it
			return nil
		})
	if err != nil {
		t.Fatal(err)
	}
	self = s
	close(ready)
	e.publish(tenantA, client1, published{ev: received(groupA, 1, nil)})
	for _, want := range []string{"subscribed", "unsubscribed", "closed"} {
		select {
		case got := <-steps:
			if got != want {
				t.Fatalf("step %q, want %q", got, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("call from the callback did not complete: waiting for %q", want)
		}
	}
	select {
	case <-s.Done():
		t.Fatal("Done before the callback returned")
	default:
	}
	close(release)
	<-s.Done()
}

// Ending a subscription completes a pending Next as ended, and no event is
// handed off after it; the same for a callback subscription.
func TestEndingStopsHandoffs_EVENT053(t *testing.T) {
	e := newEnv(t)
	c := e.connect(tenantA, []string{client1})
	s, err := c.Subscribe(context.Background(), client1, schema.EventFilter{Kinds: recvKinds})
	if err != nil {
		t.Fatal(err)
	}
	pending := make(chan error, 1)
	go func() {
		_, err := s.Next(e.ctx)
		pending <- err
	}()
	time.Sleep(20 * time.Millisecond) // let Next block; the assertion holds either way
	_ = s.Close()
	if err := <-pending; !errors.Is(err, client.ErrEnded) {
		t.Fatalf("pending Next: %v", err)
	}

	var calls atomic.Int32
	first := make(chan struct{})
	cb, err := c.SubscribeFunc(context.Background(), client1, schema.EventFilter{Kinds: recvKinds},
		func(context.Context, schema.ClientEvent) error {
			if calls.Add(1) == 1 {
				close(first)
			}
			return nil
		})
	if err != nil {
		t.Fatal(err)
	}
	witness, err := c.Subscribe(context.Background(), client1, schema.EventFilter{Kinds: recvKinds})
	if err != nil {
		t.Fatal(err)
	}
	e.publish(tenantA, client1, published{ev: received(groupA, 1, nil)})
	<-first
	_ = cb.Close()
	<-cb.Done()
	for i := 2; i <= 5; i++ {
		e.publish(tenantA, client1, published{ev: received(groupA, i, nil)})
	}
	// The witness saw all five, so the ended one had every chance to run.
	for i := 1; i <= 5; i++ {
		if n := msgNo(next(t, witness)); n != i {
			t.Fatalf("witness got %d", n)
		}
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("callback ran %d times; after ending it must not run", n)
	}
	if _, err := s.Next(e.ctx); !errors.Is(err, client.ErrEnded) {
		t.Fatalf("Next after end: %v", err)
	}
}

// Closing the client ends every subscription before Close returns.
func TestCloseEndsSubscriptions_EVENT054(t *testing.T) {
	e := newEnv(t)
	c := e.connect(tenantA, []string{client1})
	var subs []*client.Subscription
	for range 3 {
		s, err := c.Subscribe(context.Background(), client1, schema.EventFilter{Kinds: recvKinds})
		if err != nil {
			t.Fatal(err)
		}
		subs = append(subs, s)
	}
	cb, err := c.SubscribeFunc(context.Background(), client1, schema.EventFilter{Kinds: recvKinds},
		func(context.Context, schema.ClientEvent) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	subs = append(subs, cb)
	e.publish(tenantA, client1, published{ev: received(groupA, 1, nil)})
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	for i, s := range subs {
		if !errors.Is(s.Err(), client.ErrEnded) {
			t.Fatalf("subscription %d not ended by Close: %v", i, s.Err())
		}
	}
	for _, s := range subs[:3] {
		if _, err := s.Next(context.Background()); !errors.Is(err, client.ErrEnded) {
			t.Fatalf("Next after Close: %v", err)
		}
	}
	<-cb.Done()
	if _, err := c.Subscribe(context.Background(), client1, schema.EventFilter{Kinds: recvKinds}); !errors.Is(err, client.ErrClosed) {
		t.Fatalf("Subscribe after Close: %v", err)
	}
}

// The range-over-func form hands off the same events as Next and stops when
// the app ends the subscription.
func TestEventsIterator_EVENT015(t *testing.T) {
	e := newEnv(t)
	c := e.connect(tenantA, []string{client1})
	s, err := c.Subscribe(context.Background(), client1, schema.EventFilter{Kinds: recvKinds})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		e.publish(tenantA, client1, published{ev: received(groupA, i, nil)})
	}
	want := 0
	for ev, err := range s.Events(e.ctx) {
		if err != nil {
			t.Fatal(err)
		}
		if msgNo(ev) != want {
			t.Fatalf("got %d, want %d", msgNo(ev), want)
		}
		want++
		if want == 10 {
			_ = s.Close()
		}
	}
	if want != 10 {
		t.Fatalf("iterated %d events", want)
	}
}

// A Subscribe made while the connection is down waits for the reconnect and
// returns once registered; it then sees what is emitted after that.
func TestSubscribeWhileReconnecting_EVENT014(t *testing.T) {
	e := newEnv(t)
	c := e.connect(tenantA, []string{client1}, client.WithBackoff(300*time.Millisecond, time.Second))
	if _, err := c.Subscribe(context.Background(), client1, schema.EventFilter{Kinds: recvKinds}); err != nil {
		t.Fatal(err)
	}
	e.dropConnections(t)
	s, err := c.Subscribe(e.ctx, client1, schema.EventFilter{Kinds: recvKinds})
	if err != nil {
		t.Fatal(err)
	}
	e.publish(tenantA, client1, published{ev: received(groupA, 7, nil)})
	if n := msgNo(next(t, s)); n != 7 {
		t.Fatalf("got %d", n)
	}
}

// TestEventIDsMatchWithdrawnEventIDs: the SDK hands an app each event with
// its id, from the WebSocket event frame's event_id, so the ids a later
// fabric.commit_superseded withdraws name events the app holds (issue 15
// item 2). In both encodings.
func TestEventIDsMatchWithdrawnEventIDs(t *testing.T) {
	e := newEnv(t)
	for _, enc := range []string{"msgpack", "json"} {
		var opts []client.Option
		if enc == "json" {
			opts = append(opts, jsonOpt())
		}
		c := e.connect(tenantA, []string{client1}, opts...)
		s, err := c.Subscribe(context.Background(), client1, schema.EventFilter{Kinds: []schema.EventKind{schema.KindMembershipChanged, schema.KindCommitSuperseded}})
		if err != nil {
			t.Fatal(err)
		}
		joined := bus.EventID([]byte(enc), []byte("the commit's event"))
		e.publish(tenantA, client1, published{id: joined, ev: schema.ClientEvent{Kind: schema.KindMembershipChanged,
			MembershipChanged: &schema.MembershipChanged{GroupID: groupA, AddedInboxIDs: []string{strings.Repeat("ab", 32)}, RemovedInboxIDs: []string{}}}})
		e.publish(tenantA, client1, published{ev: schema.ClientEvent{Kind: schema.KindCommitSuperseded,
			CommitSuperseded: &schema.CommitSuperseded{GroupID: groupA, CommitDigest: bytes.Repeat([]byte{0xcd}, schema.CommitDigestSize), WithdrawnEventIDs: []string{joined}}}})
		first, second := next(t, s), next(t, s)
		if first.ID != joined {
			t.Fatalf("%s: event id %q, want %q", enc, first.ID, joined)
		}
		if second.ID == "" || second.ID == first.ID {
			t.Fatalf("%s: the second event's id %q", enc, second.ID)
		}
		if w := second.CommitSuperseded; w == nil || len(w.WithdrawnEventIDs) != 1 || w.WithdrawnEventIDs[0] != first.ID {
			t.Fatalf("%s: %+v does not withdraw the event the app holds", enc, second)
		}
		_ = c.Close()
	}
}
