package operations

import (
	"bytes"
	"errors"
	"testing"

	"github.com/fabric-mls/fabric/internal/apppayload"
	"github.com/fabric-mls/fabric/internal/components"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// A send body is exactly one content, and each form becomes the app
// payload of its content type: text, reply, reaction, deletion, or another
// content type's bytes.
func TestSendBodyPayloads(t *testing.T) {
	ref := bytes.Repeat([]byte{0xab}, 32)
	text := "hi"
	ct := &schema.ContentTypeID{AuthorityID: "example.org", TypeID: "custom", VersionMajor: 2}
	good := []struct {
		name string
		body schema.SendMessage
		want apppayload.ContentType
	}{
		{"text", schema.SendMessage{Text: &text}, apppayload.TextType},
		{"reply", schema.SendMessage{Text: &text, ReplyTo: ref}, apppayload.ReplyType},
		{"reaction", schema.SendMessage{Reaction: &schema.SendReaction{Reference: ref, Emoji: "👍"}}, apppayload.ReactionType},
		{"delete", schema.SendMessage{Delete: ref}, apppayload.DeletionType},
		{"other", schema.SendMessage{ContentType: ct, Content: []byte{1, 2}}, apppayload.ContentType{AuthorityID: "example.org", TypeID: "custom", VersionMajor: 2}},
	}
	for _, c := range good {
		p, err := payload(c.body)
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if !p.ContentType.Matches(c.want) {
			t.Errorf("%s: content type %+v, want %+v", c.name, p.ContentType, c.want)
		}
		if _, err := apppayload.Encode(p); err != nil {
			t.Errorf("%s: %v", c.name, err)
		}
	}
	for name, body := range map[string]schema.SendMessage{
		"nothing":           {},
		"text and delete":   {Text: &text, Delete: ref},
		"reply_to alone":    {ReplyTo: ref},
		"reaction and text": {Text: &text, Reaction: &schema.SendReaction{Reference: ref, Emoji: "x"}},
	} {
		if _, err := payload(body); !errors.Is(err, errOneContent) {
			t.Errorf("%s: %v, want errOneContent", name, err)
		}
	}
}

// A DM names both inboxes, lower first, and never the client's own twice.
func TestDMMembers(t *testing.T) {
	a, b := "01"+string(bytes.Repeat([]byte("0"), 62)), "ff"+string(bytes.Repeat([]byte("0"), 62))
	m, err := dmMembers(b, a)
	if err != nil {
		t.Fatal(err)
	}
	if m[0].InboxID() != a || m[1].InboxID() != b {
		t.Fatalf("members %s %s", m[0].InboxID(), m[1].InboxID())
	}
	if _, err := dmMembers(a, a); err == nil {
		t.Fatal("a DM with the client's own inbox")
	}
	if _, err := patchedSet(components.Set{}, schema.ConversationChanges{Admins: []string{"zz"}}); err == nil {
		t.Fatal("an admin that is no inbox id")
	}
}
