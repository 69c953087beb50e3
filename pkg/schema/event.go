package schema

import (
	"encoding/hex"
)

// InstallationKeySize is the size of an installation key: the leaf's
// signature key (IDENT section 8).
const InstallationKeySize = 32

// CommitDigestSize is the size of a commit digest: SHA-256 of the commit
// MLSMessage.
const CommitDigestSize = 32

// ClientEvent is one report of one change: its kind and the one payload
// member the kind table names for it. Exactly one pointer member is non-nil
// in a valid event (see Validate). Member names on the wire are the IDL's;
// the struct tags document them, and the package's own codecs
// (MarshalMsgpack, MarshalJSON and their inverses) are authoritative.
type ClientEvent struct {
	Kind EventKind `msgpack:"kind" json:"kind"`

	ConversationJoined          *ConversationJoined     `msgpack:"conversation_joined,omitempty" json:"conversation_joined,omitempty"`
	ConversationRemoved         *ConversationRemoved    `msgpack:"conversation_removed,omitempty" json:"conversation_removed,omitempty"`
	MembershipChanged           *MembershipChanged      `msgpack:"membership_changed,omitempty" json:"membership_changed,omitempty"`
	MetadataChanged             *MetadataChanged        `msgpack:"metadata_changed,omitempty" json:"metadata_changed,omitempty"`
	ConversationPaused          *ConversationPaused     `msgpack:"conversation_paused,omitempty" json:"conversation_paused,omitempty"`
	MessageReceived             *MessageReceived        `msgpack:"message_received,omitempty" json:"message_received,omitempty"`
	MessageStatusChanged        *MessageStatusChanged   `msgpack:"message_status_changed,omitempty" json:"message_status_changed,omitempty"`
	MessageDeleted              *MessageDeleted         `msgpack:"message_deleted,omitempty" json:"message_deleted,omitempty"`
	MessageExpired              *MessageRef             `msgpack:"message_expired,omitempty" json:"message_expired,omitempty"`
	ConsentChanged              *ConsentChanged         `msgpack:"consent_changed,omitempty" json:"consent_changed,omitempty"`
	HmacKeysUpdated             *HmacKeysUpdated        `msgpack:"hmac_keys_updated,omitempty" json:"hmac_keys_updated,omitempty"`
	IdentityRegistered          *IdentityRegistered     `msgpack:"identity_registered,omitempty" json:"identity_registered,omitempty"`
	OwnInstallationAdded        *InstallationRef        `msgpack:"own_installation_added,omitempty" json:"own_installation_added,omitempty"`
	OwnInstallationRevoked      *InstallationRevoked    `msgpack:"own_installation_revoked,omitempty" json:"own_installation_revoked,omitempty"`
	RejectedByServer            *ClientRejectedByServer `msgpack:"rejected_by_server,omitempty" json:"rejected_by_server,omitempty"`
	LockoutChanged              *LockoutChanged         `msgpack:"lockout_changed,omitempty" json:"lockout_changed,omitempty"`
	ConversationForkDetected    *GroupRef               `msgpack:"conversation_fork_detected,omitempty" json:"conversation_fork_detected,omitempty"`
	NotificationsFailed         *NotificationsFailed    `msgpack:"notifications_failed,omitempty" json:"notifications_failed,omitempty"`
	ArchiveRestored             *ArchiveRestored        `msgpack:"archive_restored,omitempty" json:"archive_restored,omitempty"`
	ConnectionStateChanged      *ConnectionStateChanged `msgpack:"connection_state_changed,omitempty" json:"connection_state_changed,omitempty"`
	AttachmentUploadStarted     *AttachmentRef          `msgpack:"attachment_upload_started,omitempty" json:"attachment_upload_started,omitempty"`
	AttachmentUploadCompleted   *AttachmentRef          `msgpack:"attachment_upload_completed,omitempty" json:"attachment_upload_completed,omitempty"`
	AttachmentUploadFailed      *AttachmentFailed       `msgpack:"attachment_upload_failed,omitempty" json:"attachment_upload_failed,omitempty"`
	AttachmentDownloadStarted   *AttachmentRef          `msgpack:"attachment_download_started,omitempty" json:"attachment_download_started,omitempty"`
	AttachmentDownloadCompleted *AttachmentRef          `msgpack:"attachment_download_completed,omitempty" json:"attachment_download_completed,omitempty"`
	AttachmentDownloadFailed    *AttachmentFailed       `msgpack:"attachment_download_failed,omitempty" json:"attachment_download_failed,omitempty"`
	AttachmentDeleted           *AttachmentRef          `msgpack:"attachment_deleted,omitempty" json:"attachment_deleted,omitempty"`
	HandleChanged               *HandleChanged          `msgpack:"handle_changed,omitempty" json:"handle_changed,omitempty"`
	Lagged                      *Lagged                 `msgpack:"lagged,omitempty" json:"lagged,omitempty"`

	// CommitSuperseded is the payload of the extension kind
	// fabric.commit_superseded (outside the spec's kind table).
	CommitSuperseded *CommitSuperseded `msgpack:"commit_superseded,omitempty" json:"commit_superseded,omitempty"`
	// MessageInvalidated is the payload of the extension kind
	// fabric.message_invalidated (outside the spec's kind table).
	MessageInvalidated *MessageRef `msgpack:"message_invalidated,omitempty" json:"message_invalidated,omitempty"`

	// ID is the event's id as delivered (64 lowercase hex digits), by
	// which a later fabric.commit_superseded's WithdrawnEventIDs names it.
	// It is not part of the event's encoding: the SDK (pkg/client) sets it
	// from the gateway's event frame; it is empty on a lagged.
	ID string `msgpack:"-" json:"-"`
}

