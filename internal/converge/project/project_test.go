package project

import (
	"bytes"
	"slices"
	"strings"
	"testing"

	"github.com/fabric-mls/fabric/internal/components"
	"github.com/fabric-mls/fabric/pkg/schema"
)

var (
	gid  = []byte{1, 2, 3}
	self = Member{InboxID: "aa", Installation: []byte{0xA1}}
)

// TestOwnMessageIsNotReceived: message.received is not emitted for a
// message whose sender installation is this installation, but is for one
// from another installation of the own inbox.
func TestOwnMessageIsNotReceived(t *testing.T) {
	if _, ok := Received(gid, self, Message{ID: []byte{9}, SenderInboxID: "aa", SenderInstallation: []byte{0xA1}}, 0); ok {
		t.Fatal("own installation's message received")
	}
	ev, ok := Received(gid, self, Message{ID: []byte{9}, SenderInboxID: "aa", SenderInstallation: []byte{0xA2}}, 0)
	if !ok || ev.MessageReceived.SenderInboxID != "aa" || !ev.MessageReceived.GroupID.Equal(gid) {
		t.Fatalf("other installation's message: %+v %v", ev, ok)
	}
}

// TestExpiredMessageIsNotReceived_META050: a message whose expiry is not
// later than the time of emission has no message.received.
func TestExpiredMessageIsNotReceived_META050(t *testing.T) {
	msg := Message{ID: []byte{9}, SenderInboxID: "bb", SenderInstallation: []byte{0xB1}, ExpiresAt: 1000}
	if _, ok := Received(gid, self, msg, 1000); ok {
		t.Fatal("received at its expiry")
	}
	if _, ok := Received(gid, self, msg, 999); !ok {
		t.Fatal("not received before its expiry")
	}
}

// TestRemovalCause_EVENT006: left exactly when the own inbox had a leave
// request; removed otherwise.
func TestRemovalCause_EVENT006(t *testing.T) {
	c := Commit{RemovedInboxIDs: []string{"aa"}, RemovedInstallations: [][]byte{{0xA1}}}
	for _, left := range []bool{false, true} {
		m := self
		m.LeaveRequested = left
		evs := CommitEvents(gid, m, c)
		if len(evs) != 2 || evs[0].Kind != schema.KindConversationRemoved || evs[1].Kind != schema.KindMembershipChanged {
			t.Fatalf("events %+v", evs)
		}
		want := schema.RemovalRemoved
		if left {
			want = schema.RemovalLeft
		}
		if evs[0].ConversationRemoved.Cause != want {
			t.Fatalf("cause %s, want %s", evs[0].ConversationRemoved.Cause, want)
		}
	}
}

// TestInstallationOnlyRemoval: removing only this installation while the
// own inbox stays a member emits conversation.removed and no
// conversation.membership_changed.
func TestInstallationOnlyRemoval(t *testing.T) {
	evs := CommitEvents(gid, self, Commit{RemovedInstallations: [][]byte{{0xA1}}})
	if len(evs) != 1 || evs[0].Kind != schema.KindConversationRemoved {
		t.Fatalf("events %+v", evs)
	}
	if evs := CommitEvents(gid, self, Commit{}); len(evs) != 0 {
		t.Fatalf("an empty commit made %d events", len(evs))
	}
}

