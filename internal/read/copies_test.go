package read_test

import (
	"context"
	"encoding/hex"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fabric-mls/fabric/internal/allinone"
	"github.com/fabric-mls/fabric/internal/bus/streams"
	"github.com/fabric-mls/fabric/internal/components"
	"github.com/fabric-mls/fabric/internal/eventually"
	"github.com/fabric-mls/fabric/pkg/client"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// copyReads is how many times each page is read past the copy behind.
const copyReads = 20

// copyBehind adds a mirror of stream that answers its direct gets
// (MirrorDirect) and holds only what filter matches: a copy that is behind
// on everything else, as a replica of a replicated stream can be.
// It returns a wait for the copy to hold a message: from then on it
// answers the stream's direct gets.
func copyBehind(t *testing.T, js jetstream.JetStream, stream, filter string) (await func()) {
	t.Helper()
	cfg := jetstream.StreamConfig{Name: "BEHIND_" + stream, Mirror: &jetstream.StreamSource{Name: stream, FilterSubject: filter},
		MirrorDirect: true, AllowMsgTTL: true, Storage: jetstream.MemoryStorage}
	create := func() uint64 {
		t.Helper()
		// Creating it again as it is answers its state.
		s, err := js.CreateStream(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		return s.CachedInfo().State.Msgs
	}
	create()
	return func() {
		t.Helper()
		eventually.True(t, "the copy of "+stream+" holds something", func() bool { return create() > 0 })
	}
}

// TestEVENT010PagesReadPastACopyBehind: a page is read by batched direct
// get, which any copy of the stream may answer (a replica, or a mirror
// with MirrorDirect), and a copy may be behind the leader. With a copy of
// FABRIC_EVENTS that holds none of the client's records and one of
// fabric-stores that holds none of its consent, the pages read once the
// event arrived still hold the change, every time, and so does the
// conversation's consent_state, a single key of the client store.
func TestEVENT010PagesReadPastACopyBehind(t *testing.T) {
	t.Parallel()
	// No role may make a mirror (issue 27): the copies are the operator's.
	const pw = "operator-password"
	fx := startWith(t, allinone.Options{OperatorUsers: []*server.User{{Username: "operator", Password: pw}}})
	ch := fx.collect(t)
	ctx := context.Background()
	nc, err := nats.Connect(fx.f.NATSURL, nats.UserInfo("operator", pw))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	operator, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	_, a, _ := joinedGroup(t, fx, ch, components.Set{Profile: &components.ProfileState{Name: "g"}})
	gid := hex.EncodeToString(a.ID())
	fx.put(t, "/consent", map[string]string{"entity_kind": "conversation", "entity": gid, "state": "allowed"})
	await(t, ch, schema.KindConsentChanged)
	eventsCopy := copyBehind(t, operator, streams.StreamEvents, "fabric.ev.>")
	storesCopy := copyBehind(t, operator, streams.KVStream(streams.BucketStores), streams.KVSubject(streams.BucketStores, "probe"))
	kv, err := fx.natsAs(t, allinone.UserAPI).KeyValue(ctx, streams.BucketStores)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "probe", []byte("x")); err != nil {
		t.Fatal(err)
	}
	storesCopy()
	// A message: its event primes the copy of FABRIC_EVENTS, which holds
	// none of the records converge stored with it.
	m, err := a.SendText("after the copy")
	if err != nil {
		t.Fatal(err)
	}
	fx.post(t, m)
	await(t, ch, schema.KindMessageReceived)
	eventsCopy()
	for i := range copyReads {
		l, err := fx.reader.Conversations(ctx, fx.hosted.ClientID, client.ConversationQuery{})
		if err != nil || len(l.Conversations) != 1 || hex.EncodeToString(l.Conversations[0].GroupID) != gid || l.Conversations[0].Messages != 1 {
			t.Fatalf("read %d: conversations %+v %v", i, l, err)
		}
	}
	// A consent change stored past the copy (the store reads its key from
	// the leader: its compare-and-set fails against a copy behind), read
	// as a page and as the conversation's consent_state.
	fx.put(t, "/consent", map[string]string{"entity_kind": "conversation", "entity": gid, "state": "denied"})
	await(t, ch, schema.KindConsentChanged)
	for i := range copyReads {
		c, err := fx.reader.Consent(ctx, fx.hosted.ClientID, client.Page{})
		if err != nil || len(c.Consent) != 1 || c.Consent[0].State != schema.ConsentDenied {
			t.Fatalf("read %d: consent %+v %v", i, c, err)
		}
		conv, err := fx.reader.Conversation(ctx, fx.hosted.ClientID, a.ID())
		if err != nil || conv.ConsentState != schema.ConsentDenied {
			t.Fatalf("read %d: the conversation's consent %q %v", i, conv.ConsentState, err)
		}
	}
}
