package schema

// ConversationType is the group's CONVERSATION_TYPE (META).
type ConversationType string

// ConversationType values.
const (
	ConversationGroup ConversationType = "group"
	ConversationDM    ConversationType = "dm"
)

// JoinOrigin says how the client came to hold a conversation (EVENT-005).
type JoinOrigin string

// JoinOrigin values.
const (
	OriginCreated  JoinOrigin = "created"
	OriginWelcomed JoinOrigin = "welcomed"
)

// RemovalCause says why this installation left a group (EVENT-006).
type RemovalCause string

// RemovalCause values.
const (
	RemovalRemoved RemovalCause = "removed"
	RemovalLeft    RemovalCause = "left"
)

// DeletionCause says how a message was deleted (EVENT-007).
type DeletionCause string

// DeletionCause values.
const (
	DeletionDeleted        DeletionCause = "deleted"
	DeletionDeletedLocally DeletionCause = "deleted_locally"
)

// MessageStatus is the delivery status of a message this installation sent
// (SEND).
type MessageStatus string

// MessageStatus values.
const (
	StatusUnpublished MessageStatus = "unpublished"
	StatusPublished   MessageStatus = "published"
	StatusFailed      MessageStatus = "failed"
)

// ConsentEntityKind is the kind of entity a consent record is about.
type ConsentEntityKind string

// ConsentEntityKind values.
const (
	ConsentEntityConversation ConsentEntityKind = "conversation"
	ConsentEntityInbox        ConsentEntityKind = "inbox"
)

// ConsentState is a consent record's stored state.
type ConsentState string

// ConsentState values.
const (
	ConsentUnknown ConsentState = "unknown"
	ConsentAllowed ConsentState = "allowed"
	ConsentDenied  ConsentState = "denied"
)

// RejectionCause says why the server rejected the client (CONF-075).
type RejectionCause string

// RejectionCause values.
const (
	RejectionBackendMismatch RejectionCause = "backend_mismatch"
	RejectionVersionTooOld   RejectionCause = "version_too_old"
)

// LockoutChange says whether the client entered or left lockout (AUTH-023).
type LockoutChange string

// LockoutChange values.
const (
	LockoutEntered LockoutChange = "entered"
	LockoutLeft    LockoutChange = "left"
)

// ConnectionState is the client-wide state of open app streams that hold
// network interest (EVENT-027).
type ConnectionState string

// ConnectionState values.
const (
	ConnectionConnecting   ConnectionState = "connecting"
	ConnectionConnected    ConnectionState = "connected"
	ConnectionReconnecting ConnectionState = "reconnecting"
	ConnectionFailed       ConnectionState = "failed"
	ConnectionClosed       ConnectionState = "closed"
)

// Valid reports whether t is a known value.
func (t ConversationType) Valid() bool { return t == ConversationGroup || t == ConversationDM }

// Valid reports whether o is a known value.
func (o JoinOrigin) Valid() bool { return o == OriginCreated || o == OriginWelcomed }

// Valid reports whether c is a known value.
func (c RemovalCause) Valid() bool { return c == RemovalRemoved || c == RemovalLeft }

// Valid reports whether c is a known value.
func (c DeletionCause) Valid() bool { return c == DeletionDeleted || c == DeletionDeletedLocally }

// Valid reports whether s is a known value.
func (s MessageStatus) Valid() bool {
	return s == StatusUnpublished || s == StatusPublished || s == StatusFailed
}

// Valid reports whether k is a known value.
func (k ConsentEntityKind) Valid() bool {
	return k == ConsentEntityConversation || k == ConsentEntityInbox
}

// Valid reports whether s is a known value.
func (s ConsentState) Valid() bool {
	return s == ConsentUnknown || s == ConsentAllowed || s == ConsentDenied
}

// Valid reports whether c is a known value.
func (c RejectionCause) Valid() bool {
	return c == RejectionBackendMismatch || c == RejectionVersionTooOld
}

// Valid reports whether c is a known value.
func (c LockoutChange) Valid() bool { return c == LockoutEntered || c == LockoutLeft }

// Valid reports whether s is a known value.
func (s ConnectionState) Valid() bool {
	switch s {
	case ConnectionConnecting, ConnectionConnected, ConnectionReconnecting, ConnectionFailed, ConnectionClosed:
		return true
	}
	return false
}
