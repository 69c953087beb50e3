package schema

import (
	"strings"
	"testing"
)

// specEnum is the spec's EventKind enum, copied from its IDL in order.
const specEnum = `"conversation.joined", "conversation.removed", "conversation.membership_changed",
  "conversation.metadata_changed", "conversation.paused", "message.received",
  "message.status_changed", "message.deleted", "message.expired", "consent.changed",
  "hmac_keys.updated", "identity.registered", "identity.own_installation_added",
  "identity.own_installation_revoked", "client.rejected_by_server", "client.lockout_changed",
  "conversation.fork_detected", "notifications.failed", "archive.restored",
  "connection.state_changed", "attachment.upload_started", "attachment.upload_completed",
  "attachment.upload_failed", "attachment.download_started", "attachment.download_completed",
  "attachment.download_failed", "attachment.deleted", "handle.changed", "lagged"`

func TestSpecKindsMatchTheIDL(t *testing.T) {
	var want []string
	for _, f := range strings.Split(specEnum, ",") {
		want = append(want, strings.Trim(strings.TrimSpace(f), `"`))
	}
	got := SpecKinds()
	if len(got) != len(want) || len(want) != 29 {
		t.Fatalf("SpecKinds has %d kinds, the IDL %d", len(got), len(want))
	}
	for i := range want {
		if string(got[i]) != want[i] {
			t.Errorf("SpecKinds[%d] = %s, want %s", i, got[i], want[i])
		}
		if got[i].Order() != i+1 || !got[i].Valid() || got[i].IsExtension() {
			t.Errorf("%s: Order %d Valid %v IsExtension %v", got[i], got[i].Order(), got[i].Valid(), got[i].IsExtension())
		}
	}
}

func TestExtensionKinds(t *testing.T) {
	all := AllKinds()
	if len(all) != 31 {
		t.Fatalf("AllKinds has %d kinds", len(all))
	}
	for i, k := range []EventKind{KindCommitSuperseded, KindMessageInvalidated} {
		if all[29+i] != k || !k.IsExtension() || !k.Valid() || k.Order() != 30+i {
			t.Errorf("%s: position, Valid, IsExtension or Order wrong", k)
		}
		if !strings.HasPrefix(string(k), "fabric.") {
			t.Errorf("%s is not in the fabric. namespace", k)
		}
	}
	if KindCommitSuperseded.Member() != "commit_superseded" || KindMessageInvalidated.Member() != "message_invalidated" {
		t.Error("extension members")
	}
}

// TestTransactionOrder_EVENT012: the events of one transaction sort by the
// kind table: a commit removing the own inbox gives conversation.removed
// before conversation.membership_changed; a deletion gives message.received
// before message.deleted.
func TestTransactionOrder_EVENT012(t *testing.T) {
	pairs := [][2]EventKind{
		{KindConversationRemoved, KindMembershipChanged},
		{KindMessageReceived, KindMessageDeleted},
		{KindConversationJoined, KindHandleChanged},
		{KindHandleChanged, KindCommitSuperseded},
	}
	for _, p := range pairs {
		if p[0].Order() >= p[1].Order() {
			t.Errorf("%s (%d) must sort before %s (%d)", p[0], p[0].Order(), p[1], p[1].Order())
		}
	}
	if EventKind("nope").Order() != 0 || EventKind("nope").Valid() || EventKind("nope").Member() != "" {
		t.Error("an unknown kind has no order, validity or member")
	}
}

