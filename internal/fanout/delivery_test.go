package fanout

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/fabric-mls/fabric/internal/bus"
	"github.com/fabric-mls/fabric/internal/bus/streams"
	"github.com/fabric-mls/fabric/internal/clientstore"
	"github.com/fabric-mls/fabric/internal/engine"
	"github.com/fabric-mls/fabric/internal/eventually"
	"github.com/fabric-mls/fabric/pkg/client"
	"github.com/fabric-mls/fabric/pkg/schema"
	"github.com/fabric-mls/fabric/pkg/wire"
)

// A subscription whose app stopped reading, and a connection that stopped
// reading altogether, do not hold back a fast subscription: it receives
// every event, in order, while the others are full.
func TestStalledSubscriptionDoesNotDelayOthers_EVENT033(t *testing.T) {
	// The connection that never reads never answers a ping either: no ping
	// may close it while the events are published, however long that takes
	// (TestKeepaliveClosesDeadPeer closes such a connection).
	e := newEnv(t, func(c *Config) { c.PingInterval = time.Hour })
	c := e.connect(tenantA, []string{client1})
	stalled, err := c.Subscribe(context.Background(), client1, schema.EventFilter{Kinds: recvKinds})
	if err != nil {
		t.Fatal(err)
	}
	fast, err := c.Subscribe(context.Background(), client1, schema.EventFilter{Kinds: recvKinds})
	if err != nil {
		t.Fatal(err)
	}
	// A raw connection that never reads after subscribing.
	r := e.raw(token(t, tenantA, client1))
	r.subscribe(1, client1, schema.EventFilter{Kinds: recvKinds})

	// Twice the queue bound: each stalled subscription discards 1024.
	const total = 2 * 1024
	done := make(chan error, 1)
	go func() {
		for i := range total {
			ev, err := fast.Next(e.ctx)
			if err != nil {
				done <- err
				return
			}
			if msgNo(ev) != i {
				done <- fmt.Errorf("fast handoff %d is event %d", i, msgNo(ev))
				return
			}
		}
		done <- nil
	}()
	for i := range total {
		e.publish(tenantA, client1, published{ev: received(groupA, i, nil)})
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// The stalled subscriptions were full and discarded the rest.
	eventually.True(t, "discards of the stalled subscriptions", func() bool {
		return testutil.ToFloat64(e.g.metrics.discarded) >= 2*(total-1024)
	})
	if n := msgNo(next(t, stalled)); n != 0 {
		t.Fatalf("stalled subscription starts at %d", n)
	}
}

// A subscription created after an event was emitted never sees it, whether
// the client's tap already existed or not.
func TestLiveOnly_EVENT014(t *testing.T) {
	e := newEnv(t)
	// Stored before anything subscribed.
	e.publish(tenantA, client1, published{ev: received(groupA, 1, nil)})
	c := e.connect(tenantA, []string{client1})
	first, err := c.Subscribe(context.Background(), client1, schema.EventFilter{Kinds: recvKinds})
	if err != nil {
		t.Fatal(err)
	}
	e.publish(tenantA, client1, published{ev: received(groupA, 2, nil)})
	if n := msgNo(next(t, first)); n != 2 {
		t.Fatalf("first subscription's first event is %d, want 2", n)
	}
	// Event 2 has reached the gateway; a new subscription must not see it.
	second, err := c.Subscribe(context.Background(), client1, schema.EventFilter{Kinds: recvKinds})
	if err != nil {
		t.Fatal(err)
	}
	e.publish(tenantA, client1, published{ev: received(groupA, 3, nil)})
	if n := msgNo(next(t, second)); n != 3 {
		t.Fatalf("second subscription's first event is %d, want 3", n)
	}
	if n := msgNo(next(t, first)); n != 3 {
		t.Fatalf("first subscription's next event is %d, want 3", n)
	}
}

// A subscription added beside a running tap starts at the stream's last
// event, not at the tap's: events stored before it was registered whose
// republished copies had not reached the tap yet (here: lost, and repaired
// only after the subscription exists) are not handed off to it.
func TestSubscriptionBesideRunningTap_EVENT014(t *testing.T) {
	e := newEnv(t)
	c := e.connect(tenantA, []string{client1})
	first, err := c.Subscribe(context.Background(), client1, schema.EventFilter{Kinds: recvKinds})
	if err != nil {
		t.Fatal(err)
	}
	e.publish(tenantA, client1, published{ev: received(groupA, 1, nil)})
	if n := msgNo(next(t, first)); n != 1 {
		t.Fatalf("first subscription's first event is %d, want 1", n)
	}
	tp := e.cutTap(tenantA, client1)
	e.publish(tenantA, client1, published{ev: received(groupA, 2, nil)})
	e.publish(tenantA, client1, published{ev: received(groupA, 3, nil)})
	second, err := c.Subscribe(context.Background(), client1, schema.EventFilter{Kinds: recvKinds})
	if err != nil {
		t.Fatal(err)
	}
	e.restoreTap(tp)
	e.publish(tenantA, client1, published{ev: received(groupA, 4, nil)})
	if n := msgNo(next(t, second)); n != 4 {
		t.Fatalf("second subscription's first event is %d, want 4: it was stored before the subscription", n)
	}
	for want := 2; want <= 4; want++ {
		if n := msgNo(next(t, first)); n != want {
			t.Fatalf("first subscription got %d, want %d", n, want)
		}
	}
}

// Subscribing, holding and ending change nothing upstream: no stream or
// consumer is created, and the one core subscription per client is shared
// and removed with the last subscription.
func TestNoUpstreamInterest_EVENT013(t *testing.T) {
	e := newEnv(t)
	before := streamNames(t, e)
	c := e.connect(tenantA, []string{client1, client2})
	var subs []*client.Subscription
	for _, id := range []string{client1, client1, client2} {
		s, err := c.Subscribe(context.Background(), id, schema.EventFilter{Kinds: recvKinds})
		if err != nil {
			t.Fatal(err)
		}
		subs = append(subs, s)
	}
	if got := testutil.ToFloat64(e.g.metrics.taps); got != 2 {
		t.Fatalf("taps = %v, want one per client", got)
	}
	after := streamNames(t, e)
	if fmt.Sprint(before) != fmt.Sprint(after) {
		t.Fatalf("streams changed: %v -> %v", before, after)
	}
	st, err := e.js.Stream(e.ctx, streams.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Consumers != 0 {
		t.Fatalf("%d consumers on the events stream", info.State.Consumers)
	}
	for _, s := range subs {
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
	eventually.True(t, "the taps to go", func() bool { return testutil.ToFloat64(e.g.metrics.taps) == 0 })
}

func streamNames(t *testing.T, e *env) []string {
	t.Helper()
	var names []string
	l := e.js.StreamNames(e.ctx)
	for n := range l.Name() {
		names = append(names, n)
	}
	if err := l.Err(); err != nil && err != jetstream.ErrEndOfData {
		t.Fatal(err)
	}
	return names
}

// putGroupRecord writes a fabric-groups record naming the group's DM key.
func putGroupRecord(t *testing.T, e *env, tenant string, group, dmKey []byte) {
	t.Helper()
	kv, err := e.js.KeyValue(e.ctx, streams.BucketGroups)
	if err != nil {
		t.Fatal(err)
	}
	b, err := msgpack.Marshal(bus.GroupRecord{DMConversationKey: dmKey})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(e.ctx, fmt.Sprintf("%s.%x", tenant, group), b); err != nil {
		t.Fatal(err)
	}
}

// Every filter member, end to end, with a stitched DM resolved from the
// fabric-groups bucket at subscribe time.
func TestFilterMembers_EVENT020_EVENT021_EVENT022(t *testing.T) {
	e := newEnv(t)
	dmKey := []byte{0xd0, 0x0d}
	putGroupRecord(t, e, tenantA, groupA, dmKey)
	putGroupRecord(t, e, tenantA, groupB, dmKey)
	c := e.connect(tenantA, []string{client1}, client.WithJSON())
	sentinel := schema.KindHmacKeysUpdated
	subscribe := func(f schema.EventFilter) *client.Subscription {
		f.Kinds = append(f.Kinds, sentinel)
		s, err := c.Subscribe(context.Background(), client1, f)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	byGroup := subscribe(schema.EventFilter{Kinds: recvKinds, GroupIDs: []schema.Bytes{groupA}})
	byType := subscribe(schema.EventFilter{Kinds: recvKinds, ContentTypes: []schema.ContentTypeID{text}})
	byOwn := subscribe(schema.EventFilter{Kinds: recvKinds, ReferencesOwnMessages: true})
	noKinds := subscribe(schema.EventFilter{Kinds: []schema.EventKind{}})

	e.publish(tenantA, client1, published{ev: received(groupA, 1, &text)})
	e.publish(tenantA, client1, published{ev: received(groupB, 2, &reply), convKey: dmKey, refOwn: true})
	e.publish(tenantA, client1, published{ev: received(groupC, 3, nil)})
	e.publish(tenantA, client1, published{ev: schema.ClientEvent{Kind: schema.KindConsentChanged,
		ConsentChanged: &schema.ConsentChanged{EntityKind: schema.ConsentEntityConversation,
			Entity: fmt.Sprintf("%x", groupA), State: schema.ConsentAllowed}}})
	e.publish(tenantA, client1, published{ev: hmacUpdated()})

	for name, c := range map[string]struct {
		s    *client.Subscription
		want []int
	}{
		"group ids with stitched DM": {byGroup, []int{1, 2}},
		"content types":              {byType, []int{1}},
		"references own":             {byOwn, []int{2}},
		"empty kinds":                {noKinds, nil},
	} {
		var got []int
		for {
			ev := next(t, c.s)
			if ev.Kind == sentinel {
				break
			}
			got = append(got, msgNo(ev))
		}
		if fmt.Sprint(got) != fmt.Sprint(c.want) {
			t.Errorf("%s: got %v, want %v", name, got, c.want)
		}
	}
}

// A consent event the client stores emit for one group of a stitched DM is
// selected by a filter naming another group of the DM, though the DM was
// stitched after the subscription started: when it started, the group the
// filter names had no record yet. The consent event carries the DM's
// conversation key (read by the client store from fabric-groups), and the
// gateway learns that the named group joined the DM from the group's own
// event, as converge emits it.
func TestConsentThroughDMStitchedLater_EVENT020(t *testing.T) {
	e := newEnv(t)
	vault, err := engine.NewVault(make([]byte, 32))
	if err != nil {
		t.Fatal(err)
	}
	store, err := clientstore.New(e.ctx, clientstore.Config{JS: e.js, Vault: vault, Verifier: e.g.cfg.Verifier})
	if err != nil {
		t.Fatal(err)
	}
	c := e.connect(tenantA, []string{client1})
	consentKinds := []schema.EventKind{schema.KindConsentChanged}
	s, err := c.Subscribe(context.Background(), client1, schema.EventFilter{Kinds: consentKinds, GroupIDs: []schema.Bytes{groupA}})
	if err != nil {
		t.Fatal(err)
	}
	dmKey := bytes.Repeat([]byte{0xd0}, 32)
	// Converge stitches groups A and B into one DM: their records, then A's
	// event with the DM's key.
	putGroupRecord(t, e, tenantA, groupA, dmKey)
	putGroupRecord(t, e, tenantA, groupB, dmKey)
	e.publish(tenantA, client1, published{ev: schema.ClientEvent{Kind: schema.KindConversationJoined,
		ConversationJoined: &schema.ConversationJoined{GroupID: groupA, ConversationType: schema.ConversationDM, Origin: schema.OriginCreated}}, convKey: dmKey})
	consent := func(g schema.Bytes) {
		t.Helper()
		if _, err := store.SetConsent(e.ctx, tenantA, client1, clientstore.ConsentRecord{EntityKind: schema.ConsentEntityConversation,
			Entity: hex.EncodeToString(g), State: schema.ConsentAllowed}); err != nil {
			t.Fatal(err)
		}
	}
	consent(groupC) // no DM's: not selected
	consent(groupB)
	ev := next(t, s)
	if ev.Kind != schema.KindConsentChanged || ev.ConsentChanged.Entity != hex.EncodeToString(groupB) {
		t.Fatalf("got %+v, want consent.changed of group B", ev)
	}
}

// Another tenant's and another client's events are never visible: a
// subscription for a client the token does not name is refused, and a
// token's tenant decides whose subjects are read.
func TestOneClientsEvents_EVENT056(t *testing.T) {
	e := newEnv(t)
	c := e.connect(tenantA, []string{client1})
	_, err := c.Subscribe(context.Background(), client2, schema.EventFilter{Kinds: recvKinds})
	var gerr *client.GatewayError
	if !asGatewayError(err, &gerr) || gerr.Code != wire.CodeForbidden {
		t.Fatalf("subscribe to an unnamed client: %v", err)
	}
	// A token for every client of tenant A still sees only tenant A.
	all := e.connect(tenantA, []string{"*"})
	s, err := all.Subscribe(context.Background(), client1, schema.EventFilter{Kinds: recvKinds})
	if err != nil {
		t.Fatal(err)
	}
	e.publish(tenantB, client1, published{ev: received(groupA, 1, nil)})
	e.publish(tenantA, client2, published{ev: received(groupA, 2, nil)})
	e.publish(tenantA, client1, published{ev: received(groupA, 3, nil)})
	if n := msgNo(next(t, s)); n != 3 {
		t.Fatalf("got event %d of another tenant or client", n)
	}
	// SSE names the tenant and client in the path: both are checked.
	for _, path := range []string{
		"/v1/tenants/" + tenantB + "/clients/" + client1 + "/events?kinds=message.received",
		"/v1/tenants/" + tenantA + "/clients/" + client2 + "/events?kinds=message.received",
	} {
		if code := sseStatus(t, e, path, token(t, tenantA, client1)); code != 403 {
			t.Errorf("%s: status %d, want 403", path, code)
		}
	}
}

func asGatewayError(err error, target **client.GatewayError) bool {
	ge, ok := err.(*client.GatewayError)
	if ok {
		*target = ge
	}
	return ok
}
