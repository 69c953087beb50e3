package read_test

import (
	"bytes"
	"context"
	"encoding/hex"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fabric-mls/fabric/internal/allinone"
	"github.com/fabric-mls/fabric/internal/bus/readmodel"
	"github.com/fabric-mls/fabric/internal/bus/streams"
	"github.com/fabric-mls/fabric/internal/components"
	"github.com/fabric-mls/fabric/internal/testpeer"
	"github.com/fabric-mls/fabric/pkg/client"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// invited makes alice's group with bob and invites the hosted client: it
// returns alice, her and bob's views and the hosted client's Welcome.
func invited(t testing.TB, fx *fixture, set components.Set) (alice *testpeer.Peer, a, b *testpeer.Group, welcome testpeer.Message) {
	t.Helper()
	alice, _ = testpeer.New("alice")
	return invitedBy(t, fx, alice, set, fx.hosted.KeyPackages[0])
}

// invitedBy is invited with alice given and a KeyPackage of the hosted
// client's.
func invitedBy(t testing.TB, fx *fixture, alice *testpeer.Peer, set components.Set, kp []byte) (_ *testpeer.Peer, a, b *testpeer.Group, welcome testpeer.Message) {
	t.Helper()
	bob, _ := testpeer.New("bob")
	set.Admins = []components.AccountID{alice.AccountID()}
	a, err := alice.CreateGroup(set)
	if err != nil {
		t.Fatal(err)
	}
	_, joined, err := a.Add(bob)
	if err != nil {
		t.Fatal(err)
	}
	b = joined[0]
	invite, welcome, err := a.Invite(kp)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Process(invite.Transport); err != nil {
		t.Fatal(err)
	}
	return alice, a, b, welcome
}

// joinedGroup is invited, with the Welcome played and joined.
func joinedGroup(t testing.TB, fx *fixture, ch <-chan schema.ClientEvent, set components.Set) (alice *testpeer.Peer, a, b *testpeer.Group) {
	t.Helper()
	alice, a, b, welcome := invited(t, fx, set)
	fx.post(t, welcome)
	await(t, ch, schema.KindConversationJoined)
	return alice, a, b
}

// TestMETA063ExpiredMessageReadsExpired: a disappearing message reads
// delivered with its content until it expires, then expired without it,
// by id and in the conversation's pages.
func TestMETA063ExpiredMessageReadsExpired(t *testing.T) {
	t.Parallel()
	// Converge's clock stops before the message is stored and runs again
	// once it was read delivered: a busy machine processing it after its
	// expiry (1 s from when the stream stored it) would never deliver it.
	var held atomic.Int64
	fx := startWith(t, allinone.Options{ConvergeNow: heldClock(&held)})
	ch := fx.collect(t)
	ctx := context.Background()
	_, a, b := joinedGroup(t, fx, ch, components.Set{Retention: &components.RetentionState{DisappearingSecs: 1}})
	m, err := b.SendText("gone soon")
	if err != nil {
		t.Fatal(err)
	}
	held.Store(time.Now().UnixMilli())
	fx.post(t, m)
	await(t, ch, schema.KindMessageReceived)
	got, err := fx.reader.Message(ctx, fx.hosted.ClientID, m.ID)
	if err != nil || got.State != schema.MessageStateDelivered || got.Content == nil || got.ExpiresAt == 0 {
		t.Fatalf("before expiry: %+v %v", got, err)
	}
	held.Store(0)
	await(t, ch, schema.KindMessageExpired)
	got, err = fx.reader.Message(ctx, fx.hosted.ClientID, m.ID)
	if err != nil || got.State != schema.MessageStateExpired || got.Content != nil {
		t.Fatalf("after expiry: %+v %v", got, err)
	}
	p, err := fx.reader.Messages(ctx, fx.hosted.ClientID, a.ID(), client.MessageQuery{})
	if err != nil || len(p.Messages) != 1 || p.Messages[0].State != schema.MessageStateExpired || p.Messages[0].Content != nil {
		t.Fatalf("page after expiry: %+v %v", p, err)
	}
}

// TestRollbackReadsInvalidatedAndWinnerState: a message delivered on a
// branch that a deeper branch later beats reads invalidated, without its
// content, and the conversation reads the winner's components, not the
// loser's: nothing of the rolled-back branch is readable after the
// rollback's events.
func TestRollbackReadsInvalidatedAndWinnerState(t *testing.T) {
	t.Parallel()
	fx := start(t)
	ch := fx.collect(t)
	ctx := context.Background()
	alice, a, _ := joinedGroup(t, fx, ch, components.Set{Profile: &components.ProfileState{Name: "start"}})
	cA, winner := branches(t, alice, a)
	fx.post(t, cA)
	await(t, ch, schema.KindMetadataChanged)
	mA, err := a.SendText("on the branch that loses")
	if err != nil {
		t.Fatal(err)
	}
	fx.post(t, mA)
	await(t, ch, schema.KindMessageReceived)
	if c, err := fx.reader.Conversation(ctx, fx.hosted.ClientID, a.ID()); err != nil || *c.Components.GroupName != "loser" {
		t.Fatalf("before the rollback: %+v %v", c, err)
	}
	fx.post(t, winner...)
	inv := await(t, ch, schema.KindMessageInvalidated)
	if !bytes.Equal(inv.MessageInvalidated.MessageID, mA.ID) {
		t.Fatalf("invalidated %x", inv.MessageInvalidated.MessageID)
	}
	await(t, ch, schema.KindMetadataChanged)
	got, err := fx.reader.Message(ctx, fx.hosted.ClientID, mA.ID)
	if err != nil || got.State != schema.MessageStateInvalidated || got.Content != nil {
		t.Fatalf("invalidated message: %+v %v", got, err)
	}
	c, err := fx.reader.Conversation(ctx, fx.hosted.ClientID, a.ID())
	if err != nil || c.Components.GroupName == nil || *c.Components.GroupName != "winner" {
		t.Fatalf("after the rollback: %+v %v", c, err)
	}
	p, err := fx.reader.Messages(ctx, fx.hosted.ClientID, a.ID(), client.MessageQuery{})
	if err != nil || len(p.Messages) != 1 || p.Messages[0].State != schema.MessageStateInvalidated || p.Messages[0].Content != nil {
		t.Fatalf("page after the rollback: %+v %v", p, err)
	}
}

// branches forks alice's group a: it returns the commit that renames it
// "loser" on a, and the two commits of a clone of a, the first renaming
// it "winner": the deeper branch, which wins (Marmot convergence).
func branches(t testing.TB, alice *testpeer.Peer, a *testpeer.Group) (loser testpeer.Message, winner []testpeer.Message) {
	t.Helper()
	other, err := a.Clone()
	if err != nil {
		t.Fatal(err)
	}
	admins := []components.AccountID{alice.AccountID()}
	if loser, err = a.SetComponents(components.Set{Profile: &components.ProfileState{Name: "loser"}, Admins: admins}); err != nil {
		t.Fatal(err)
	}
	w1, err := other.SetComponents(components.Set{Profile: &components.ProfileState{Name: "winner"}, Admins: admins})
	if err != nil {
		t.Fatal(err)
	}
	w2, err := other.Commit()
	if err != nil {
		t.Fatal(err)
	}
	return loser, []testpeer.Message{w1, w2}
}

// TestConversationTypesPausedAndFilters: a group and a DM read with their
// type (the DM with its peer), a paused group with its floor, and the
// list's filters select by type, paused, consent and update time, newest
// activity first.
func TestConversationTypesPausedAndFilters(t *testing.T) {
	t.Parallel()
	fx := start(t)
	ch := fx.collect(t)
	ctx := context.Background()
	alice, a, b := joinedGroup(t, fx, ch, components.Set{Profile: &components.ProfileState{Name: "group"}})
	self, err := components.ParseInboxID(fx.hosted.InboxID)
	if err != nil {
		t.Fatal(err)
	}
	dmState := components.NewDM(alice.AccountID(), self)
	_, dm, _, welcome := invitedBy(t, fx, alice, components.Set{Conversation: &dmState}, fx.keyPackage(t))
	fx.post(t, welcome)
	await(t, ch, schema.KindConversationJoined)

	// A second group of the same DM: stitched to the first (EVENT-020).
	_, dm2, _, welcome2 := invitedBy(t, fx, alice, components.Set{Conversation: &dmState}, fx.keyPackage(t))
	fx.post(t, welcome2)
	await(t, ch, schema.KindConversationJoined)
	if d, err := fx.reader.Conversation(ctx, fx.hosted.ClientID, dm.ID()); err != nil || len(d.StitchedGroupIDs) != 1 || !bytes.Equal(d.StitchedGroupIDs[0], dm2.ID()) {
		t.Fatalf("DM's stitched groups: %+v %v", d.StitchedGroupIDs, err)
	}

	floor := "9.0.0"
	admins := []components.AccountID{alice.AccountID()}
	pause, err := a.SetComponents(components.Set{Profile: &components.ProfileState{Name: "group"}, Admins: admins, ProtocolFloor: &floor})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Process(pause.Transport); err != nil {
		t.Fatal(err)
	}
	fx.post(t, pause)
	await(t, ch, schema.KindConversationPaused)

	g, err := fx.reader.Conversation(ctx, fx.hosted.ClientID, a.ID())
	if err != nil || g.ConversationType != schema.ConversationGroup || g.Paused == nil || g.Paused.Floor != floor ||
		g.Paused.Reason != "protocol_version_floor" || g.Components.MinimumProtocol == nil || *g.Components.MinimumProtocol != floor {
		t.Fatalf("paused group: %+v %v", g, err)
	}
	d, err := fx.reader.Conversation(ctx, fx.hosted.ClientID, dm.ID())
	if err != nil || d.ConversationType != schema.ConversationDM || d.DMPeerInboxID != alice.InboxID() || len(d.DMConversationKey) != 32 || d.Paused != nil {
		t.Fatalf("DM: %+v %v", d, err)
	}
	fx.put(t, "/consent", map[string]string{"entity_kind": "conversation", "entity": hex.EncodeToString(dm.ID()), "state": "denied"})

	ids := func(q client.ConversationQuery) [][]byte {
		t.Helper()
		p, err := fx.reader.Conversations(ctx, fx.hosted.ClientID, q)
		if err != nil {
			t.Fatal(err)
		}
		var out [][]byte
		for _, c := range p.Conversations {
			out = append(out, c.GroupID)
		}
		return out
	}
	yes, no := true, false
	for name, c := range map[string]struct {
		q    client.ConversationQuery
		want [][]byte
	}{
		"all, newest activity first": {client.ConversationQuery{}, [][]byte{a.ID(), dm2.ID(), dm.ID()}},
		"one a page":                 {client.ConversationQuery{Page: client.Page{Limit: 1}}, [][]byte{a.ID()}},
		"dm":                         {client.ConversationQuery{Type: schema.ConversationDM}, [][]byte{dm2.ID(), dm.ID()}},
		"group":                      {client.ConversationQuery{Type: schema.ConversationGroup}, [][]byte{a.ID()}},
		"paused":                     {client.ConversationQuery{Paused: &yes}, [][]byte{a.ID()}},
		"not paused":                 {client.ConversationQuery{Paused: &no}, [][]byte{dm2.ID(), dm.ID()}},
		"denied":                     {client.ConversationQuery{ConsentState: schema.ConsentDenied}, [][]byte{dm.ID()}},
		"updated later":              {client.ConversationQuery{UpdatedSince: time.Now().Add(time.Hour)}, nil},
	} {
		if got := ids(c.q); !slices.EqualFunc(got, c.want, bytes.Equal) {
			t.Errorf("%s: %x, want %x", name, got, c.want)
		}
	}
	// Pages of two: the group and the second DM, then the first DM, the
	// last page.
	p, err := fx.reader.Conversations(ctx, fx.hosted.ClientID, client.ConversationQuery{Page: client.Page{Limit: 2}})
	if err != nil || len(p.Conversations) != 2 || p.NextCursor == "" {
		t.Fatalf("first page %+v %v", p, err)
	}
	p, err = fx.reader.Conversations(ctx, fx.hosted.ClientID, client.ConversationQuery{Page: client.Page{Limit: 2, Cursor: p.NextCursor}})
	if err != nil || len(p.Conversations) != 1 || !bytes.Equal(p.Conversations[0].GroupID, dm.ID()) || p.NextCursor != "" {
		t.Fatalf("second page %+v %v", p, err)
	}
}

// TestDroppedTenantKeyMakesContentUnreadable: deleting the tenant's
// content key (fabric-clients <tenant>.content-key) leaves its stored
// messages without readable content.
func TestDroppedTenantKeyMakesContentUnreadable(t *testing.T) {
	t.Parallel()
	fx := start(t)
	ch := fx.collect(t)
	ctx := context.Background()
	_, _, b := joinedGroup(t, fx, ch, components.Set{})
	m, err := b.SendText("sealed at rest")
	if err != nil {
		t.Fatal(err)
	}
	fx.post(t, m)
	await(t, ch, schema.KindMessageReceived)
	if got, err := fx.reader.Message(ctx, fx.hosted.ClientID, m.ID); err != nil || got.Content == nil {
		t.Fatalf("before: %+v %v", got, err)
	}
	kv, err := fx.natsAs(t, allinone.UserConverge).KeyValue(ctx, streams.BucketClients)
	if err != nil {
		t.Fatal(err)
	}
	if err := kv.Delete(ctx, allinone.DevTenant+"."+readmodel.KeySuffix); err != nil {
		t.Fatal(err)
	}
	got, err := fx.reader.Message(ctx, fx.hosted.ClientID, m.ID)
	if err != nil || got.Content != nil || got.State != schema.MessageStateDelivered {
		t.Fatalf("after the key was dropped: %+v %v", got, err)
	}
}
