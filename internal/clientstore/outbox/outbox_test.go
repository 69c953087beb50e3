package outbox

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/fabric-mls/fabric/internal/bus/streams"
	"github.com/fabric-mls/fabric/internal/bus/subject"
	"github.com/fabric-mls/fabric/internal/natsserver/natstest"
	"github.com/fabric-mls/fabric/pkg/schema"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	tenant = "acme"
	client = "abcd"
)

func setup(t *testing.T) (jetstream.JetStream, jetstream.KeyValue) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	js := natstest.Start(t).JS
	kv, err := js.KeyValue(ctx, streams.BucketStores)
	if err != nil {
		t.Fatal(err)
	}
	return js, kv
}

// eventBus publishes with EventBus, conversation keys read from the
// provisioned fabric-groups bucket.
func eventBus(t *testing.T, js jetstream.JetStream) PublishFunc {
	t.Helper()
	groups, err := js.KeyValue(context.Background(), streams.BucketGroups)
	if err != nil {
		t.Fatal(err)
	}
	return EventBus(js, groups)
}

// counter is a test state: every change increments N and owes one event.
type counter struct {
	N int `msgpack:"n"`
}

func increment(cur counter, _ bool) (Change[counter], error) {
	next := counter{N: cur.N + 1}
	ev := Event{
		Tenant:   tenant,
		ClientID: client,
		ID:       ID("test", strconv.Itoa(next.N)),
		Event:    schema.ClientEvent{Kind: schema.KindArchiveRestored, ArchiveRestored: &schema.ArchiveRestored{Complete: next.N%2 == 0}},
	}
	return Change[counter]{State: next, Store: true, Events: []Event{ev}}, nil
}

func unchanged(cur counter, _ bool) (Change[counter], error) { return Change[counter]{State: cur}, nil }

// readIDs returns the Nats-Msg-Id of every event on the client's subject.
func readIDs(t *testing.T, js jetstream.JetStream) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	subj, _ := subject.Events(tenant, client)
	st, err := js.Stream(ctx, streams.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	si, err := st.Info(ctx, jetstream.WithSubjectFilter(subj))
	if err != nil {
		t.Fatal(err)
	}
	want := int(si.State.Subjects[subj])
	var ids []string
	if want == 0 {
		return nil
	}
	cons, err := js.OrderedConsumer(ctx, streams.StreamEvents, jetstream.OrderedConsumerConfig{FilterSubjects: []string{subj}})
	if err != nil {
		t.Fatal(err)
	}
	for len(ids) < want {
		b, err := cons.Fetch(want-len(ids), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for m := range b.Messages() {
			ids = append(ids, m.Headers().Get(jetstream.MsgIDHeader))
		}
	}
	return ids
}

// Writers of one key race; the events reach the stream once each, in the
// order their changes were stored (EVENT-012).
func TestConcurrentWritersEmitInStoreOrder(t *testing.T) {
	js, kv := setup(t)
	o := New(js, kv, eventBus(t, js))
	const writers, each = 4, 8
	var wg sync.WaitGroup
	for range writers {
		wg.Go(func() {
			for range each {
				if _, _, err := Apply(context.Background(), o, "acme.abcd.counter", increment); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	ids := readIDs(t, js)
	if len(ids) != writers*each {
		t.Fatalf("%d events, want %d", len(ids), writers*each)
	}
	for i, id := range ids {
		if id != ID("test", strconv.Itoa(i+1)) {
			t.Fatalf("event %d is not change %d", i, i+1)
		}
	}
	st, _, err := Get[counter](context.Background(), o, "acme.abcd.counter")
	if err != nil || st.N != writers*each {
		t.Fatalf("state %d, %v", st.N, err)
	}
}

// A change whose events could not be published is stored with them; the
// next call on the key publishes them once, with their ids.
func TestPendingEventsEmittedByNextCall(t *testing.T) {
	js, kv := setup(t)
	failing := New(js, kv, func(context.Context, Event) error { return errors.New("nats down") })
	st, evs, err := Apply(context.Background(), failing, "acme.abcd.c", increment)
	if !errors.Is(err, ErrEmit) || st.N != 1 || len(evs) != 1 {
		t.Fatalf("apply with failing publisher: %v, state %d", err, st.N)
	}
	if ids := readIDs(t, js); len(ids) != 0 {
		t.Fatal("emitted through a failing publisher")
	}
	o := New(js, kv, eventBus(t, js))
	for range 2 {
		if _, evs, err := Apply(context.Background(), o, "acme.abcd.c", unchanged); err != nil || len(evs) != 0 {
			t.Fatalf("unchanged: %v %d", err, len(evs))
		}
	}
	if err := Flush[counter](context.Background(), o, "acme.abcd.c"); err != nil {
		t.Fatal(err)
	}
	ids := readIDs(t, js)
	if len(ids) != 1 || ids[0] != ID("test", "1") {
		t.Fatalf("events %v", ids)
	}
	rec, _, _, err := load[counter](context.Background(), o, "acme.abcd.c", true)
	if err != nil || len(rec.Pending) != 0 || rec.State.N != 1 {
		t.Fatalf("record after flush: %+v %v", rec, err)
	}
}

func TestMutationErrorStoresNothing(t *testing.T) {
	js, kv := setup(t)
	o := New(js, kv, eventBus(t, js))
	boom := errors.New("refused")
	_, _, err := Apply(context.Background(), o, "acme.abcd.e", func(counter, bool) (Change[counter], error) {
		return Change[counter]{}, boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("error %v", err)
	}
	if _, found, err := Get[counter](context.Background(), o, "acme.abcd.e"); found || err != nil {
		t.Fatalf("stored after a refused mutation: %v %v", found, err)
	}
}

func TestIDSeparatesParts(t *testing.T) {
	x := "x"
	if ID("ab", "c") == ID("a", "bc") || ID("a") == ID("a", "") || ID(x) != ID(string([]byte(x))) {
		t.Fatal("ids collide or vary")
	}
}

// FuzzRecordDecode: a stored record that does not decode is an error,
// never a panic.
func FuzzRecordDecode(f *testing.F) {
	f.Add([]byte{0x82, 0xa1, 's', 0x81, 0xa1, 'n', 0x01, 0xa1, 'p', 0x90})
	f.Add([]byte{0xc1})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		var rec record[counter]
		_ = decodeRecord(b, &rec)
	})
}

// An event eventbus refuses for good is dropped, so it cannot block the
// key's later events.
func TestInvalidEventDoesNotBlockTheKey(t *testing.T) {
	js, kv := setup(t)
	o := New(js, kv, eventBus(t, js))
	_, _, err := Apply(context.Background(), o, "acme.abcd.bad", func(cur counter, _ bool) (Change[counter], error) {
		ev := Event{Tenant: tenant, ClientID: "NOT-HEX", ID: ID("bad"), Event: schema.ClientEvent{Kind: schema.KindArchiveRestored, ArchiveRestored: &schema.ArchiveRestored{}}}
		return Change[counter]{State: counter{N: 1}, Store: true, Events: []Event{ev}}, nil
	})
	if err == nil || errors.Is(err, ErrEmit) {
		t.Fatalf("error %v", err)
	}
	if _, _, err := Apply(context.Background(), o, "acme.abcd.bad", increment); err != nil {
		t.Fatal(err)
	}
	if ids := readIDs(t, js); len(ids) != 1 || ids[0] != ID("test", "2") {
		t.Fatalf("events %v", ids)
	}
}
