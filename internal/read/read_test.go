package read_test

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"net/http"
	"slices"
	"testing"

	"github.com/fabric-mls/fabric/internal/demo"
	"github.com/fabric-mls/fabric/pkg/client"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// TestEVENT010DemoFlowReadBack plays the demo's conversation and reads
// it back through the SDK and as JSON, message by message: what every
// event pointed at is readable.
func TestEVENT010DemoFlowReadBack(t *testing.T) {
	t.Parallel()
	fx := start(t)
	ctx := context.Background()
	ch := fx.collect(t)
	flow, err := demo.NewFlow(fx.hosted)
	if err != nil {
		t.Fatal(err)
	}
	fx.post(t, flow.Join[2].Msg) // the Welcome: alice's commits before it name a group nobody hosts yet
	await(t, ch, schema.KindConversationJoined)
	for _, st := range append(flow.Talk, flow.Settle...) {
		fx.post(t, st.Msg)
	}
	await(t, ch, schema.KindMembershipChanged) // bob's leave, the last step

	c, err := fx.reader.Conversation(ctx, fx.hosted.ClientID, flow.GroupID)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(c.GroupID, flow.GroupID) || c.ConversationType != schema.ConversationGroup ||
		c.Components.GroupName == nil || *c.Components.GroupName != "demo, renamed" ||
		c.Components.Description == nil || *c.Components.Description != "a fabric demo" ||
		!slices.Equal(c.Components.AdminList, []string{flow.Alice.InboxID()}) ||
		c.Membership != schema.MembershipActive || c.Role != schema.RoleMember || c.ForkState != schema.ForkStable ||
		c.Paused != nil || c.Members.Inboxes != 2 || c.ConsentState != schema.ConsentUnknown || c.Messages != 5 {
		t.Fatalf("conversation = %+v", c)
	}
	list, err := fx.reader.Conversations(ctx, fx.hosted.ClientID, client.ConversationQuery{})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Conversations) != 1 || !bytes.Equal(list.Conversations[0].GroupID, flow.GroupID) || list.NextCursor != "" {
		t.Fatalf("conversations = %+v", list)
	}

	members, err := fx.reader.Members(ctx, fx.hosted.ClientID, flow.GroupID)
	if err != nil {
		t.Fatal(err)
	}
	var inboxes []string
	for _, m := range members.Members {
		inboxes = append(inboxes, m.InboxID)
		want := schema.RoleMember
		if m.InboxID == flow.Alice.InboxID() {
			want = schema.RoleAdmin
		}
		if m.Role != want || len(m.Installations) != 1 {
			t.Errorf("member %+v", m)
		}
	}
	wantInboxes := []string{flow.Alice.InboxID(), fx.hosted.InboxID}
	slices.Sort(wantInboxes)
	if !slices.Equal(inboxes, wantInboxes) {
		t.Fatalf("members %v, want %v (bob left)", inboxes, wantInboxes)
	}

	page, err := fx.reader.Messages(ctx, fx.hosted.ClientID, flow.GroupID, client.MessageQuery{})
	if err != nil {
		t.Fatal(err)
	}
	msgs := page.Messages
	if len(msgs) != 5 || page.NextCursor != "" {
		t.Fatalf("%d messages, cursor %q: %+v", len(msgs), page.NextCursor, msgs)
	}
	text := func(m schema.Message) string {
		if m.Content == nil || m.Content.Text == nil {
			return ""
		}
		return *m.Content.Text
	}
	hello, reply, react, oops, del := msgs[0], msgs[1], msgs[2], msgs[3], msgs[4]
	for i, m := range msgs {
		if m.DeliveryNumber != uint64(i+1) || !bytes.Equal(m.GroupID, flow.GroupID) || m.SentAt == 0 {
			t.Errorf("message %d: %+v", i, m)
		}
	}
	if !bytes.Equal(hello.MessageID, flow.Hello.ID) || hello.SenderInboxID != flow.Bob.InboxID() || text(hello) != "hello from bob" ||
		hello.State != schema.MessageStateDelivered || hello.ContentType == nil || hello.ContentType.TypeID != "text" {
		t.Errorf("hello = %+v", hello)
	}
	if !bytes.Equal(reply.MessageID, flow.Reply.ID) || reply.SenderInboxID != flow.Alice.InboxID() || reply.Content == nil ||
		reply.Content.Reply == nil || !bytes.Equal(reply.Content.Reply.Reference, flow.Hello.ID) ||
		reply.Content.Reply.Content == nil || reply.Content.Reply.Content.Text == nil || *reply.Content.Reply.Content.Text != "hi bob!" {
		t.Errorf("reply = %+v", reply)
	}
	if !bytes.Equal(react.MessageID, flow.React.ID) || react.Content == nil || react.Content.Reaction == nil ||
		!bytes.Equal(react.Content.Reaction.Reference, flow.Reply.ID) || react.Content.Reaction.Content != "👍" || react.Content.Reaction.Action != "added" {
		t.Errorf("reaction = %+v", react)
	}
	// The deleted message reads as deleted, by bob, without its content.
	if !bytes.Equal(oops.MessageID, flow.Oops.ID) || oops.State != schema.MessageStateDeleted || oops.DeletedBy != flow.Bob.InboxID() || oops.Content != nil {
		t.Errorf("deleted = %+v", oops)
	}
	if !bytes.Equal(del.MessageID, flow.Delete.ID) || del.Content == nil || del.Content.Deletion == nil || !bytes.Equal(del.Content.Deletion.MessageID, flow.Oops.ID) {
		t.Errorf("deletion = %+v", del)
	}

	// One message by id, through the SDK and as JSON: the same.
	one, err := fx.reader.Message(ctx, fx.hosted.ClientID, flow.Hello.ID)
	if err != nil || !bytes.Equal(one.MessageID, flow.Hello.ID) || text(one) != "hello from bob" {
		t.Fatalf("message %+v, %v", one, err)
	}
	var j schema.Message
	if st := fx.getJSON(t, "/messages/"+hex.EncodeToString(flow.Oops.ID), &j); st != http.StatusOK || j.State != schema.MessageStateDeleted || j.Content != nil {
		t.Fatalf("JSON message: %d %+v", st, j)
	}

	// Pages: two at a time, ascending and descending, cover the five.
	for _, desc := range []bool{false, true} {
		var got [][]byte
		q := client.MessageQuery{Page: client.Page{Limit: 2}, Descending: desc}
		for {
			p, err := fx.reader.Messages(ctx, fx.hosted.ClientID, flow.GroupID, q)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range p.Messages {
				got = append(got, m.MessageID)
			}
			if p.NextCursor == "" {
				break
			}
			q.Cursor = p.NextCursor
		}
		want := [][]byte{flow.Hello.ID, flow.Reply.ID, flow.React.ID, flow.Oops.ID, flow.Delete.ID}
		if desc {
			slices.Reverse(want)
		}
		if !slices.EqualFunc(got, want, bytes.Equal) {
			t.Errorf("descending %v: paged %x", desc, got)
		}
	}
	// Filters: content type, and sent time.
	p, err := fx.reader.Messages(ctx, fx.hosted.ClientID, flow.GroupID, client.MessageQuery{ContentTypes: []schema.ContentTypeID{{AuthorityID: "xmtp.org", TypeID: "reaction", VersionMajor: 2}}})
	if err != nil || len(p.Messages) != 1 || !bytes.Equal(p.Messages[0].MessageID, flow.React.ID) {
		t.Fatalf("reactions only: %+v %v", p, err)
	}
}