// GroupRef names a group (conversation.fork_detected).
type GroupRef struct {
	GroupID Bytes `msgpack:"group_id" json:"group_id"`
}

// MessageRef names a message in a group (message.expired, and the extension
// kind fabric.message_invalidated).
type MessageRef struct {
	GroupID   Bytes `msgpack:"group_id" json:"group_id"`
	MessageID Bytes `msgpack:"message_id" json:"message_id"`
}

// ConversationJoined is the payload of conversation.joined.
type ConversationJoined struct {
	GroupID          Bytes            `msgpack:"group_id" json:"group_id"`
	ConversationType ConversationType `msgpack:"conversation_type" json:"conversation_type"`
	Origin           JoinOrigin       `msgpack:"origin" json:"origin"`
	// AdderInboxID is set exactly when Origin is welcomed (EVENT-023).
	AdderInboxID *string `msgpack:"adder_inbox_id,omitempty" json:"adder_inbox_id,omitempty"`
}

// ConversationRemoved is the payload of conversation.removed.
type ConversationRemoved struct {
	GroupID Bytes        `msgpack:"group_id" json:"group_id"`
	Cause   RemovalCause `msgpack:"cause" json:"cause"` // EVENT-006
}

// MembershipChanged is the payload of conversation.membership_changed. Both
// sequences are required: an empty one is encoded as [], never omitted.
type MembershipChanged struct {
	GroupID         Bytes    `msgpack:"group_id" json:"group_id"`
	AddedInboxIDs   []string `msgpack:"added_inbox_ids" json:"added_inbox_ids"`
	RemovedInboxIDs []string `msgpack:"removed_inbox_ids" json:"removed_inbox_ids"`
}

// MetadataChanged is the payload of conversation.metadata_changed.
type MetadataChanged struct {
	GroupID Bytes `msgpack:"group_id" json:"group_id"`
	// Changed has one entry per changed item (EVENT-019): a field name, a
	// component name, or "component:" and four lowercase hex digits.
	Changed []string `msgpack:"changed" json:"changed"`
}

// ConversationPaused is the payload of conversation.paused.
type ConversationPaused struct {
	GroupID Bytes  `msgpack:"group_id" json:"group_id"`
	Floor   string `msgpack:"floor" json:"floor"` // META section 7
}

