package fanout

import (
	"bytes"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fabric-mls/fabric/internal/auth"
	"github.com/fabric-mls/fabric/internal/bus"
	"github.com/fabric-mls/fabric/internal/bus/subject"
	"github.com/fabric-mls/fabric/internal/fanout/filter"
	"github.com/fabric-mls/fabric/internal/fanout/queue"
	"github.com/fabric-mls/fabric/pkg/schema"
	"github.com/fabric-mls/fabric/pkg/wire"
)

// republished builds a stored event's body as RePublish delivers it on the
// client's live subject, without a server.
func republished(tb testing.TB, body []byte) *nats.Msg {
	tb.Helper()
	live, err := subject.Live(tenantA, client1)
	if err != nil {
		tb.Fatal(err)
	}
	stored, err := subject.Events(tenantA, client1)
	if err != nil {
		tb.Fatal(err)
	}
	m := nats.NewMsg(live)
	m.Header.Set(jetstream.SubjectHeader, stored)
	m.Header.Set(jetstream.SequenceHeader, "7")
	m.Header.Set(bus.HeaderLastSequence, "3")
	m.Header.Set(jetstream.TimeStampHeaer, "2026-12-03T19:00:00.123456789Z")
	m.Header.Set(jetstream.MsgIDHeader, bus.EventID([]byte("frame")))
	m.Data = body
	return m
}

// frameSubs are the subscriptions eventFrames offers an event to: every
// kind in msgpack, JSON and SSE, and a filter narrowed by group and
// content type (EVENT-020).
var frameSubs = []struct {
	enc    wire.Encoding
	sse    bool
	filter schema.EventFilter
}{
	{wire.Msgpack, false, schema.EventFilter{Kinds: schema.AllKinds()}},
	{wire.JSON, false, schema.EventFilter{Kinds: schema.AllKinds()}},
	{wire.JSON, true, schema.EventFilter{Kinds: schema.AllKinds()}},
	{wire.Msgpack, false, schema.EventFilter{Kinds: schema.AllKinds(), GroupIDs: []schema.Bytes{groupA},
		ContentTypes: []schema.ContentTypeID{text}}},
}

// eventFrames offers d to one subscription of each of frameSubs through the
// tap, as onMsg does, and returns the frame each connection's writer builds
// for it, nil where the filter did not select it.
func eventFrames(tb testing.TB, d *bus.Delivered, body []byte) [][]byte {
	tb.Helper()
	m, err := newMetrics(prometheus.NewRegistry())
	if err != nil {
		tb.Fatal(err)
	}
	g := &Gateway{cfg: Config{QueueCapacity: queue.DefaultCapacity}, metrics: m}
	t := &tap{g: g, subs: make(map[*subscription]struct{})}
	conns := make([]*conn, len(frameSubs))
	for i, fs := range frameSubs {
		f, err := filter.Compile(fs.filter, nil)
		if err != nil {
			tb.Fatal(err)
		}
		conns[i] = newConn(g, fs.enc, fs.sse, auth.Claims{}, nil)
		s := conns[i].newSubscription(tenantA, client1, f, 0)
		conns[i].announce(s, nil)
		t.subs[s] = struct{}{}
	}
	t.offer(t.subs, d, body)
	frames := make([][]byte, len(conns))
	for i, c := range conns {
		c.mu.Lock()
		_, batch, _ := c.take(nil, defaultWriterBatch)
		c.mu.Unlock()
		if len(batch) > 1 {
			tb.Fatalf("subscription %d: %d frames for one event", i, len(batch))
		}
		if len(batch) == 1 {
			frames[i] = c.eventFrame(nil, &batch[0])
		}
	}
	return frames
}

// frameSamples are stored events of several shapes: in a group with and
// without a content type, naming no group, naming a group by consent
// entity, a lagged.
var frameSamples = []schema.ClientEvent{
	received(groupA, 1, &text), received(groupA, 2, nil), received(groupB, 3, &reply), hmacUpdated(),
	{Kind: schema.KindConsentChanged, ConsentChanged: &schema.ConsentChanged{
		EntityKind: schema.ConsentEntityConversation, Entity: "aa01", State: schema.ConsentAllowed}},
	{Kind: schema.KindLagged, Lagged: &schema.Lagged{Discarded: 5}},
}

// viewAndCopyFrames returns the frames the tap builds for body, and the
// frames as the gateway built them before: the event decoded with copies,
// its JSON encoded into a growing buffer, the filters applied to it. ok is
// false when both refuse the body.
func viewAndCopyFrames(t *testing.T, body []byte) (view, copied [][]byte, ok bool) {
	var ev schema.ClientEvent
	cerr := ev.UnmarshalMsgpack(bytes.Clone(body))
	d, err := bus.Decode(republished(t, body))
	if (err == nil) != (cerr == nil) {
		t.Fatalf("bus.Decode error %v, UnmarshalMsgpack error %v", err, cerr)
	}
	if err != nil {
		return nil, nil, false
	}
	js, err := ev.AppendJSON(nil)
	if err != nil {
		t.Fatal(err)
	}
	fe := filter.Describe(&ev, d.ConversationKey, d.ReferencesOwn)
	copied = make([][]byte, len(frameSubs))
	for i, fs := range frameSubs {
		f, err := filter.Compile(fs.filter, nil)
		if err != nil {
			t.Fatal(err)
		}
		if !f.Match(&fe) {
			continue
		}
		frame := wire.Frame{Op: wire.OpEvent, Sub: 1, Seq: d.Sequence, EventID: d.ID, Event: body}
		switch {
		case fs.sse:
			copied[i] = appendSSEEvent(nil, queue.Item[*event]{Value: &event{seq: d.Sequence, kind: ev.Kind, json: js}})
		case fs.enc == wire.JSON:
			frame.Event = js
			copied[i] = wire.Append(fs.enc, nil, &frame)
		default:
			copied[i] = wire.Append(fs.enc, nil, &frame)
		}
	}
	return eventFrames(t, &d, body), copied, true
}

// TestEventFrameOfViewIsTheCopysFrame: every sample event reaches the
// subscriptions of every kind in msgpack, JSON and SSE with the frame bytes
// the gateway wrote before it read events as views of the message and
// presized their JSON.
func TestEventFrameOfViewIsTheCopysFrame(t *testing.T) {
	for _, ev := range frameSamples {
		body, err := ev.MarshalMsgpack()
		if err != nil {
			t.Fatal(err)
		}
		view, copied, ok := viewAndCopyFrames(t, body)
		if !ok {
			t.Fatalf("%s refused", ev.Kind)
		}
		for i := range view {
			if i < 3 && view[i] == nil {
				t.Fatalf("%s: subscription %d got no frame", ev.Kind, i)
			}
			if !bytes.Equal(view[i], copied[i]) {
				t.Fatalf("%s: subscription %d: frame %q from the view, %q from the copy", ev.Kind, i, view[i], copied[i])
			}
		}
	}
}

// FuzzEventFrame: for any stored body, the frames the gateway writes are
// byte for byte those it wrote before (viewAndCopyFrames), in msgpack, JSON
// and SSE, through the same filters; a body UnmarshalMsgpack refuses is
// refused. Seeds: frameSamples and testdata/fuzz/FuzzEventFrame.
func FuzzEventFrame(f *testing.F) {
	for _, ev := range frameSamples {
		b, err := ev.MarshalMsgpack()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		view, copied, _ := viewAndCopyFrames(t, body)
		for i := range view {
			if !bytes.Equal(view[i], copied[i]) {
				t.Fatalf("subscription %d: frame %q from the view, %q from the copy", i, view[i], copied[i])
			}
		}
	})
}
