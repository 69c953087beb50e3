package bus

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/synadia-io/orbit.go/jetstreamext"
	"github.com/vmihailenco/msgpack/v5"
	"go.uber.org/goleak"

	"github.com/fabric-mls/fabric/internal/bus/streams"
	"github.com/fabric-mls/fabric/internal/bus/subject"
	"github.com/fabric-mls/fabric/internal/natsserver"
	"github.com/fabric-mls/fabric/internal/natsserver/natstest"
	"github.com/fabric-mls/fabric/pkg/schema"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const (
	tenant = "acme"
	client = "c0ffee01"
)

var group = schema.Bytes{0x6a, 1, 2, 3, 4, 5, 6, 7}

func received(msgID byte) schema.ClientEvent {
	return schema.ClientEvent{Kind: schema.KindMessageReceived, MessageReceived: &schema.MessageReceived{
		GroupID: group, MessageID: bytes.Repeat([]byte{msgID}, 32), SenderInboxID: "0e9c8d5b",
		ContentType: &schema.ContentTypeID{AuthorityID: "xmtp.org", TypeID: "text", VersionMajor: 1},
	}}
}

func hmacUpdated() schema.ClientEvent {
	return schema.ClientEvent{Kind: schema.KindHmacKeysUpdated, HmacKeysUpdated: &schema.HmacKeysUpdated{}}
}

func event(n int, ev schema.ClientEvent) Event {
	return Event{Tenant: tenant, ClientID: client, ID: EventID(group, []byte(strconv.Itoa(n))), Event: &ev}
}

type env struct {
	ctx context.Context
	nc  *nats.Conn
	js  jetstream.JetStream
}

func setup(t testing.TB) env {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	n := natstest.Start(t)
	return env{ctx, n.Conn, n.JS}
}

func (e env) live(t *testing.T) *nats.Subscription {
	t.Helper()
	l, _ := subject.Live(tenant, client)
	sub, err := e.nc.SubscribeSync(l)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return sub
}

