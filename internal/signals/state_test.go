package signals

import (
	"bytes"
	"context"
	"encoding/hex"
	"net/http"
	"testing"

	"github.com/fabric-mls/fabric/internal/bus/readmodel"
	"github.com/fabric-mls/fabric/internal/clientstore"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// held is a message the test put in the read model, as converge stores
// it: the client's conversation record of the group, the message's record
// and its pointer.
type held struct {
	group, id []byte
}

// hold stores a message of group in the read model, held by client c: its
// own (sent by its installation) or another member's, in state st.
func (e *env) hold(c clientstore.ClientInfo, group, id []byte, own bool, st readmodel.MessageState) held {
	e.t.Helper()
	ctx := context.Background()
	g := hex.EncodeToString(group)
	if e.delivered == nil {
		e.delivered = map[string]uint64{}
	}
	e.delivered[c.ClientID+g]++
	n := e.delivered[c.ClientID+g]
	sender := bytes.Repeat([]byte{0xee}, 32)
	if own {
		sender = c.InstallationKey
	}
	conv := readmodel.Conversation{GroupID: group, ClientID: c.ClientID, InboxID: c.InboxID, Installation: c.InstallationKey, Delivered: n, Inboxes: 2, Installations: 2}
	msg := readmodel.Message{N: n, ID: id, GroupID: group, SenderInboxID: "someone", SenderInstallation: sender, Seq: 10 + n, SentAt: 1, State: st}
	cs, err := readmodel.ConversationSubject(tenant, g, c.ClientID)
	if err != nil {
		e.t.Fatal(err)
	}
	ms, err := readmodel.MessageSubject(tenant, g, n)
	if err != nil {
		e.t.Fatal(err)
	}
	ps, err := readmodel.PointerSubject(tenant, id)
	if err != nil {
		e.t.Fatal(err)
	}
	for _, r := range []struct {
		subj string
		v    any
	}{{ms, msg}, {ps, readmodel.Pointer{GroupID: group, N: n}}, {cs, conv}} {
		m, err := readmodel.RecordMsg(r.subj, r.v)
		if err != nil {
			e.t.Fatal(err)
		}
		if _, err := e.js.PublishMsg(ctx, m); err != nil {
			e.t.Fatal(err)
		}
	}
	return held{group: group, id: id}
}

func statusSignal(group, id []byte, prev, cur schema.MessageStatus) schema.ClientEvent {
	return schema.ClientEvent{Kind: schema.KindMessageStatusChanged, MessageStatusChanged: &schema.MessageStatusChanged{
		GroupID: group, MessageID: id, Previous: prev, Current: cur}}
}

func localDeletion(group, id []byte) schema.ClientEvent {
	return schema.ClientEvent{Kind: schema.KindMessageDeleted, MessageDeleted: &schema.MessageDeleted{
		GroupID: group, MessageID: id, Cause: schema.DeletionDeletedLocally}}
}

func msgIDOf(b byte) []byte { return bytes.Repeat([]byte{b}, 32) }

// Issue 26 item 8: message.status_changed is checked against the state it
// names: a group the client does not hold is 404 unknown_group; a message
// the client does not hold there, or one another installation sent, is
// 404 message_not_found; a transition whose previous is not the message's
// status (an own message the group holds was published) is 409
// status_conflict. Nothing is emitted for a refusal; an accepted change
// becomes the message's status, which the next signal is checked against.
func TestStatusSignalAssertsOnlyWhatHappened(t *testing.T) {
	e := newEnv(t)
	c := e.register(tenant, 20, "")
	own := e.hold(c, group, msgIDOf(0x01), true, readmodel.StateDelivered)
	theirs := e.hold(c, group, msgIDOf(0x02), false, readmodel.StateDelivered)
	elsewhere := e.hold(c, schema.Bytes{0x0f}, msgIDOf(0x03), true, readmodel.StateDelivered)
	other := e.register(tenant, 21, "") // holds nothing
	refused := []struct {
		name   string
		client string
		ev     schema.ClientEvent
		status int
		code   string
	}{
		{"group that does not exist", c.ClientID, statusSignal(schema.Bytes{0x99}, own.id, schema.StatusPublished, schema.StatusFailed), 404, "unknown_group"},
		{"group of another client", other.ClientID, statusSignal(group, own.id, schema.StatusPublished, schema.StatusFailed), 404, "unknown_group"},
		{"message never stored", c.ClientID, statusSignal(group, msgIDOf(0x7f), schema.StatusPublished, schema.StatusFailed), 404, "message_not_found"},
		{"message another installation sent", c.ClientID, statusSignal(group, theirs.id, schema.StatusPublished, schema.StatusFailed), 404, "message_not_found"},
		{"message of another group", c.ClientID, statusSignal(group, elsewhere.id, schema.StatusPublished, schema.StatusFailed), 404, "message_not_found"},
		{"previous is not its status", c.ClientID, statusSignal(group, own.id, schema.StatusUnpublished, schema.StatusPublished), 409, "status_conflict"},
	}
	for i, tc := range refused {
		r := e.postEvent(tenant, tc.client, "refused-"+string(rune('a'+i)), tc.ev)
		if r.status != tc.status || r.errCode != tc.code {
			t.Errorf("%s: %d %s %q, want %d %s", tc.name, r.status, r.errCode, r.errMsg, tc.status, tc.code)
		}
	}
	if n := len(e.signals(tenant, c.ClientID)); n != 0 {
		t.Fatalf("refused status signals emitted %d events", n)
	}
	if r := e.postEvent(tenant, c.ClientID, "fail", statusSignal(group, own.id, schema.StatusPublished, schema.StatusFailed)); r.status != 200 || r.answer.Emitted != 1 {
		t.Fatalf("published -> failed of an own message: %+v", r)
	}
	if r := e.postEvent(tenant, c.ClientID, "fail-again", statusSignal(group, own.id, schema.StatusPublished, schema.StatusFailed)); r.status != 409 || r.errCode != "status_conflict" {
		t.Fatalf("published -> failed again, the status being failed: %+v", r)
	}
	if r := e.postEvent(tenant, c.ClientID, "retry", statusSignal(group, own.id, schema.StatusFailed, schema.StatusUnpublished)); r.status != 200 || r.answer.Emitted != 1 {
		t.Fatalf("failed -> unpublished: %+v", r)
	}
	if n := len(e.signals(tenant, c.ClientID)); n != 2 {
		t.Fatalf("%d events, want 2", n)
	}
}

// Issue 26 item 8: message.deleted with cause deleted_locally is checked
// against the message it names: a group the client does not hold is 404
// unknown_group, a message it does not hold there 404 message_not_found,
// and a message already gone (deleted by its sender, deleted locally
// before) 409 already_deleted.
func TestLocalDeletionNeedsAMessageTheClientHolds(t *testing.T) {
	e := newEnv(t)
	c := e.register(tenant, 22, "")
	theirs := e.hold(c, group, msgIDOf(0x11), false, readmodel.StateDelivered)
	gone := e.hold(c, group, msgIDOf(0x12), false, readmodel.StateDeleted)
	refused := []struct {
		name   string
		ev     schema.ClientEvent
		status int
		code   string
	}{
		{"group that does not exist", localDeletion(schema.Bytes{0x99}, theirs.id), 404, "unknown_group"},
		{"message never stored", localDeletion(group, msgIDOf(0x7e)), 404, "message_not_found"},
		{"message deleted by its sender", localDeletion(group, gone.id), 409, "already_deleted"},
	}
	for i, tc := range refused {
		if r := e.postEvent(tenant, c.ClientID, "refused-"+string(rune('a'+i)), tc.ev); r.status != tc.status || r.errCode != tc.code {
			t.Errorf("%s: %d %s %q, want %d %s", tc.name, r.status, r.errCode, r.errMsg, tc.status, tc.code)
		}
	}
	if r := e.postEvent(tenant, c.ClientID, "delete", localDeletion(group, theirs.id)); r.status != 200 || r.answer.Emitted != 1 {
		t.Fatalf("local deletion of a held message: %+v", r)
	}
	if r := e.postEvent(tenant, c.ClientID, "delete-again", localDeletion(group, theirs.id)); r.status != http.StatusConflict || r.errCode != "already_deleted" {
		t.Fatalf("second local deletion: %+v", r)
	}
	got := e.signals(tenant, c.ClientID)
	if len(got) != 1 || got[0].Event.MessageDeleted == nil || !got[0].Event.MessageDeleted.MessageID.Equal(theirs.id) {
		t.Fatalf("events %+v, want one message.deleted", got)
	}
}

// Issue 26 item 8: attachment signals are checked against the key's state
// (EVENT-057 orders them per key): a download that ends without having
// started is 409 no_download (the kind table: "a download that emitted
// attachment.download_started ends"); an upload status the attachment
// already has, or a second start of a running download, is no change and
// emits nothing (EVENT-001), as a lockout the handle already has.
func TestAttachmentSignalsFollowTheKeysState(t *testing.T) {
	e := newEnv(t)
	c := e.register(tenant, 23, "")
	a := att
	steps := []struct {
		ev     schema.ClientEvent
		status int
		code   string
		emit   int
	}{
		{schema.ClientEvent{Kind: schema.KindAttachmentDownloadCompleted, AttachmentDownloadCompleted: &a}, 409, "no_download", 0},
		{schema.ClientEvent{Kind: schema.KindAttachmentDownloadFailed, AttachmentDownloadFailed: &attF}, 409, "no_download", 0},
		{schema.ClientEvent{Kind: schema.KindAttachmentDownloadStarted, AttachmentDownloadStarted: &a}, 200, "", 1},
		{schema.ClientEvent{Kind: schema.KindAttachmentDownloadStarted, AttachmentDownloadStarted: &a}, 200, "", 0},
		{schema.ClientEvent{Kind: schema.KindAttachmentDownloadCompleted, AttachmentDownloadCompleted: &a}, 200, "", 1},
		{schema.ClientEvent{Kind: schema.KindAttachmentDownloadFailed, AttachmentDownloadFailed: &attF}, 409, "no_download", 0},
		{schema.ClientEvent{Kind: schema.KindAttachmentUploadStarted, AttachmentUploadStarted: &a}, 200, "", 1},
		{schema.ClientEvent{Kind: schema.KindAttachmentUploadStarted, AttachmentUploadStarted: &a}, 200, "", 0},
		{schema.ClientEvent{Kind: schema.KindAttachmentUploadCompleted, AttachmentUploadCompleted: &a}, 200, "", 1},
		{schema.ClientEvent{Kind: schema.KindAttachmentUploadCompleted, AttachmentUploadCompleted: &a}, 200, "", 0},
	}
	emitted := 0
	for i, st := range steps {
		r := e.postEvent(tenant, c.ClientID, "att-"+string(rune('a'+i)), st.ev)
		if r.status != st.status || r.errCode != st.code || r.answer.Emitted != st.emit {
			t.Fatalf("step %d %s: %d %s emitted %d, want %d %s emitted %d", i, st.ev.Kind, r.status, r.errCode, r.answer.Emitted, st.status, st.code, st.emit)
		}
		emitted += st.emit
	}
	if n := len(e.signals(tenant, c.ClientID)); n != emitted {
		t.Fatalf("%d events, want %d", n, emitted)
	}
}
