package converge

import (
	"encoding/hex"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/fabric-mls/fabric/internal/bus"
	"github.com/fabric-mls/fabric/internal/testpeer"
)

// TestLostDeliveryIsAppliedInOrder: a delivery the server sent that never
// reached the worker (as when a NATS node shuts down under the pull) comes
// back only after AckWait, behind the group's later inputs, where the
// checkpoint's input_seq would take it for done. The worker notices the
// gap at the next delivery and has the lost input delivered again before
// it, so every input is applied once, in order (EVENT-001).
func TestLostDeliveryIsAppliedInOrder(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	h := e.register(peer(t, "bob").AccountID(), 1)
	alice := peer(t, "alice")
	g, welcome := e.invited(alice, h)
	hello := must[testpeer.Message](t)(g.SendText("hello"))
	after := must[testpeer.Message](t)(g.SendText("after hello"))

	helloID := hex.EncodeToString(hello.ID)
	var lost atomic.Bool
	e.hooks.delivery = func(m jetstream.Msg) bool {
		return m.Headers().Get(bus.HeaderMessageID) != helloID || !lost.CompareAndSwap(false, true)
	}
	metrics := NewMetrics(nil)
	e.worker("w1", func(c *Config) { c.Metrics = metrics })

	e.publish(welcome)
	e.waitEvents(h.rec.ClientID, 1)
	e.publish(hello)
	e.publish(after)
	evs := e.waitEvents(h.rec.ClientID, 3)
	if !lost.Load() {
		t.Fatal("the hello's delivery was never dropped")
	}
	for i, want := range []testpeer.Message{hello, after} {
		if r := evs[i+1].Event.MessageReceived; r == nil || !r.MessageID.Equal(want.ID) {
			t.Fatalf("event %d %s, want message %d", i+1, describe(evs[i+1].Event), i)
		}
	}
	uniqueIDs(t, evs)
	if n := testutil.ToFloat64(metrics.LostDeliveries); n != 1 {
		t.Fatalf("fabric_converge_lost_deliveries_total %v, want 1", n)
	}
}

// TestLostAcknowledgementFailsTheWrite: an asynchronous write whose
// acknowledgement never comes (lost with a NATS node shut down, the write
// stored or not) fails after the ack wait, so its input is retried,
// instead of holding the partition for ever.
//
// It sets ackWait, a package variable, so it runs alone.
func TestLostAcknowledgementFailsTheWrite(t *testing.T) {
	e := newEnv(t)
	// A subscriber takes the write and answers nothing, as a node that
	// went away does.
	sub, err := e.nc.SubscribeSync("lost.ack")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	was := ackWait
	ackWait = 200 * time.Millisecond
	t.Cleanup(func() { ackWait = was })
	f, err := e.js.PublishAsync("lost.ack", []byte("outcome"))
	if err != nil {
		t.Fatal(err)
	}
	if err := awaitAck(e.ctx, f); !errors.Is(err, errAckTimeout) {
		t.Fatalf("awaitAck: %v, want %v", err, errAckTimeout)
	}
}

// TestLastDeliveryLostIsAppliedBeforeItsPassIsCutOff: a delivery lost at
// the tail of a partition's input, with no later delivery to reveal the
// gap (a fetch the client gave up on as the server answered it), would
// come back only after AckWait, a minute, while its pass is cut off
// without it. Alice renames the group, sends a message and renames it
// again; the message's delivery is lost and the worker's clock is past
// every deadline. Before a pass is cut off the worker asks the consumer
// what it delivered, finds the loss and has the message delivered again:
// it is in its pass, and the client's events follow the order the changes
// were made (EVENT-012).
func TestLastDeliveryLostIsAppliedBeforeItsPassIsCutOff(t *testing.T) {
	t.Parallel()
	e, client, _, hi, _ := renamesAroundMessage(t)
	hiID := hex.EncodeToString(hi.ID)
	var lost atomic.Bool
	e.hooks.delivery = func(m jetstream.Msg) bool {
		return m.Headers().Get(bus.HeaderMessageID) != hiID || !lost.CompareAndSwap(false, true)
	}
	metrics := NewMetrics(nil)
	e.worker("w2", func(c *Config) {
		c.Metrics = metrics
		c.Now = func() time.Time { return time.Now().Add(time.Minute) }
	})
	wantRenameMessageRename(t, e, client)
	if !lost.Load() {
		t.Fatal("the message's delivery was never dropped")
	}
	if n := testutil.ToFloat64(metrics.LostDeliveries); n != 1 {
		t.Fatalf("fabric_converge_lost_deliveries_total %v, want 1", n)
	}
}