func (e env) stored(t *testing.T, subj string) uint64 {
	t.Helper()
	st, err := e.js.Stream(e.ctx, streams.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(e.ctx, jetstream.WithSubjectFilter(subj))
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Subjects[subj]
}

func sameEvent(t *testing.T, got, want schema.ClientEvent) {
	t.Helper()
	g, err := got.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	w, _ := want.MarshalJSON()
	if !bytes.Equal(g, w) {
		t.Fatalf("event = %s, want %s", g, w)
	}
}

func TestEventID(t *testing.T) {
	a := EventID([]byte("ab"), []byte("c"))
	if a != EventID([]byte("ab"), []byte("c")) {
		t.Fatal("EventID is not deterministic")
	}
	if a == EventID([]byte("a"), []byte("bc")) || a == EventID([]byte("abc")) || a == EventID([]byte("ab"), []byte("c"), nil) {
		t.Fatal("EventID parts are ambiguous")
	}
	if err := validID(a); err != nil {
		t.Fatalf("EventID gives an invalid id: %v", err)
	}
	// Ids are stable across versions: a retry after an upgrade is
	// deduplicated (EVENT-001). SHA-256 of the domain and the parts, each
	// after its length as a uvarint.
	if want := "ea0a93febc90b649fa810273edaaeeeaa41a036d796a5df1fedd517322938a67"; a != want {
		t.Fatalf("EventID = %s, want %s", a, want)
	}
	long := bytes.Repeat([]byte{7}, 300) // past the stack buffer
	if EventID(long) == EventID(long[:299]) {
		t.Fatal("EventID of a long part is ambiguous")
	}
}

// TestPublishTwiceStoredOnce_EVENT001: one id, one stored event and one
// live copy, however often it is published.
func TestPublishTwiceStoredOnce_EVENT001(t *testing.T) {
	e := setup(t)
	sub := e.live(t)
	ev := event(1, received(1))
	s1, err := Publish(e.ctx, e.js, ev)
	if err != nil {
		t.Fatal(err)
	}
	s2, err := Publish(e.ctx, e.js, ev)
	if err != nil {
		t.Fatalf("second publish: %v", err)
	}
	if s1 != s2 {
		t.Fatalf("duplicate got sequence %d, original %d", s2, s1)
	}
	subj, _ := subject.Events(tenant, client)
	if n := e.stored(t, subj); n != 1 {
		t.Fatalf("stored %d copies", n)
	}
	if _, err := sub.NextMsg(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	if m, err := sub.NextMsg(200 * time.Millisecond); err == nil {
		t.Fatalf("duplicate republished: %v", m.Header)
	}
}

// TestRepublishedDecodes: the live copy decodes into the event, its id,
// its filter facts and the sequence chain the gateway checks for gaps.
func TestRepublishedDecodes(t *testing.T) {
	e := setup(t)
	sub := e.live(t)
	dmKey := bytes.Repeat([]byte{0x42}, 32)
	evs := []Event{event(1, received(1)), event(2, received(2)), event(3, hmacUpdated())}
	evs[1].ConversationKey = dmKey
	evs[1].ReferencesOwn = true
	before := time.Now().Add(-time.Second)
	var seqs []uint64
	for i, ev := range evs {
		seq, err := Publish(e.ctx, e.js, ev)
		if err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
		seqs = append(seqs, seq)
		// Another client's event between must not appear in this chain.
		other := event(100+i, hmacUpdated())
		other.ClientID = "0a"
		if _, err := Publish(e.ctx, e.js, other); err != nil {
			t.Fatal(err)
		}
	}
	var last uint64
	for i, ev := range evs {
		m, err := sub.NextMsg(5 * time.Second)
		if err != nil {
			t.Fatal(err)
		}
		d, err := Decode(m)
		if err != nil {
			t.Fatalf("decode %d: %v", i, err)
		}
		if !d.Live || d.Tenant != tenant || d.ClientID != client || d.ID != ev.ID {
			t.Fatalf("decoded %d: %+v", i, d)
		}
		if d.Sequence != seqs[i] || d.LastSequence != last {
			t.Fatalf("decoded %d: sequence %d last %d, want %d last %d", i, d.Sequence, d.LastSequence, seqs[i], last)
		}
		if !bytes.Equal(d.ConversationKey, ev.ConversationKey) || d.ReferencesOwn != ev.ReferencesOwn {
			t.Fatalf("decoded %d: filter facts %x %v", i, d.ConversationKey, d.ReferencesOwn)
		}
		if d.Time.Before(before) || d.Time.After(time.Now().Add(time.Second)) {
			t.Fatalf("decoded %d: time %v", i, d.Time)
		}
		sameEvent(t, d.Event, *ev.Event)
		last = d.Sequence
	}
}

// TestDirectGetDecodes: the gateway's gap repair reads events with a
// batched direct get; each response decodes, the end-of-batch does not.
func TestDirectGetDecodes(t *testing.T) {
	e := setup(t)
	var evs []Event
	for i := range 3 {
		ev := event(i, received(byte(i)))
		if _, err := Publish(e.ctx, e.js, ev); err != nil {
			t.Fatal(err)
		}
		evs = append(evs, ev)
	}
	subj, _ := subject.Events(tenant, client)
	inbox := nats.NewInbox()
	sub, err := e.nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	req, _ := json.Marshal(map[string]any{"seq": 1, "next_by_subj": subj, "batch": 10})
	if err := e.nc.PublishRequest("$JS.API.DIRECT.GET."+streams.StreamEvents, inbox, req); err != nil {
		t.Fatal(err)
	}
	for i, ev := range evs {
		m, err := sub.NextMsg(5 * time.Second)
		if err != nil {
			t.Fatal(err)
		}
		d, err := Decode(m)
		if err != nil {
			t.Fatalf("decode %d: %v", i, err)
		}
		if d.Live || d.ID != ev.ID || d.Sequence != uint64(i+1) {
			t.Fatalf("decoded %d: %+v", i, d)
		}
		sameEvent(t, d.Event, *ev.Event)
	}
	eob, err := sub.NextMsg(5 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var ie *InvalidEventError
	if _, err := Decode(eob); !errors.As(err, &ie) {
		t.Fatalf("Decode(end of batch) = %v, want *InvalidEventError", err)
	}

	it, err := jetstreamext.GetBatch(e.ctx, e.js, streams.StreamEvents, 10, jetstreamext.GetBatchSeq(1), jetstreamext.GetBatchSubject(subj))
	if err != nil {
		t.Fatal(err)
	}
	i := 0
	for m, err := range it {
		if err != nil {
			t.Fatal(err)
		}
		d, err := DecodeStored(m)
		if err != nil {
			t.Fatalf("DecodeStored %d: %v", i, err)
		}
		if d.ID != evs[i].ID || d.Sequence != uint64(i+1) || d.Time.IsZero() {
			t.Fatalf("DecodeStored %d: %+v", i, d)
		}
		i++
	}
	if i != len(evs) {
		t.Fatalf("GetBatch returned %d events", i)
	}
}

func TestInvalidEventsAreRefused(t *testing.T) {
	good := event(1, received(1))
	cases := map[string]func(*Event){
		"tenant":           func(e *Event) { e.Tenant = "a.b" },
		"client id":        func(e *Event) { e.ClientID = "*" },
		"id":               func(e *Event) { e.ID = "short" },
		"event":            func(e *Event) { c := *e.Event; c.MessageReceived = nil; e.Event = &c },
		"conversation key": func(e *Event) { c := hmacUpdated(); e.Event, e.ConversationKey = &c, []byte{1} },
		"references own":   func(e *Event) { c := hmacUpdated(); e.Event, e.ReferencesOwn = &c, true },
	}
	for field, mutate := range cases {
		ev := good
		mutate(&ev)
		_, err := ev.Msg()
		var ie *InvalidEventError
		if !errors.As(err, &ie) || ie.Field != field {
			t.Errorf("%s: err = %v, want *InvalidEventError on %s", field, err, field)
		}
	}
	none := good
	none.Event = nil
	var ie *InvalidEventError
	if _, err := none.Msg(); !errors.As(err, &ie) || ie.Field != "event" {
		t.Errorf("no event: err = %v, want *InvalidEventError on event", err)
	}
	long := good
	long.ConversationKey = make([]byte, MaxConversationKeyLen+1)
	if _, err := long.Msg(); err == nil {
		t.Error("overlong conversation key accepted")
	}
	// Nothing reaches the server: Publish refuses before sending.
	e := setup(t)
	bad := good
	bad.Tenant = ""
	if _, err := Publish(e.ctx, e.js, bad); err == nil {
		t.Fatal("Publish accepted an invalid event")
	}
}

// Issue 27: a message on a live subject that a consumer delivered (a push
// consumer some role made, pointed at fabric.live.*) carries its
// acknowledgement subject as its reply; a republished copy never has a
// reply. The gateway takes only republished copies, however well their
// headers look.
func TestConsumerDeliveryOnALiveSubjectIsRefused(t *testing.T) {
	m := liveMsg(t, event(1, received(1)), 5, 4)
	if _, err := Decode(m); err != nil {
		t.Fatalf("a republished copy: %v", err)
	}
	m.Reply = "$JS.ACK.FABRIC_EVENTS.to-live.1.5.1.1700000000000000000.0"
	var ie *InvalidEventError
	if _, err := Decode(m); !errors.As(err, &ie) {
		t.Fatalf("a consumer's delivery on %s decoded: %v", m.Subject, err)
	}
}

// TestBatchFence: a group's events and checkpoint commit atomically; a
// stale checkpoint expectation, a retry of a committed batch and an
// oversized batch are refused with errors the caller can branch on.
func TestBatchFence(t *testing.T) {
	e := setup(t)
	sub := e.live(t)
	groupHex := group.String()
	ck := Checkpoint{Tenant: tenant, GroupID: groupHex, Data: []byte("state-1")}

	if seq, data, err := LastCheckpoint(e.ctx, e.js, tenant, groupHex); err != nil || seq != 0 || data != nil {
		t.Fatalf("LastCheckpoint before any = %d %q %v", seq, data, err)
	}
	first := []Event{event(1, received(1)), event(2, received(2))}
	ckSeq, err := PublishBatch(e.ctx, e.js, first, ck)
	if err != nil {
		t.Fatal(err)
	}
	if ckSeq != 3 {
		t.Fatalf("checkpoint sequence %d, want 3", ckSeq)
	}
	seq, data, err := LastCheckpoint(e.ctx, e.js, tenant, groupHex)
	if err != nil || seq != ckSeq || string(data) != "state-1" {
		t.Fatalf("LastCheckpoint = %d %q %v", seq, data, err)
	}

	// A zombie with the stale expectation.
	_, err = PublishBatch(e.ctx, e.js, []Event{event(3, received(3))}, ck)
	if !errors.Is(err, ErrFenced) {
		t.Fatalf("stale batch: %v, want ErrFenced", err)
	}
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) || apiErr.ErrorCode != jetstream.JSErrCodeStreamWrongLastSequence {
		t.Fatalf("stale batch: %v, want API error 10071 reachable", err)
	}
	// A retry of the committed batch.
	_, err = PublishBatch(e.ctx, e.js, first, ck)
	if !errors.Is(err, ErrDuplicateEvent) {
		t.Fatalf("retried batch: %v, want ErrDuplicateEvent", err)
	}
	subj, _ := subject.Events(tenant, client)
	if n := e.stored(t, subj); n != 2 {
		t.Fatalf("%d events stored after refused batches, want 2", n)
	}

	ck.ExpectedSeq, ck.Data = ckSeq, []byte("state-2")
	ckSeq2, err := PublishBatch(e.ctx, e.js, []Event{event(3, received(3))}, ck)
	if err != nil || ckSeq2 != 5 {
		t.Fatalf("current batch: %d %v", ckSeq2, err)
	}
	// Events of batches reach the live subject in order, chained.
	var last uint64
	for i := range 3 {
		m, err := sub.NextMsg(5 * time.Second)
		if err != nil {
			t.Fatal(err)
		}
		d, err := Decode(m)
		if err != nil {
			t.Fatal(err)
		}
		if d.LastSequence != last {
			t.Fatalf("live %d: last %d, want %d", i, d.LastSequence, last)
		}
		last = d.Sequence
	}

	dup := []Event{event(9, received(9)), event(9, received(9))}
	ck.ExpectedSeq = ckSeq2
	var ie *InvalidEventError
	if _, err := PublishBatch(e.ctx, e.js, dup, ck); !errors.As(err, &ie) || ie.Field != "id" {
		t.Fatalf("batch with a repeated id: %v", err)
	}
	big := make([]Event, DefaultMaxBatch)
	var tooLarge *BatchTooLargeError
	if _, err := PublishBatch(e.ctx, e.js, big, ck); !errors.As(err, &tooLarge) || tooLarge.Events != DefaultMaxBatch || tooLarge.Limit != DefaultMaxBatch {
		t.Fatalf("oversized batch: %v", err)
	}
	full := make([]Event, DefaultMaxBatch-1)
	for i := range full {
		full[i] = event(1000+i, hmacUpdated())
	}
	if _, err := PublishBatch(e.ctx, e.js, full, ck); err != nil {
		t.Fatalf("batch at the limit: %v", err)
	}
}

// Events of a batch that share one event value (a message's recipients)
// are encoded once; each stored event is still its own, with its own
// headers (EVENT-021).
func TestBatchSharedEventEncodedForEach(t *testing.T) {
	e := setup(t)
	sub := e.live(t)
	one, other := received(1), received(2)
	evs := []Event{event(1, one), event(2, one), event(3, other), event(4, one)}
	// Events 1, 2 and 4 share one event, as a message's recipients do.
	evs[1].Event, evs[3].Event = evs[0].Event, evs[0].Event
	evs[1].ReferencesOwn = true
	if _, err := PublishBatch(e.ctx, e.js, evs, Checkpoint{Tenant: tenant, GroupID: group.String(), Data: []byte("ck")}); err != nil {
		t.Fatal(err)
	}
	for i, want := range evs {
		m, err := sub.NextMsg(5 * time.Second)
		if err != nil {
			t.Fatal(err)
		}
		d, err := Decode(m)
		if err != nil {
			t.Fatal(err)
		}
		if d.ID != want.ID || d.ReferencesOwn != want.ReferencesOwn ||
			!bytes.Equal(d.Event.MessageReceived.MessageID, want.Event.MessageReceived.MessageID) {
			t.Fatalf("event %d: id %s, references own %v, message %x; want %s, %v, %x", i, d.ID, d.ReferencesOwn,
				d.Event.MessageReceived.MessageID, want.ID, want.ReferencesOwn, want.Event.MessageReceived.MessageID)
		}
	}
}

// A batch takes a set of events whole or not at all: an invalid one adds
// none of them, and their ids stay free.
func TestBatchAddEventsAllOrNothing(t *testing.T) {
	var b Batch
	if err := b.AddEvents([]Event{event(1, received(1))}); err != nil {
		t.Fatal(err)
	}
	bad := event(3, received(3))
	bad.ID = "not hex"
	var ie *InvalidEventError
	if err := b.AddEvents([]Event{event(2, received(2)), bad}); !errors.As(err, &ie) || ie.Field != "id" {
		t.Fatalf("invalid event: %v", err)
	}
	if b.Len() != 1 {
		t.Fatalf("%d messages after a refused set, want 1", b.Len())
	}
	if err := b.AddEvents([]Event{event(2, received(2))}); err != nil {
		t.Fatalf("an id of a refused set: %v", err)
	}
	if err := b.AddEvents([]Event{event(1, received(1))}); !errors.As(err, &ie) || ie.Field != "id" {
		t.Fatalf("an id already in the batch: %v", err)
	}
}

// A server whose operator raised the atomic batch limit takes a batch
// that large with WithMaxBatch, and still refuses one beyond it.
func TestPublishBatchWithRaisedLimit(t *testing.T) {
	e := setup(t)
	limit := natsserver.DefaultMaxAtomicBatch
	ck := Checkpoint{Tenant: tenant, GroupID: group.String(), Data: []byte("ck")}
	evs := make([]Event, limit-1)
	for i := range evs {
		evs[i] = event(i+1, received(1))
	}
	seq, err := PublishBatch(e.ctx, e.js, evs, ck, WithMaxBatch(limit))
	if err != nil {
		t.Fatalf("batch of %d events at a server limit of %d: %v", len(evs), limit, err)
	}
	info, err := e.js.Stream(e.ctx, streams.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	if got := info.CachedInfo().State.Msgs; got != uint64(limit) {
		t.Errorf("stream holds %d messages, want %d events and the checkpoint", got, limit)
	}
	ck.ExpectedSeq = seq
	var tooLarge *BatchTooLargeError
	over := make([]Event, limit)
	if _, err := PublishBatch(e.ctx, e.js, over, ck, WithMaxBatch(limit)); !errors.As(err, &tooLarge) || tooLarge.Limit != limit {
		t.Fatalf("batch over the raised limit: %v", err)
	}
}

func BenchmarkPublish(b *testing.B) {
	e := setup(b)
	i := 0
	for b.Loop() {
		i++
		if _, err := Publish(e.ctx, e.js, event(i, received(1))); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkPublishBatch100(b *testing.B) {
	e := setup(b)
	ck := Checkpoint{Tenant: tenant, GroupID: group.String(), Data: make([]byte, 256)}
	n := 0
	for b.Loop() {
		evs := make([]Event, 100)
		for j := range evs {
			n++
			evs[j] = event(n, received(1))
		}
		seq, err := PublishBatch(e.ctx, e.js, evs, ck)
		if err != nil {
			b.Fatal(err)
		}
		ck.ExpectedSeq = seq
	}
	b.ReportMetric(float64(b.N*100)/b.Elapsed().Seconds(), "events/s")
}

// BenchmarkDecode is the gateway's tap decoding one republished
// message.received: in a group, and in a DM, whose events carry the
// 32-byte conversation key (EVENT-020).
func BenchmarkDecode(b *testing.B) {
	dm := event(2, received(2))
	dm.ConversationKey = bytes.Repeat([]byte{0xd3}, 32)
	for _, c := range []struct {
		name string
		ev   Event
	}{{"group", event(1, received(1))}, {"dm", dm}} {
		m := liveMsg(b, c.ev, 7, 3)
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Decode(m); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkRepublishedHeaders is nats.go's parsing of a republished event's
// headers, before Decode sees the message: RePublish's five and the stored
// Nats-Msg-Id for an event published alone; an event of an atomic batch, as
// converge stores them, also keeps Nats-Batch-Id and Nats-Batch-Sequence;
// a DM's event also carries its conversation key (EVENT-020), the ninth.
func BenchmarkRepublishedHeaders(b *testing.B) {
	stored, _ := subject.Events(tenant, client)
	alone := []string{"Nats-Stream: FABRIC_EVENTS", "Nats-Subject: " + stored, "Nats-Sequence: 123456",
		"Nats-Time-Stamp: 2026-12-03T20:33:44.910823186Z", "Nats-Last-Sequence: 123000",
		"Nats-Msg-Id: " + EventID([]byte("headers"))}
	batch := append(slices.Clone(alone), "Nats-Batch-Id: yIWxcbUw9vavhSyNMmYxrl", "Nats-Batch-Sequence: 17")
	dm := append(slices.Clone(batch), HeaderConversationKey+": "+strings.Repeat("d3", 32))
	for _, c := range []struct {
		name    string
		headers []string
	}{{"alone", alone}, {"batch", batch}, {"batch-dm", dm}} {
		block := []byte("NATS/1.0\r\n" + strings.Join(c.headers, "\r\n") + "\r\n\r\n")
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := nats.DecodeHeadersMsg(block); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// liveMsg builds a message as RePublish delivers it, without a server.
func liveMsg(tb testing.TB, ev Event, seq, last uint64) *nats.Msg {
	tb.Helper()
	m, err := ev.Msg()
	if err != nil {
		tb.Fatal(err)
	}
	l, _ := subject.Live(ev.Tenant, ev.ClientID)
	stored := m.Subject
	m.Subject = l
	m.Header.Set(jetstream.StreamHeader, streams.StreamEvents)
	m.Header.Set(jetstream.SubjectHeader, stored)
	m.Header.Set(jetstream.SequenceHeader, fmt.Sprint(seq))
	m.Header.Set(jetstream.TimeStampHeaer, time.Unix(1700000000, 5).UTC().Format(time.RFC3339Nano))
	m.Header.Set(HeaderLastSequence, fmt.Sprint(last))
	return m
}

// A group's record in fabric-groups gives the conversation key an event
// not made by converge carries: the DM's key for a stitched DM's group,
// none for another group or a group without a record (EVENT-020).
func TestConversationKeyFromGroupRecord_EVENT020(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	js := natstest.Start(t).JS
	groups, err := js.KeyValue(ctx, streams.BucketGroups)
	if err != nil {
		t.Fatal(err)
	}
	dm := []byte{0xaa}
	plain := []byte{0xbb}
	dmKey := bytes.Repeat([]byte{0xd0}, 32)
	for g, rec := range map[string]map[string]any{
		"aa": {"members": []string{"c0ffee01"}, "dm_conversation_key": dmKey, "checkpoint_seq": 3},
		"bb": {"members": []string{"c0ffee01"}, "checkpoint_seq": 4},
	} {
		b, err := msgpack.Marshal(rec)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := groups.Put(ctx, "acme."+g, b); err != nil {
			t.Fatal(err)
		}
	}
	consent := func(g []byte) Event {
		return Event{Tenant: "acme", ClientID: "c0ffee01", ID: EventID(g), Event: &schema.ClientEvent{Kind: schema.KindConsentChanged,
			ConsentChanged: &schema.ConsentChanged{EntityKind: schema.ConsentEntityConversation, Entity: hex.EncodeToString(g), State: schema.ConsentDenied}}}
	}
	for _, c := range []struct {
		ev   Event
		want []byte
	}{
		{consent(dm), dmKey},
		{consent(plain), nil},
		{consent([]byte{0xcc}), nil},
		{Event{Tenant: "acme", ClientID: "c0ffee01", ID: EventID([]byte("h")), Event: &schema.ClientEvent{Kind: schema.KindHmacKeysUpdated, HmacKeysUpdated: &schema.HmacKeysUpdated{}}}, nil},
	} {
		got, err := WithConversationKey(ctx, groups, c.ev)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got.ConversationKey, c.want) {
			t.Errorf("%s: conversation key %x, want %x", c.ev.Event.Kind, got.ConversationKey, c.want)
		}
	}
}
