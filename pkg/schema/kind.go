package schema

// EventKind names the change a ClientEvent reports: a row of the spec's kind
// table, lagged (EVENT-031), or one of the fabric's two extension kinds.
type EventKind string

// The kinds of the spec's kind table, in table order (EVENT-012), then lagged.
const (
	KindConversationJoined          EventKind = "conversation.joined"
	KindConversationRemoved         EventKind = "conversation.removed"
	KindMembershipChanged           EventKind = "conversation.membership_changed"
	KindMetadataChanged             EventKind = "conversation.metadata_changed"
	KindConversationPaused          EventKind = "conversation.paused"
	KindMessageReceived             EventKind = "message.received"
	KindMessageStatusChanged        EventKind = "message.status_changed"
	KindMessageDeleted              EventKind = "message.deleted"
	KindMessageExpired              EventKind = "message.expired"
	KindConsentChanged              EventKind = "consent.changed"
	KindHmacKeysUpdated             EventKind = "hmac_keys.updated"
	KindIdentityRegistered          EventKind = "identity.registered"
	KindOwnInstallationAdded        EventKind = "identity.own_installation_added"
	KindOwnInstallationRevoked      EventKind = "identity.own_installation_revoked"
	KindRejectedByServer            EventKind = "client.rejected_by_server"
	KindLockoutChanged              EventKind = "client.lockout_changed"
	KindConversationForkDetected    EventKind = "conversation.fork_detected"
	KindNotificationsFailed         EventKind = "notifications.failed"
	KindArchiveRestored             EventKind = "archive.restored"
	KindConnectionStateChanged      EventKind = "connection.state_changed"
	KindAttachmentUploadStarted     EventKind = "attachment.upload_started"
	KindAttachmentUploadCompleted   EventKind = "attachment.upload_completed"
	KindAttachmentUploadFailed      EventKind = "attachment.upload_failed"
	KindAttachmentDownloadStarted   EventKind = "attachment.download_started"
	KindAttachmentDownloadCompleted EventKind = "attachment.download_completed"
	KindAttachmentDownloadFailed    EventKind = "attachment.download_failed"
	KindAttachmentDeleted           EventKind = "attachment.deleted"
	KindHandleChanged               EventKind = "handle.changed"

	// KindLagged reports events a subscription's full queue discarded
	// (EVENT-030, EVENT-031). It is always selected (EVENT-022).
	KindLagged EventKind = "lagged"
)

// Extension kinds. They are NOT rows of the spec's kind table: the fabric
// adds them to report what branch selection withdraws (Marmot convergence:
// a superseded commit's notifications are withdrawn, and an application
// message that decrypts only on a losing branch is invalidated). An app
// that knows only the spec's kinds never selects them.
const (
	// KindCommitSuperseded reports that a commit whose events were emitted
	// is no longer on the selected branch; every event it caused is
	// withdrawn. Payload member commit_superseded.
	KindCommitSuperseded EventKind = "fabric.commit_superseded"

	// KindMessageInvalidated reports that an application message whose
	// message.received was emitted decrypts only on a losing branch; its
	// payload is withdrawn. Payload member message_invalidated.
	KindMessageInvalidated EventKind = "fabric.message_invalidated"
)

// kindInfo is one row of the kind table as this package knows it.
type kindInfo struct {
	kind   EventKind
	member string // the ClientEvent payload member the kind carries
}

// kinds lists every kind in order: the spec's table, lagged, the extensions.
var kinds = [...]kindInfo{
	{KindConversationJoined, "conversation_joined"},
	{KindConversationRemoved, "conversation_removed"},
	{KindMembershipChanged, "membership_changed"},
	{KindMetadataChanged, "metadata_changed"},
	{KindConversationPaused, "conversation_paused"},
	{KindMessageReceived, "message_received"},
	{KindMessageStatusChanged, "message_status_changed"},
	{KindMessageDeleted, "message_deleted"},
	{KindMessageExpired, "message_expired"},
	{KindConsentChanged, "consent_changed"},
	{KindHmacKeysUpdated, "hmac_keys_updated"},
	{KindIdentityRegistered, "identity_registered"},
	{KindOwnInstallationAdded, "own_installation_added"},
	{KindOwnInstallationRevoked, "own_installation_revoked"},
	{KindRejectedByServer, "rejected_by_server"},
	{KindLockoutChanged, "lockout_changed"},
	{KindConversationForkDetected, "conversation_fork_detected"},
	{KindNotificationsFailed, "notifications_failed"},
	{KindArchiveRestored, "archive_restored"},
	{KindConnectionStateChanged, "connection_state_changed"},
	{KindAttachmentUploadStarted, "attachment_upload_started"},
	{KindAttachmentUploadCompleted, "attachment_upload_completed"},
	{KindAttachmentUploadFailed, "attachment_upload_failed"},
	{KindAttachmentDownloadStarted, "attachment_download_started"},
	{KindAttachmentDownloadCompleted, "attachment_download_completed"},
	{KindAttachmentDownloadFailed, "attachment_download_failed"},
	{KindAttachmentDeleted, "attachment_deleted"},
	{KindHandleChanged, "handle_changed"},
	{KindLagged, "lagged"},
	{KindCommitSuperseded, "commit_superseded"},
	{KindMessageInvalidated, "message_invalidated"},
}

// numSpecKinds counts the spec's kinds: the 28 table rows and lagged.
const numSpecKinds = 29

// kindIndex maps a kind to its position in kinds.
var kindIndex = func() map[EventKind]int {
	m := make(map[EventKind]int, len(kinds))
	for i, k := range kinds {
		m[k.kind] = i
	}
	return m
}()

// AllKinds returns every kind this package knows, in order: the spec's kind
// table, lagged, then the two extension kinds. The slice is a fresh copy.
func AllKinds() []EventKind {
	out := make([]EventKind, len(kinds))
	for i, k := range kinds {
		out[i] = k.kind
	}
	return out
}

// SpecKinds returns the spec's EventKind enum: the 28 kind-table rows in
// table order, then lagged. It excludes the extension kinds.
func SpecKinds() []EventKind {
	return AllKinds()[:numSpecKinds]
}

// Valid reports whether k is a known kind (spec or extension).
func (k EventKind) Valid() bool {
	_, ok := kindIndex[k]
	return ok
}

// IsExtension reports whether k is one of the fabric's extension kinds,
// outside the spec's kind table.
func (k EventKind) IsExtension() bool {
	i, ok := kindIndex[k]
	return ok && i >= numSpecKinds
}

// Order returns k's 1-based position in AllKinds, or 0 for an unknown kind.
// The events of one transaction are emitted in ascending Order (EVENT-012);
// the extension kinds sort after the spec's table.
func (k EventKind) Order() int {
	i, ok := kindIndex[k]
	if !ok {
		return 0
	}
	return i + 1
}

// Member returns the ClientEvent payload member that carries k, as the IDL
// spells it (message.received → "message_received"), or "" for an unknown
// kind.
func (k EventKind) Member() string {
	i, ok := kindIndex[k]
	if !ok {
		return ""
	}
	return kinds[i].member
}

// String returns the kind's wire value.
func (k EventKind) String() string { return string(k) }