// TestCommitEventsInKindOrder_EVENT012 checks one commit that changes
// everything: removed, membership, metadata, paused, in table order, with
// empty sequences present.
func TestCommitEventsInKindOrder_EVENT012(t *testing.T) {
	floor := "2.0"
	c := Commit{
		AddedInboxIDs:        []string{"cc"},
		RemovedInstallations: [][]byte{{0xA1}},
		Before:               components.Set{Profile: &components.ProfileState{Name: "a"}},
		After:                components.Set{Profile: &components.ProfileState{Name: "b"}, ProtocolFloor: &floor},
	}
	evs := CommitEvents(gid, self, c)
	want := []schema.EventKind{schema.KindConversationRemoved, schema.KindMembershipChanged, schema.KindMetadataChanged, schema.KindConversationPaused}
	if len(evs) != len(want) {
		t.Fatalf("events %+v", evs)
	}
	for i := range want {
		if evs[i].Kind != want[i] {
			t.Fatalf("event %d is %s, want %s", i, evs[i].Kind, want[i])
		}
		if err := evs[i].Validate(); err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
	}
	if evs[1].MembershipChanged.RemovedInboxIDs == nil {
		t.Fatal("removed_inbox_ids is absent, must be empty")
	}
	if evs[3].ConversationPaused.Floor != "2.0" {
		t.Fatal("floor")
	}
	// Already paused: no second pause.
	c.Before.ProtocolFloor = &floor
	for _, e := range CommitEvents(gid, self, c) {
		if e.Kind == schema.KindConversationPaused {
			t.Fatal("paused twice")
		}
	}
}

// TestJoinedOrigin_EVENT005_EVENT023: adder_inbox_id exactly when welcomed.
func TestJoinedOrigin_EVENT005_EVENT023(t *testing.T) {
	w := Joined(gid, components.Set{}, schema.OriginWelcomed, "bb")
	if w.ConversationJoined.AdderInboxID == nil || *w.ConversationJoined.AdderInboxID != "bb" || w.ConversationJoined.ConversationType != schema.ConversationGroup {
		t.Fatalf("%+v", w.ConversationJoined)
	}
	c := Joined(gid, components.Set{}, schema.OriginCreated, "bb")
	if c.ConversationJoined.AdderInboxID != nil {
		t.Fatal("adder set for a created group")
	}
	dm := components.NewDM(components.AccountID{1}, components.AccountID{2})
	if Joined(gid, components.Set{Conversation: &dm}, schema.OriginWelcomed, "bb").ConversationJoined.ConversationType != schema.ConversationDM {
		t.Fatal("dm type")
	}
}

func TestCompareVersions(t *testing.T) {
	for _, c := range []struct {
		a, b string
		want int
	}{{"1.0.0", "1.0.0", 0}, {"1.0", "1.0.0", 0}, {"1.0.1", "1.0.0", 1}, {"0.9", "1.0.0", -1}, {"1.10", "1.9", 1}, {"x", "1.0.0", 1}} {
		if got := CompareVersions(c.a, c.b); got != c.want {
			t.Errorf("CompareVersions(%q, %q) = %d, want %d", c.a, c.b, got, c.want)
		}
	}
}

// TestBranchSelectionEvents: fork_detected, commit_superseded and
// message_invalidated carry the payload member their kind names and
// survive the wire encoding.
func TestBranchSelectionEvents(t *testing.T) {
	digest, msg := bytes.Repeat([]byte{0xC0}, 32), bytes.Repeat([]byte{0x0E}, 32)
	withdrawn := []string{strings.Repeat("ab", 32)}
	for _, ev := range []Event{ForkDetected(gid), Superseded(gid, digest, withdrawn), Invalidated(gid, msg)} {
		b, err := ev.MarshalMsgpack()
		if err != nil {
			t.Fatalf("%s: %v", ev.Kind, err)
		}
		var back schema.ClientEvent
		if err := back.UnmarshalMsgpack(b); err != nil {
			t.Fatalf("%s: %v", ev.Kind, err)
		}
		names, ok := back.GroupID()
		if !ok || !names.Equal(gid) {
			t.Fatalf("%s names group %v", ev.Kind, names)
		}
		switch back.Kind {
		case schema.KindCommitSuperseded:
			if !back.CommitSuperseded.CommitDigest.Equal(digest) || !slices.Equal(back.CommitSuperseded.WithdrawnEventIDs, withdrawn) {
				t.Fatal("commit digest or withdrawn event ids lost")
			}
		case schema.KindMessageInvalidated:
			if !back.MessageInvalidated.MessageID.Equal(msg) {
				t.Fatal("message id lost")
			}
		case schema.KindConversationForkDetected:
		default:
			t.Fatalf("kind %s", back.Kind)
		}
	}
}