// MessageReceived is the payload of message.received.
type MessageReceived struct {
	GroupID   Bytes `msgpack:"group_id" json:"group_id"` // EVENT-018
	MessageID Bytes `msgpack:"message_id" json:"message_id"`
	// ContentType is absent when the message has no typed content type
	// (EVENT-024).
	ContentType   *ContentTypeID `msgpack:"content_type,omitempty" json:"content_type,omitempty"`
	SenderInboxID string         `msgpack:"sender_inbox_id" json:"sender_inbox_id"`
}

// ContentTypeID is the three values CTYPE-001 matches a content type on.
type ContentTypeID struct {
	AuthorityID  string `msgpack:"authority_id" json:"authority_id"`
	TypeID       string `msgpack:"type_id" json:"type_id"`
	VersionMajor uint32 `msgpack:"version_major" json:"version_major"`
}

// Matches reports whether c and o name the same content type under
// CTYPE-001: equal authority_id, type_id and version_major.
func (c ContentTypeID) Matches(o ContentTypeID) bool {
	return c.AuthorityID == o.AuthorityID && c.TypeID == o.TypeID && c.VersionMajor == o.VersionMajor
}

// MessageStatusChanged is the payload of message.status_changed.
type MessageStatusChanged struct {
	GroupID   Bytes         `msgpack:"group_id" json:"group_id"`
	MessageID Bytes         `msgpack:"message_id" json:"message_id"`
	Previous  MessageStatus `msgpack:"previous" json:"previous"`
	Current   MessageStatus `msgpack:"current" json:"current"`
}

// MessageDeleted is the payload of message.deleted.
type MessageDeleted struct {
	GroupID   Bytes         `msgpack:"group_id" json:"group_id"`
	MessageID Bytes         `msgpack:"message_id" json:"message_id"`
	Cause     DeletionCause `msgpack:"cause" json:"cause"` // EVENT-007
}

// ConsentChanged is the payload of consent.changed (EVENT-009). For
// entity_kind conversation, Entity is the group id in lowercase hex.
type ConsentChanged struct {
	EntityKind ConsentEntityKind `msgpack:"entity_kind" json:"entity_kind"`
	Entity     string            `msgpack:"entity" json:"entity"`
	State      ConsentState      `msgpack:"state" json:"state"`
}

// HmacKeysUpdated is the (empty) payload of hmac_keys.updated.
type HmacKeysUpdated struct{}

// IdentityRegistered is the payload of identity.registered.
type IdentityRegistered struct {
	InboxID         string `msgpack:"inbox_id" json:"inbox_id"`
	InstallationKey Bytes  `msgpack:"installation_key" json:"installation_key"` // 32 bytes
}

// InstallationRef is the payload of identity.own_installation_added.
type InstallationRef struct {
	InstallationKey Bytes `msgpack:"installation_key" json:"installation_key"` // 32 bytes
}

// InstallationRevoked is the payload of identity.own_installation_revoked.
type InstallationRevoked struct {
	InstallationKey    Bytes `msgpack:"installation_key" json:"installation_key"` // 32 bytes
	IsThisInstallation bool  `msgpack:"is_this_installation" json:"is_this_installation"`
}

// ClientRejectedByServer is the payload of client.rejected_by_server.
type ClientRejectedByServer struct {
	Cause RejectionCause `msgpack:"cause" json:"cause"`
	// MinLibxmtpVersion is set exactly when Cause is version_too_old
	// (EVENT-008).
	MinLibxmtpVersion *string `msgpack:"min_libxmtp_version,omitempty" json:"min_libxmtp_version,omitempty"`
}

// LockoutChanged is the payload of client.lockout_changed.
type LockoutChanged struct {
	Change LockoutChange `msgpack:"change" json:"change"`
}

// NotificationsFailed is the payload of notifications.failed.
type NotificationsFailed struct {
	Cause string `msgpack:"cause" json:"cause"` // the cause PUSH-262 records
}

// ArchiveRestored is the payload of archive.restored.
type ArchiveRestored struct {
	Complete bool `msgpack:"complete" json:"complete"` // EVENT-017
}

// ConnectionStateChanged is the payload of connection.state_changed.
// Previous and Current differ (EVENT-027 emits only on a change).
type ConnectionStateChanged struct {
	Previous ConnectionState `msgpack:"previous" json:"previous"`
	Current  ConnectionState `msgpack:"current" json:"current"`
}

