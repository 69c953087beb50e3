package converge

import (
	"bytes"
	"flag"
	"slices"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/fabric-mls/fabric/internal/bus"
	"github.com/fabric-mls/fabric/internal/components"
	"github.com/fabric-mls/fabric/internal/natsserver/natstest"
	"github.com/fabric-mls/fabric/internal/testpeer"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// testsAtOnce is how many of the package's tests run at once unless
// -test.parallel says otherwise: they wait on NATS and on convergence
// passes' timers (docs/convergence.md) far more than they compute, so more
// than the CPUs (the default) keeps the package's wall time down.
const testsAtOnce = "4"

func TestMain(m *testing.M) {
	natstest.ServeChild() // -converge-server-cpus
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set {
		if err := flag.Set("test.parallel", testsAtOnce); err != nil {
			panic(err)
		}
	}
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/nats-io/nats-server/v2/server.(*Server).Start.func1"))
}

func must[T any](t testing.TB) func(T, error) T {
	return func(v T, err error) T {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}

func peer(t testing.TB, name string) *testpeer.Peer {
	return must[*testpeer.Peer](t)(testpeer.New(name))
}

// process hands a message to remote members, as the transport would.
func process(t *testing.T, m testpeer.Message, groups ...*testpeer.Group) {
	t.Helper()
	for _, g := range groups {
		if _, err := g.Process(m.Transport); err != nil {
			t.Fatal(err)
		}
	}
}

func leafOf(t *testing.T, g *testpeer.Group, installation []byte) uint32 {
	t.Helper()
	for _, m := range g.Members() {
		if bytes.Equal(m.InstallationKey, installation) {
			return m.Leaf
		}
	}
	t.Fatal("no such leaf")
	return 0
}

func str(s string) *string { return &s }

// TestThreeHostedMembersEachOwnStream runs one group with three hosted members
// through every convergence event kind and checks each member's own stream:
// origin and adder (EVENT-005, EVENT-023), its own installation's message
// not received by it and received by the others, received messages with their
// group, content type and sender (EVENT-018, EVENT-024), references to own
// messages (EVENT-021), a deletion as received then deleted in kind-table
// order (EVENT-012), metadata names (EVENT-019), the pause, removal of only
// this installation without membership_changed, and the removal cause left
// exactly after a leave request of the own inbox (EVENT-006).
func TestThreeHostedMembersEachOwnStream(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	alice := peer(t, "alice")
	u1, u2, u3 := peer(t, "u1"), peer(t, "u2"), peer(t, "u3")
	h1, h3 := e.register(u1.AccountID(), 1), e.register(u3.AccountID(), 1)
	// h2's installation also lives on an app device that sends.
	dev2, h2 := newDevice(t, e, u2.AccountID())
	// Remote installations of the inboxes of h1 and h3.
	h1b := must[*testpeer.Peer](t)(u1.NewInstallation("u1-phone"))
	h3b := must[*testpeer.Peer](t)(u3.NewInstallation("u3-phone"))
	e.worker("w1", nil)

	ga := must[*testpeer.Group](t)(alice.CreateGroup(components.Set{
		Profile:      &components.ProfileState{Name: "g"},
		Admins:       []components.AccountID{alice.AccountID()},
		Conversation: &components.ConversationState{Kind: components.KindGroup},
	}))
	kp1b := must[[]byte](t)(h1b.KeyPackage())
	kp3b := must[[]byte](t)(h3b.KeyPackage())
	_, welcome, err := ga.Invite(h1.kps[0], h2.kps[0], h3.kps[0], kp1b, kp3b)
	if err != nil {
		t.Fatal(err)
	}
	g1b := must[*testpeer.Group](t)(h1b.Join(welcome.Transport))
	g3b := must[*testpeer.Group](t)(h3b.Join(welcome.Transport))
	dev2.join(t, welcome)
	e.publish(welcome)

	m1 := must[testpeer.Message](t)(ga.SendText("hi"))
	e.publish(m1)
	own2 := dev2.send(t, "sent by h2's own installation")
	e.publish(own2)
	m2 := must[testpeer.Message](t)(g1b.SendText("from u1's phone"))
	e.publish(m2)
	m3 := must[testpeer.Message](t)(ga.SendReply(m2.ID, "re"))
	e.publish(m3)
	m4 := must[testpeer.Message](t)(ga.SendText("oops"))
	e.publish(m4)
	m5 := must[testpeer.Message](t)(ga.SendDelete(m4.ID))
	e.publish(m5)

	c2 := must[testpeer.Message](t)(ga.SetComponents(components.Set{
		Profile:       &components.ProfileState{Name: "g2"},
		Admins:        []components.AccountID{alice.AccountID()},
		Conversation:  &components.ConversationState{Kind: components.KindGroup},
		ProtocolFloor: str("9.0.0"),
	}))
	process(t, c2, g1b, g3b)
	e.publish(c2)

	leave := must[testpeer.Message](t)(g3b.Leave())
	process(t, leave, ga, g1b)
	e.publish(leave)
	c3 := must[testpeer.Message](t)(ga.Commit())
	process(t, c3, g1b)
	e.publish(c3)

	c4 := must[testpeer.Message](t)(ga.RemoveLeaves(leafOf(t, ga, h1.rec.InstallationKey)))
	process(t, c4, g1b)
	e.publish(c4)

	c5 := must[testpeer.Message](t)(ga.Remove(u2.InboxID(), u3.InboxID()))
	e.publish(c5)

	gid := schema.Bytes(ga.ID())
	text := &schema.ContentTypeID{AuthorityID: "xmtp.org", TypeID: "text", VersionMajor: 1}
	reply := &schema.ContentTypeID{AuthorityID: "xmtp.org", TypeID: "reply", VersionMajor: 1}
	del := &schema.ContentTypeID{AuthorityID: "xmtp.org", TypeID: "deleteMessage", VersionMajor: 1}
	received := func(id []byte, ct *schema.ContentTypeID, sender string) schema.ClientEvent {
		return schema.ClientEvent{Kind: schema.KindMessageReceived, MessageReceived: &schema.MessageReceived{GroupID: gid, MessageID: id, ContentType: ct, SenderInboxID: sender}}
	}
	common := []schema.ClientEvent{
		{Kind: schema.KindConversationJoined, ConversationJoined: &schema.ConversationJoined{GroupID: gid, ConversationType: schema.ConversationGroup, Origin: schema.OriginWelcomed, AdderInboxID: str(alice.InboxID())}},
		received(m1.ID, text, alice.InboxID()),
		received(m2.ID, text, u1.InboxID()),
		received(m3.ID, reply, alice.InboxID()),
		received(m4.ID, text, alice.InboxID()),
		received(m5.ID, del, alice.InboxID()),
		{Kind: schema.KindMessageDeleted, MessageDeleted: &schema.MessageDeleted{GroupID: gid, MessageID: m4.ID, Cause: schema.DeletionDeleted}},
		{Kind: schema.KindMetadataChanged, MetadataChanged: &schema.MetadataChanged{GroupID: gid, Changed: components.Diff(
			components.Set{Profile: &components.ProfileState{Name: "g"}},
			components.Set{Profile: &components.ProfileState{Name: "g2"}, ProtocolFloor: str("9.0.0")})}},
		{Kind: schema.KindConversationPaused, ConversationPaused: &schema.ConversationPaused{GroupID: gid, Floor: "9.0.0"}},
	}
	removed := func(cause schema.RemovalCause) schema.ClientEvent {
		return schema.ClientEvent{Kind: schema.KindConversationRemoved, ConversationRemoved: &schema.ConversationRemoved{GroupID: gid, Cause: cause}}
	}
	membership := schema.ClientEvent{Kind: schema.KindMembershipChanged, MembershipChanged: &schema.MembershipChanged{
		GroupID: gid, AddedInboxIDs: []string{}, RemovedInboxIDs: sortedStrings(u2.InboxID(), u3.InboxID())}}

	// Everyone but h2 receives h2's own message, after m1.
	withOwn := slices.Insert(slices.Clone(common), 2, received(own2.ID, text, u2.InboxID()))
	want := map[string][]schema.ClientEvent{
		// h1's installation alone is removed while its inbox stays: no
		// membership_changed.
		h1.rec.ClientID: append(slices.Clone(withOwn), removed(schema.RemovalRemoved)),
		h2.rec.ClientID: append(slices.Clone(common), removed(schema.RemovalRemoved), membership),
		// u3's phone published a leave request of the inbox (EVENT-006).
		h3.rec.ClientID: append(slices.Clone(withOwn), removed(schema.RemovalLeft), membership),
	}
	for client, w := range want {
		got := e.waitEvents(client, len(w))
		for i := range w {
			if !sameEvent(got[i].Event, w[i]) {
				t.Errorf("client %.8s event %d:\n got  %+v\n want %+v", client, i, describe(got[i].Event), describe(w[i]))
			}
			if len(got[i].ConversationKey) != 0 {
				t.Errorf("event %d of a group carries a conversation key", i)
			}
			// EVENT-021: m3 replies to u1's m2.
			wantRef := w[i].MessageReceived != nil && w[i].MessageReceived.MessageID.Equal(m3.ID) && client == h1.rec.ClientID
			if got[i].ReferencesOwn != wantRef {
				t.Errorf("client %.8s event %d: references own %v, want %v", client, i, got[i].ReferencesOwn, wantRef)
			}
		}
	}
	for _, m := range []testpeer.Message{welcome, m1, m5, c2, leave, c3, c5} {
		if o := e.settledOutcome(m.ID); o.Disposition != schema.DispositionAccepted || o.Status != schema.StatusQueued {
			t.Errorf("outcome %+v, want accepted", o)
		}
	}
}

func sortedStrings(s ...string) []string { slices.Sort(s); return s }

func sameEvent(a, b schema.ClientEvent) bool {
	x, err1 := a.MarshalMsgpack()
	y, err2 := b.MarshalMsgpack()
	return err1 == nil && err2 == nil && bytes.Equal(x, y)
}

func describe(e schema.ClientEvent) string {
	b, _ := e.MarshalJSON()
	return string(b)
}

var _ = bus.Delivered{}
var _ = time.Second
