package schema

import (
	"bytes"
	"strings"
	"time"
)

func fill(n int, b byte) Bytes { return Bytes(bytes.Repeat([]byte{b}, n)) }

func strp(s string) *string { return &s }

var (
	sampleGroup   = Bytes{0x6a, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x0e, 0x0f}
	sampleMessage = fill(32, 0xab)
	sampleInbox   = "0e9c8d5ba6fd8dbbd0f0ab3c7e6ee1f2a3b4c5d6e7f8091a2b3c4d5e6f708192"
	sampleOther   = "5b4d3c2a1908f7e6d5c4b3a29180f7e6d5c4b3a29180f7e6d5c4b3a29180f7e6"
	sampleKey     = fill(32, 0x11)
	sampleDigest  = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
)

// sampleEvent is one valid event per golden file; names are file names.
type sampleEvent struct {
	name string
	ev   ClientEvent
}

// sampleEvents returns at least one valid event of every kind, and the
// variants of optional members.
func sampleEvents() []sampleEvent {
	att := &AttachmentRef{AttachmentKey: "att-7f3a", URL: "https://files.example/a/7f3a", ContentDigest: sampleDigest}
	failed := &AttachmentFailed{AttachmentKey: "att-7f3a", URL: "https://files.example/a/7f3a", ContentDigest: sampleDigest, Cause: "network"}
	return []sampleEvent{
		{"conversation.joined-created", ClientEvent{Kind: KindConversationJoined, ConversationJoined: &ConversationJoined{
			GroupID: sampleGroup, ConversationType: ConversationGroup, Origin: OriginCreated}}},
		{"conversation.joined-welcomed", ClientEvent{Kind: KindConversationJoined, ConversationJoined: &ConversationJoined{
			GroupID: sampleGroup, ConversationType: ConversationDM, Origin: OriginWelcomed, AdderInboxID: strp(sampleOther)}}},
		{"conversation.removed", ClientEvent{Kind: KindConversationRemoved, ConversationRemoved: &ConversationRemoved{
			GroupID: sampleGroup, Cause: RemovalLeft}}},
		{"conversation.membership_changed", ClientEvent{Kind: KindMembershipChanged, MembershipChanged: &MembershipChanged{
			GroupID: sampleGroup, AddedInboxIDs: []string{sampleOther}, RemovedInboxIDs: []string{}}}},
		{"conversation.metadata_changed", ClientEvent{Kind: KindMetadataChanged, MetadataChanged: &MetadataChanged{
			GroupID: sampleGroup, Changed: []string{"group_name", "admin_list", "component:f00a"}}}},
		{"conversation.paused", ClientEvent{Kind: KindConversationPaused, ConversationPaused: &ConversationPaused{
			GroupID: sampleGroup, Floor: "1.2.0"}}},
		{"message.received", ClientEvent{Kind: KindMessageReceived, MessageReceived: &MessageReceived{
			GroupID: sampleGroup, MessageID: sampleMessage,
			ContentType:   &ContentTypeID{AuthorityID: "xmtp.org", TypeID: "text", VersionMajor: 1},
			SenderInboxID: sampleOther}}},
		{"message.received-untyped", ClientEvent{Kind: KindMessageReceived, MessageReceived: &MessageReceived{
			GroupID: sampleGroup, MessageID: sampleMessage, SenderInboxID: sampleOther}}},
		{"message.status_changed", ClientEvent{Kind: KindMessageStatusChanged, MessageStatusChanged: &MessageStatusChanged{
			GroupID: sampleGroup, MessageID: sampleMessage, Previous: StatusUnpublished, Current: StatusPublished}}},
		{"message.deleted", ClientEvent{Kind: KindMessageDeleted, MessageDeleted: &MessageDeleted{
			GroupID: sampleGroup, MessageID: sampleMessage, Cause: DeletionDeletedLocally}}},
		{"message.expired", ClientEvent{Kind: KindMessageExpired, MessageExpired: &MessageRef{
			GroupID: sampleGroup, MessageID: sampleMessage}}},
		{"consent.changed-conversation", ClientEvent{Kind: KindConsentChanged, ConsentChanged: &ConsentChanged{
			EntityKind: ConsentEntityConversation, Entity: sampleGroup.String(), State: ConsentAllowed}}},
		{"consent.changed-inbox", ClientEvent{Kind: KindConsentChanged, ConsentChanged: &ConsentChanged{
			EntityKind: ConsentEntityInbox, Entity: sampleOther, State: ConsentDenied}}},
		{"hmac_keys.updated", ClientEvent{Kind: KindHmacKeysUpdated, HmacKeysUpdated: &HmacKeysUpdated{}}},
		{"identity.registered", ClientEvent{Kind: KindIdentityRegistered, IdentityRegistered: &IdentityRegistered{
			InboxID: sampleInbox, InstallationKey: sampleKey}}},
		{"identity.own_installation_added", ClientEvent{Kind: KindOwnInstallationAdded, OwnInstallationAdded: &InstallationRef{
			InstallationKey: sampleKey}}},
		{"identity.own_installation_revoked", ClientEvent{Kind: KindOwnInstallationRevoked, OwnInstallationRevoked: &InstallationRevoked{
			InstallationKey: sampleKey, IsThisInstallation: true}}},
		{"client.rejected_by_server-backend", ClientEvent{Kind: KindRejectedByServer, RejectedByServer: &ClientRejectedByServer{
			Cause: RejectionBackendMismatch}}},
		{"client.rejected_by_server-version", ClientEvent{Kind: KindRejectedByServer, RejectedByServer: &ClientRejectedByServer{
			Cause: RejectionVersionTooOld, MinLibxmtpVersion: strp("1.4.0")}}},
		{"client.lockout_changed", ClientEvent{Kind: KindLockoutChanged, LockoutChanged: &LockoutChanged{Change: LockoutEntered}}},
		{"conversation.fork_detected", ClientEvent{Kind: KindConversationForkDetected, ConversationForkDetected: &GroupRef{GroupID: sampleGroup}}},
		{"notifications.failed", ClientEvent{Kind: KindNotificationsFailed, NotificationsFailed: &NotificationsFailed{Cause: "token_expired"}}},
		{"archive.restored", ClientEvent{Kind: KindArchiveRestored, ArchiveRestored: &ArchiveRestored{Complete: false}}},
		{"connection.state_changed", ClientEvent{Kind: KindConnectionStateChanged, ConnectionStateChanged: &ConnectionStateChanged{
			Previous: ConnectionConnecting, Current: ConnectionConnected}}},
		{"attachment.upload_started", ClientEvent{Kind: KindAttachmentUploadStarted, AttachmentUploadStarted: att}},
		{"attachment.upload_completed", ClientEvent{Kind: KindAttachmentUploadCompleted, AttachmentUploadCompleted: att}},
		{"attachment.upload_failed", ClientEvent{Kind: KindAttachmentUploadFailed, AttachmentUploadFailed: failed}},
		{"attachment.download_started", ClientEvent{Kind: KindAttachmentDownloadStarted, AttachmentDownloadStarted: att}},
		{"attachment.download_completed", ClientEvent{Kind: KindAttachmentDownloadCompleted, AttachmentDownloadCompleted: att}},
		{"attachment.download_failed", ClientEvent{Kind: KindAttachmentDownloadFailed, AttachmentDownloadFailed: failed}},
		{"attachment.deleted", ClientEvent{Kind: KindAttachmentDeleted, AttachmentDeleted: att}},
		{"handle.changed", ClientEvent{Kind: KindHandleChanged, HandleChanged: &HandleChanged{InboxID: sampleOther, Handle: "Zoë \"z\" <ok>\n"}}},
		{"lagged", ClientEvent{Kind: KindLagged, Lagged: &Lagged{Discarded: 4096}}},
		{"fabric.commit_superseded", ClientEvent{Kind: KindCommitSuperseded, CommitSuperseded: &CommitSuperseded{
			GroupID: sampleGroup, CommitDigest: fill(32, 0xcd), WithdrawnEventIDs: []string{strings.Repeat("e1", 32), strings.Repeat("f2", 32)}}}},
		{"fabric.message_invalidated", ClientEvent{Kind: KindMessageInvalidated, MessageInvalidated: &MessageRef{
			GroupID: sampleGroup, MessageID: sampleMessage}}},
	}
}

