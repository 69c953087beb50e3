package read_test

import (
	"bytes"
	"context"
	"testing"

	"github.com/fabric-mls/fabric/internal/components"
	"github.com/fabric-mls/fabric/internal/testpeer"
	"github.com/fabric-mls/fabric/pkg/client"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// invited makes alice's group with bob and invites the hosted client: it
// returns alice, her and bob's views and the hosted client's Welcome.
func invited(t *testing.T, fx *fixture, set components.Set) (alice *testpeer.Peer, a, b *testpeer.Group, welcome testpeer.Message) {
	t.Helper()
	alice, _ = testpeer.New("alice")
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
	invite, welcome, err := a.Invite(fx.hosted.KeyPackages[0])
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Process(invite.Transport); err != nil {
		t.Fatal(err)
	}
	return alice, a, b, welcome
}

// joinedGroup is invited, with the Welcome played and joined.
func joinedGroup(t *testing.T, fx *fixture, ch <-chan schema.ClientEvent, set components.Set) (alice *testpeer.Peer, a, b *testpeer.Group) {
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
	fx := start(t)
	ch := fx.collect(t)
	ctx := context.Background()
	_, a, b := joinedGroup(t, fx, ch, components.Set{Retention: &components.RetentionState{DisappearingSecs: 1}})
	m, err := b.SendText("gone soon")
	if err != nil {
		t.Fatal(err)
	}
	fx.post(t, m)
	await(t, ch, schema.KindMessageReceived)
	got, err := fx.reader.Message(ctx, fx.hosted.ClientID, m.ID)
	if err != nil || got.State != schema.MessageStateDelivered || got.Content == nil || got.ExpiresAt == 0 {
		t.Fatalf("before expiry: %+v %v", got, err)
	}
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
	fx := start(t)
	ch := fx.collect(t)
	ctx := context.Background()
	alice, a, _ := joinedGroup(t, fx, ch, components.Set{Profile: &components.ProfileState{Name: "start"}})
	other, err := a.Clone()
	if err != nil {
		t.Fatal(err)
	}
	admins := []components.AccountID{alice.AccountID()}
	cA, err := a.SetComponents(components.Set{Profile: &components.ProfileState{Name: "loser"}, Admins: admins})
	if err != nil {
		t.Fatal(err)
	}
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
	cB1, err := other.SetComponents(components.Set{Profile: &components.ProfileState{Name: "winner"}, Admins: admins})
	if err != nil {
		t.Fatal(err)
	}
	cB2, err := other.Commit()
	if err != nil {
		t.Fatal(err)
	}
	fx.post(t, cB1, cB2)
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
