package tests

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fabric-mls/fabric/internal/components"
	"github.com/fabric-mls/fabric/internal/demo"
	"github.com/fabric-mls/fabric/internal/testpeer"
	"github.com/fabric-mls/fabric/pkg/client"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// Issue 19: POST …/conversations with one inbox's KeyPackage makes a DM.
// Through the HTTP API and the Go SDK on the all-in-one, a hosted client
// makes a DM with a real MLS peer: it joins it as created, of type dm
// (EVENT-005); the peer joins from the Welcome on the outbound subject and
// holds a DM naming both inboxes; the read API answers a dm with the peer's
// inbox (EVENT-010); texts go both ways. A body that names a DM and other
// members is refused.
func TestHostedClientMakesADMWithAPeer(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	app := startHostedApp(t, ctx)
	api, ops, reader, out := app.api, app.ops, app.reader, app.out
	h, sub := app.register(t, ctx)
	peer := ok[*testpeer.Peer](t)(testpeer.New("peer"))

	kp := ok[[]byte](t)(peer.KeyPackage())
	_, err := ops.CreateConversation(ctx, h.ClientID, "dm-and-more", schema.CreateConversation{DMKeyPackage: kp, KeyPackages: []schema.Bytes{kp}})
	var apiErr *client.APIError
	if !errors.As(err, &apiErr) || apiErr.Status != 400 {
		t.Fatalf("a DM with other members: %v, want 400", err)
	}

	created := ok[schema.OperationAccepted](t)(ops.CreateConversation(ctx, h.ClientID, "dm", schema.CreateConversation{DMKeyPackage: kp}))
	group := []byte(created.GroupID)
	j := next(t, sub, schema.KindConversationJoined).ConversationJoined
	if !bytes.Equal(j.GroupID, group) || j.Origin != schema.OriginCreated || j.ConversationType != schema.ConversationDM || j.AdderInboxID != nil {
		t.Fatalf("conversation.joined %+v, want a dm, origin created, no adder (EVENT-005, EVENT-023)", j)
	}
	wantMembership(t, sub, group, []string{peer.InboxID()}, nil)
	msgs := out.read(group, 2) // the commit, then the Welcome
	pg := ok[*testpeer.Group](t)(peer.Join(msgs[1]))
	set := ok[components.Set](t)(pg.Components())
	if set.Conversation == nil || set.Conversation.Kind != components.KindDM {
		t.Fatalf("the peer holds conversation state %+v, want a DM", set.Conversation)
	}
	operationDone(t, ctx, ops, h.ClientID, created.OperationID)
	conv := ok[schema.Conversation](t)(reader.Conversation(ctx, h.ClientID, group))
	if conv.ConversationType != schema.ConversationDM || conv.DMPeerInboxID != peer.InboxID() || len(conv.DMConversationKey) == 0 || conv.Members.Inboxes != 2 {
		t.Fatalf("the DM reads %+v, want type dm with the peer's inbox and a conversation key", conv)
	}
	wantMembers(t, reader, h.ClientID, group, h.InboxID, peer.InboxID())

	fromPeer := ok[testpeer.Message](t)(pg.SendText("hello from the peer"))
	if res := ok[[]demo.IntakeResult](t)(api.Post(ctx, fromPeer.Transport)); res[0].Status != string(schema.StatusQueued) {
		t.Fatalf("the peer's text at the intake: %+v", res)
	}
	wantReceived(t, sub, group, fromPeer.ID, peer.InboxID(), "text")
	sent := ok[schema.OperationAccepted](t)(ops.SendText(ctx, h.ClientID, group, "text", "hello from the fabric"))
	fromClient := wantPublished(t, sub, group)
	operationDone(t, ctx, ops, h.ClientID, sent.OperationID)
	if r := out.peerReads(pg, group); r.Kind != testpeer.KindApplication || !bytes.Equal(r.ID, fromClient) || text(t, r) != "hello from the fabric" {
		t.Fatalf("the peer reads %+v", r)
	}
	wantMessages(t, reader, h.ClientID, group, []sentBy{{fromPeer.ID, peer.InboxID()}, {fromClient, h.InboxID}})
}