// AttachmentRef is the payload of attachment.upload_started,
// .upload_completed, .download_started, .download_completed and .deleted.
type AttachmentRef struct {
	AttachmentKey string `msgpack:"attachment_key" json:"attachment_key"` // ATCH-041
	URL           string `msgpack:"url" json:"url"`
	ContentDigest string `msgpack:"content_digest" json:"content_digest"` // lowercase hex
}

// AttachmentFailed is the payload of attachment.upload_failed and
// attachment.download_failed.
type AttachmentFailed struct {
	AttachmentKey string `msgpack:"attachment_key" json:"attachment_key"`
	URL           string `msgpack:"url" json:"url"`
	ContentDigest string `msgpack:"content_digest" json:"content_digest"`
	Cause         string `msgpack:"cause" json:"cause"` // an AttachmentFailureCause (ATCH-060)
}

// HandleChanged is the payload of handle.changed (EVENT-058).
type HandleChanged struct {
	InboxID string `msgpack:"inbox_id" json:"inbox_id"`
	Handle  string `msgpack:"handle" json:"handle"`
}

// Lagged is the payload of lagged: the number of events discarded for the
// subscription since the previous lagged handoff (EVENT-031).
type Lagged struct {
	Discarded uint64 `msgpack:"discarded" json:"discarded"`
}

// CommitSuperseded is the payload of the extension kind
// fabric.commit_superseded: the commit, named by its digest, is no longer on
// the selected branch and every event it caused is withdrawn.
type CommitSuperseded struct {
	GroupID Bytes `msgpack:"group_id" json:"group_id"`
	// CommitDigest is SHA-256 of the commit MLSMessage (32 bytes).
	CommitDigest Bytes `msgpack:"commit_digest" json:"commit_digest"`
	// WithdrawnEventIDs are the ids of the events the commit caused for
	// this client, now withdrawn: each event's deterministic id (64
	// lowercase hex digits, its Nats-Msg-Id in FABRIC_EVENTS). Empty when
	// the commit caused none. Absent in payloads of older versions.
	WithdrawnEventIDs []string `msgpack:"withdrawn_event_ids" json:"withdrawn_event_ids"`
}

// EventIDSize is the length of an event id: SHA-256 in lowercase hex.
const EventIDSize = 64

// GroupID returns the group the event names, in the spec's sense of "names
// a group": its payload carries a group_id, or it is a consent.changed
// event whose entity_kind is conversation, whose entity is then the group id
// in lowercase hex. ok is false for an event that names no group, which a
// filter's group_ids does not narrow (EVENT-020). A conversation consent
// entity that is not lowercase hex names no group.
func (e ClientEvent) GroupID() (id Bytes, ok bool) {
	switch {
	case e.ConversationJoined != nil:
		return e.ConversationJoined.GroupID, true
	case e.ConversationRemoved != nil:
		return e.ConversationRemoved.GroupID, true
	case e.MembershipChanged != nil:
		return e.MembershipChanged.GroupID, true
	case e.MetadataChanged != nil:
		return e.MetadataChanged.GroupID, true
	case e.ConversationPaused != nil:
		return e.ConversationPaused.GroupID, true
	case e.MessageReceived != nil:
		return e.MessageReceived.GroupID, true
	case e.MessageStatusChanged != nil:
		return e.MessageStatusChanged.GroupID, true
	case e.MessageDeleted != nil:
		return e.MessageDeleted.GroupID, true
	case e.MessageExpired != nil:
		return e.MessageExpired.GroupID, true
	case e.ConversationForkDetected != nil:
		return e.ConversationForkDetected.GroupID, true
	case e.CommitSuperseded != nil:
		return e.CommitSuperseded.GroupID, true
	case e.MessageInvalidated != nil:
		return e.MessageInvalidated.GroupID, true
	case e.ConsentChanged != nil && e.ConsentChanged.EntityKind == ConsentEntityConversation:
		id, err := hex.DecodeString(e.ConsentChanged.Entity)
		if err != nil || !isLowerHex(e.ConsentChanged.Entity) {
			return nil, false
		}
		return id, true
	}
	return nil, false
}