// TestMembersMatchTheIDL checks the kind → member mapping against the IDL.
func TestMembersMatchTheIDL(t *testing.T) {
	want := map[EventKind]string{
		KindConversationJoined: "conversation_joined", KindConversationRemoved: "conversation_removed",
		KindMembershipChanged: "membership_changed", KindMetadataChanged: "metadata_changed",
		KindConversationPaused: "conversation_paused", KindMessageReceived: "message_received",
		KindMessageStatusChanged: "message_status_changed", KindMessageDeleted: "message_deleted",
		KindMessageExpired: "message_expired", KindConsentChanged: "consent_changed",
		KindHmacKeysUpdated: "hmac_keys_updated", KindIdentityRegistered: "identity_registered",
		KindOwnInstallationAdded: "own_installation_added", KindOwnInstallationRevoked: "own_installation_revoked",
		KindRejectedByServer: "rejected_by_server", KindLockoutChanged: "lockout_changed",
		KindConversationForkDetected: "conversation_fork_detected", KindNotificationsFailed: "notifications_failed",
		KindArchiveRestored: "archive_restored", KindConnectionStateChanged: "connection_state_changed",
		KindAttachmentUploadStarted: "attachment_upload_started", KindAttachmentUploadCompleted: "attachment_upload_completed",
		KindAttachmentUploadFailed: "attachment_upload_failed", KindAttachmentDownloadStarted: "attachment_download_started",
		KindAttachmentDownloadCompleted: "attachment_download_completed", KindAttachmentDownloadFailed: "attachment_download_failed",
		KindAttachmentDeleted: "attachment_deleted", KindHandleChanged: "handle_changed", KindLagged: "lagged",
	}
	for k, m := range want {
		if k.Member() != m {
			t.Errorf("%s.Member() = %s, want %s", k, k.Member(), m)
		}
	}
}

// TestNamesAGroup_EVENT020 covers the spec's term "names a group".
func TestNamesAGroup_EVENT020(t *testing.T) {
	named := map[string]bool{
		"conversation.joined-created": true, "conversation.removed": true, "conversation.membership_changed": true,
		"conversation.metadata_changed": true, "conversation.paused": true, "message.received": true,
		"message.status_changed": true, "message.deleted": true, "message.expired": true,
		"consent.changed-conversation": true, "conversation.fork_detected": true,
		"fabric.commit_superseded": true, "fabric.message_invalidated": true,
	}
	for _, s := range sampleEvents() {
		id, ok := s.ev.GroupID()
		_, want := named[s.name]
		if s.name == "conversation.joined-welcomed" || s.name == "message.received-untyped" {
			want = true
		}
		if ok != want {
			t.Errorf("%s: names a group = %v, want %v", s.name, ok, want)
			continue
		}
		if ok && !id.Equal(sampleGroup) {
			t.Errorf("%s: group = %x, want %x", s.name, id, sampleGroup)
		}
	}
	bad := ClientEvent{Kind: KindConsentChanged, ConsentChanged: &ConsentChanged{
		EntityKind: ConsentEntityConversation, Entity: "XYZ", State: ConsentAllowed}}
	if _, ok := bad.GroupID(); ok {
		t.Error("a conversation entity that is not lowercase hex names no group")
	}
}

// TestContentTypeMatches_CTYPE001: authority, type and major version match;
// the minor version is not part of the id.
func TestContentTypeMatches_CTYPE001(t *testing.T) {
	a := ContentTypeID{AuthorityID: "xmtp.org", TypeID: "text", VersionMajor: 1}
	for _, c := range []struct {
		b    ContentTypeID
		want bool
	}{
		{a, true},
		{ContentTypeID{AuthorityID: "xmtp.org", TypeID: "text", VersionMajor: 2}, false},
		{ContentTypeID{AuthorityID: "xmtp.org", TypeID: "reply", VersionMajor: 1}, false},
		{ContentTypeID{AuthorityID: "example.com", TypeID: "text", VersionMajor: 1}, false},
	} {
		if a.Matches(c.b) != c.want {
			t.Errorf("%+v.Matches(%+v) = %v", a, c.b, !c.want)
		}
	}
}

func TestFilterHasKind(t *testing.T) {
	f := EventFilter{Kinds: []EventKind{KindMessageReceived}}
	if !f.HasKind(KindMessageReceived) || f.HasKind(KindLagged) {
		t.Error("HasKind")
	}
	// No kinds: every kind (issue 28); an empty list: none (EVENT-020).
	if !(EventFilter{}).HasKind(KindConsentChanged) || (EventFilter{}).HasKind("message.sent") {
		t.Error("HasKind of a filter without kinds")
	}
	if (EventFilter{Kinds: []EventKind{}}).HasKind(KindConsentChanged) {
		t.Error("HasKind of a filter with an empty kinds list")
	}
}