// Bad input is a 400 in the API's error shape; what the client does not
// hold is a 404; neither is ever a 5xx.
func TestReadRefusals(t *testing.T) {
	t.Parallel()
	fx := start(t)
	g := hex.EncodeToString(bytes.Repeat([]byte{7}, 32))
	m := hex.EncodeToString(bytes.Repeat([]byte{9}, 32))
	for path, want := range map[string]struct {
		status int
		code   string
	}{
		"/conversations?limit=0":                               {400, "bad_request"},
		"/conversations?limit=x":                               {400, "bad_request"},
		"/conversations?limit=501":                             {400, "bad_request"},
		"/conversations?cursor=abc":                            {400, "bad_request"},
		"/conversations?type=channel":                          {400, "bad_request"},
		"/conversations?paused=maybe":                          {400, "bad_request"},
		"/conversations?consent_state=yes":                     {400, "bad_request"},
		"/conversations?updated_since=-1":                      {400, "bad_request"},
		"/conversations/XYZ":                                   {400, "bad_request"},
		"/conversations/" + g:                                  {404, "conversation_not_found"},
		"/conversations/" + g + "/members":                     {404, "conversation_not_found"},
		"/conversations/" + g + "/messages":                    {404, "conversation_not_found"},
		"/conversations/" + g + "/messages?direction=up":       {400, "bad_request"},
		"/conversations/" + g + "/messages?content_types=text": {400, "bad_request"},
		"/conversations/" + g + "/messages?sent_after=x":       {400, "bad_request"},
		"/messages/" + m:                                       {404, "message_not_found"},
		"/messages/abc":                                        {400, "bad_request"},
		"/consent?limit=-1":                                    {400, "bad_request"},
		"/identities?cursor=0":                                 {400, "bad_request"},
	} {
		var e apiError
		if st := fx.getJSON(t, path, &e); st != want.status || e.Error.Code != want.code {
			t.Errorf("GET %s: %d %q, want %d %q", path, st, e.Error.Code, want.status, want.code)
		}
	}
	ctx := context.Background()
	if _, err := fx.reader.Conversation(ctx, fx.hosted.ClientID, bytes.Repeat([]byte{7}, 32)); !errors.Is(err, client.ErrNotFound) {
		t.Errorf("unknown conversation through the SDK: %v", err)
	}
	other := hex.EncodeToString(bytes.Repeat([]byte{1}, 32))
	if _, err := fx.reader.Conversations(ctx, other, client.ConversationQuery{}); !errors.Is(err, client.ErrNotFound) {
		t.Errorf("unknown client through the SDK: %v", err)
	}
}
