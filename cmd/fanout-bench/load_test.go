package main

import (
	"bytes"
	"context"
	"fmt"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/vmihailenco/msgpack/v5"
	"go.uber.org/goleak"

	"github.com/fabric-mls/fabric/internal/auth"
	"github.com/fabric-mls/fabric/internal/bus"
	"github.com/fabric-mls/fabric/internal/bus/streams"
	"github.com/fabric-mls/fabric/internal/converge/project"
	"github.com/fabric-mls/fabric/internal/fanout"
	"github.com/fabric-mls/fabric/internal/natsserver/natstest"
	"github.com/fabric-mls/fabric/pkg/schema"
	"github.com/fabric-mls/fabric/pkg/wire"
)

// TestLoadSubscriberReadsFramesAsDecoded protects the load figures: the
// subscribers' light reading of event frames counts what wire.Decode would,
// events with their publish stamp and lagged apart, in both encodings.
func TestLoadSubscriberReadsFramesAsDecoded(t *testing.T) {
	for _, enc := range []wire.Encoding{wire.Msgpack, wire.JSON} {
		t.Run(enc.Subprotocol(), func(t *testing.T) {
			f := &fabricSystem{json: enc == wire.JSON}
			st := &subscriber{subscribed: make(chan struct{}), m: &meter{}}
			st.m.sampling.Store(true)
			f.frame(st, wire.Append(enc, nil, &wire.Frame{Op: wire.OpSubscribed, ID: 1, Sub: 7, Seq: 3}))
			if st.sub != 7 {
				t.Fatalf("subscribed frame read as sub %d, want 7", st.sub)
			}
			stamp := time.Now().Add(-time.Second).UnixNano()
			id := fmt.Sprintf("%016x%048x", stamp, 1)
			ev := wire.Append(enc, nil, &wire.Frame{Op: wire.OpEvent, Sub: 7, Seq: 300, EventID: id,
				Event: wire.AppendLagged(enc, nil, 1)})
			lagged := wire.Append(enc, nil, &wire.Frame{Op: wire.OpEvent, Sub: 7, Seq: 301, AtMost: true,
				Event: wire.AppendLagged(enc, nil, 5)})
			f.frame(st, ev)
			f.frame(st, lagged)
			if got := st.m.delivered.Load(); got != 1 {
				t.Errorf("delivered %d, want 1", got)
			}
			if got := st.m.lagged.Load(); got != 1 {
				t.Errorf("lagged %d, want 1", got)
			}
			if len(st.m.lat) != 1 || st.m.lat[0] < time.Second || st.m.lat[0] > time.Minute {
				t.Errorf("latency samples %v, want one of about a second", st.m.lat)
			}
		})
	}
}