// sampleFilters, sampleOutcomes and sampleTransports are valid values of
// the other contract types, also kept as golden files.
func sampleFilters() map[string]EventFilter {
	return map[string]EventFilter{
		"filter-kinds-only":  {Kinds: []EventKind{KindMessageReceived, KindConversationJoined}},
		"filter-empty-kinds": {Kinds: []EventKind{}},
		"filter-no-kinds":    {},
		"filter-full": {
			Kinds:                 []EventKind{KindMessageReceived},
			GroupIDs:              []Bytes{sampleGroup, fill(32, 0x02)},
			ContentTypes:          []ContentTypeID{{AuthorityID: "xmtp.org", TypeID: "reply", VersionMajor: 1}},
			ReferencesOwnMessages: true,
		},
		"filter-present-empty-groups": {Kinds: []EventKind{KindConsentChanged}, GroupIDs: []Bytes{}, ContentTypes: []ContentTypeID{}},
	}
}

var sampleTime = time.Date(2026, 12, 2, 14, 30, 5, 123456000, time.UTC)

func sampleOutcomes() map[string]Outcome {
	return map[string]Outcome{
		"outcome-queued": {MessageID: sampleMessage, Class: ClassApplication, Status: StatusQueued, Revision: 1, Time: sampleTime},
		"outcome-rejected": {MessageID: sampleMessage, Class: ClassMalformed, Status: StatusRejected,
			Category: CategoryInvalidEncoding, Revision: 1, Time: sampleTime},
		"outcome-rejected-reason": {MessageID: sampleMessage, Class: ClassWelcome, Status: StatusRejected,
			Category: CategoryInvalidEncoding, Reason: "the Welcome's GroupInfo has no ratchet_tree extension", Revision: 2, Time: sampleTime},
		"outcome-transport-deferred": {MessageID: sampleMessage, Class: ClassSealed, Status: StatusDeferred,
			Category: CategoryTransportDeferred, Revision: 1, Time: sampleTime},
		"outcome-accepted": {MessageID: sampleMessage, Class: ClassCommit, Status: StatusQueued,
			Disposition: DispositionAccepted, Revision: 2, Time: sampleTime},
		"outcome-beyond-anchor": {MessageID: sampleMessage, Class: ClassCommit, Status: StatusQueued,
			Disposition: DispositionStale, Category: CategoryStaleEpoch, NamedOutcome: BeyondAnchor, Revision: 3, Time: sampleTime},
	}
}

func sampleTransports() map[string]TransportMessage {
	return map[string]TransportMessage{
		"transport-mls":    {V: 1, Group: sampleGroup, Kind: TransportMLS, Payload: Bytes{0x00, 0x01, 0x00, 0x03, 0xde, 0xad}},
		"transport-sealed": {V: 1, Group: sampleGroup, Kind: TransportSealed, Payload: fill(40, 0x5a)},
	}
}