// TestBatchPublishedEventReachesSubscriberAsConvergeStores protects the
// fabric side of the load figures: a burst batch is stored as converge
// stores a transaction of input messages to a group of hosted members (one
// atomic batch, each message's events, the group checkpoint last naming the
// group's members, fenced on the previous one), each event is
// what converge's project.Received makes for the member, and it reaches
// the member's subscriber through the gateway decoded equal to it.
func TestBatchPublishedEventReachesSubscriberAsConvergeStores(t *testing.T) {
	env := natstest.Start(t)
	nc := env.Connect(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	f := &fabricSystem{secret: bytes.Repeat([]byte("fanout-load-test-secret-"), 2), js: js, publishers: 1,
		clients: []string{"00000001", "00000002"}, members: 1, ckSeq: make([]uint64, 1)}
	kv, err := js.KeyValue(ctx, streams.BucketClients)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range f.clients {
		if _, err := kv.Put(ctx, tenant+"."+c, []byte{0x80}); err != nil {
			t.Fatal(err)
		}
	}
	v, err := auth.NewVerifier(f.secret)
	if err != nil {
		t.Fatal(err)
	}
	g, err := fanout.New(fanout.Config{NATS: nc, Verifier: v, MaxConnsPerTenant: -1})
	if err != nil {
		t.Fatal(err)
	}
	gctx, stopGateway := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- g.Run(gctx) }()
	srv := httptest.NewServer(g.Handler())
	defer func() {
		srv.Close()
		stopGateway()
		if err := <-ran; err != nil {
			t.Error(err)
		}
	}()
	f.gw = &child{first: strings.TrimPrefix(srv.URL, "http://")}

	// Subscriber 1 reads its frames; each event frame is kept whole.
	ws, err := f.dial(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.CloseNow()
	st := &subscriber{ws: ws, subscribed: make(chan struct{}), m: &meter{}}
	frames := make(chan []byte, 8)
	go func() {
		for {
			_, b, err := ws.Read(ctx)
			if err != nil {
				close(frames)
				return
			}
			f.frame(st, b)
			if bytes.HasPrefix(b[1:], eventOp[wire.Msgpack]) {
				frames <- b
			}
		}
	}()
	select {
	case <-st.subscribed:
	case <-ctx.Done():
		t.Fatal("not subscribed")
	}

	for round := range 2 {
		before := f.ckSeq[0]
		if err := f.publish(ctx, 0, []int{0, 1}); err != nil {
			t.Fatalf("batch %d: %v", round, err)
		}
		seq, data, err := bus.LastCheckpoint(ctx, js, tenant, fmt.Sprintf("%064x", 1))
		if err != nil {
			t.Fatal(err)
		}
		if seq != f.ckSeq[0] || seq != before+3 {
			t.Fatalf("batch %d: checkpoint at %d, fence carried %d, want %d (two messages' events, then the checkpoint)", round, seq, f.ckSeq[0], before+3)
		}
		var ck benchCheckpoint
		if err := msgpack.Unmarshal(data, &ck); err != nil || len(ck.Members) != 1 {
			t.Fatalf("batch %d: checkpoint %+v (%v), want the group's one hosted member named", round, ck, err)
		}
		first := natstest.ClientEvents(t, js, tenant, f.clients[0])
		if len(first) != round+1 {
			t.Fatalf("batch %d: first member holds %d events, want %d", round, len(first), round+1)
		}

		b, ok := <-frames
		if !ok {
			t.Fatal("connection closed before the event")
		}
		fr, err := wire.Decode(wire.Msgpack, b)
		if err != nil {
			t.Fatal(err)
		}
		var got schema.ClientEvent
		if err := got.UnmarshalMsgpack(fr.Event); err != nil {
			t.Fatal(err)
		}
		want, ok := project.Received(got.MessageReceived.GroupID, project.Member{InboxID: "00000002", Installation: []byte{2}},
			project.Message{ID: got.MessageReceived.MessageID, SenderInboxID: benchSender, SenderInstallation: []byte{1}, ContentType: benchText}, 0)
		if !ok {
			t.Fatal("converge makes no message.received for this member")
		}
		if !reflect.DeepEqual(got, want.ClientEvent) {
			t.Errorf("batch %d: subscriber read %+v, converge stores %+v", round, got, want.ClientEvent)
		}
		if len(got.MessageReceived.GroupID) != 32 || len(got.MessageReceived.MessageID) != 32 {
			t.Errorf("batch %d: group id %d bytes, message id %d bytes, want 32 each", round, len(got.MessageReceived.GroupID), len(got.MessageReceived.MessageID))
		}
		stored := natstest.ClientEvents(t, js, tenant, f.clients[1])
		if len(stored) != round+1 || stored[round].ID != fr.EventID || !reflect.DeepEqual(stored[round].Event, got) {
			t.Errorf("batch %d: stored %+v, subscriber read %s %+v", round, stored, fr.EventID, got)
		}
		if bytes.Equal(first[round].Event.MessageReceived.MessageID, got.MessageReceived.MessageID) {
			t.Errorf("batch %d: both members' events carry message %x, want one message each", round, got.MessageReceived.MessageID)
		}
	}
	if got := st.m.delivered.Load(); got != 2 {
		t.Errorf("subscriber counted %d events, want 2", got)
	}
}

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
