package schema

// The answers of the read API (docs/read-api.md): what a hosted client
// holds, read again when an event says it changed (EVENT-010). JSON bytes
// are lowercase hex, as everywhere in this package.

// Conversation is one conversation a client holds, as
// GET …/conversations/{group_id} answers it.
type Conversation struct {
	GroupID          Bytes            `json:"group_id" msgpack:"group_id"`
	ConversationType ConversationType `json:"conversation_type" msgpack:"conversation_type"`
	// DMPeerInboxID is a DM's other inbox.
	DMPeerInboxID string `json:"dm_peer_inbox_id,omitempty" msgpack:"dm_peer_inbox_id,omitempty"`
	// DMConversationKey is the key every group of a stitched DM shares
	// (EVENT-020).
	DMConversationKey Bytes `json:"dm_conversation_key,omitempty" msgpack:"dm_conversation_key,omitempty"`
	// StitchedGroupIDs are the client's other groups of the same DM.
	StitchedGroupIDs []Bytes         `json:"stitched_group_ids,omitempty" msgpack:"stitched_group_ids,omitempty"`
	Components       ComponentValues `json:"components" msgpack:"components"`
	Paused           *Paused         `json:"paused,omitempty" msgpack:"paused,omitempty"`
	ForkState        string          `json:"fork_state" msgpack:"fork_state"`
	Epoch            uint64          `json:"epoch" msgpack:"epoch"`
	Membership       string          `json:"membership" msgpack:"membership"`
	Members          MembersSummary  `json:"members" msgpack:"members"`
	Role             string          `json:"role" msgpack:"role"`
	ConsentState     ConsentState    `json:"consent_state" msgpack:"consent_state"`
	LastActivity     int64           `json:"last_activity" msgpack:"last_activity"`
	Messages         uint64          `json:"messages" msgpack:"messages"`
}

// Fork states and memberships of a Conversation; roles of a Conversation
// and a Member.
const (
	ForkStable        = "stable"
	ForkForked        = "forked"
	MembershipActive  = "active"
	MembershipRemoved = "removed"
	RoleMember        = "member"
	RoleAdmin         = "admin"
	RoleSuperAdmin    = "super_admin"
)

// Paused says why a group is paused: its protocol version floor is above
// the version the fabric implements (reason protocol_version_floor).
type Paused struct {
	Reason string `json:"reason" msgpack:"reason"`
	Floor  string `json:"floor" msgpack:"floor"`
}

// MembersSummary counts a group's member inboxes and installations.
type MembersSummary struct {
	Inboxes       int `json:"inboxes" msgpack:"inboxes"`
	Installations int `json:"installations" msgpack:"installations"`
}

// ComponentValues are a group's component values, named as EVENT-019
// names them; an absent component is omitted.
type ComponentValues struct {
	GroupName        *string           `json:"group_name,omitempty" msgpack:"group_name,omitempty"`
	Description      *string           `json:"description,omitempty" msgpack:"description,omitempty"`
	GroupImage       *GroupImage       `json:"group_image_url_square,omitempty" msgpack:"group_image_url_square,omitempty"`
	DisappearInNS    *uint64           `json:"message_disappear_in_ns,omitempty" msgpack:"message_disappear_in_ns,omitempty"`
	AdminList        []string          `json:"admin_list,omitempty" msgpack:"admin_list,omitempty"`
	SuperAdminList   []string          `json:"super_admin_list,omitempty" msgpack:"super_admin_list,omitempty"`
	PermissionPolicy map[string]string `json:"permission_policy,omitempty" msgpack:"permission_policy,omitempty"`
	MinimumProtocol  *string           `json:"minimum_supported_protocol_version,omitempty" msgpack:"minimum_supported_protocol_version,omitempty"`
	// Other are the components the fabric does not read, by their
	// EVENT-019 name (component:xxxx).
	Other map[string]Bytes `json:"other,omitempty" msgpack:"other,omitempty"`
}

// GroupImage is the group image component.
type GroupImage struct {
	URL       string `json:"url" msgpack:"url"`
	Dim       Bytes  `json:"dim,omitempty" msgpack:"dim,omitempty"`
	Thumbhash Bytes  `json:"thumbhash,omitempty" msgpack:"thumbhash,omitempty"`
}

// ConversationPage is a page of GET …/conversations, newest activity
// first.
type ConversationPage struct {
	Conversations []Conversation `json:"conversations" msgpack:"conversations"`
	NextCursor    string         `json:"next_cursor,omitempty" msgpack:"next_cursor,omitempty"`
}

// Member is one inbox of a conversation.
type Member struct {
	InboxID       string  `json:"inbox_id" msgpack:"inbox_id"`
	Installations []Bytes `json:"installations" msgpack:"installations"`
	Role          string  `json:"role" msgpack:"role"`
	// Association is the association state the client holds for the
	// inbox, absent when it holds none.
	Association *Association `json:"association,omitempty" msgpack:"association,omitempty"`
}

// Association is an inbox's association state a client holds.
type Association struct {
	SequenceID       uint64  `json:"sequence_id" msgpack:"sequence_id"`
	InstallationKeys []Bytes `json:"installation_keys" msgpack:"installation_keys"`
	DisplayHandle    *string `json:"display_handle,omitempty" msgpack:"display_handle,omitempty"`
}

// MemberList is what GET …/conversations/{group_id}/members answers.
type MemberList struct {
	Epoch   uint64   `json:"epoch" msgpack:"epoch"`
	Members []Member `json:"members" msgpack:"members"`
}

// Message states.
const (
	MessageStateDelivered   = "delivered"
	MessageStateDeleted     = "deleted"
	MessageStateExpired     = "expired"
	MessageStateInvalidated = "invalidated"
	// MessageStateDeletedLocally: the client deleted the message locally
	// at an app's request (a message.deleted signal with cause
	// deleted_locally); the group still holds it, this client does not
	// show it.
	MessageStateDeletedLocally = "deleted_locally"
)

// Message is one message as the read API answers it.
type Message struct {
	MessageID          Bytes  `json:"message_id" msgpack:"message_id"`
	GroupID            Bytes  `json:"group_id" msgpack:"group_id"`
	DeliveryNumber     uint64 `json:"delivery_number" msgpack:"delivery_number"`
	SenderInboxID      string `json:"sender_inbox_id" msgpack:"sender_inbox_id"`
	SenderInstallation Bytes  `json:"sender_installation" msgpack:"sender_installation"`
	// SentAt is when the fabric stored the input that carried it (unix
	// ms).
	SentAt      int64          `json:"sent_at" msgpack:"sent_at"`
	ExpiresAt   int64          `json:"expires_at,omitempty" msgpack:"expires_at,omitempty"`
	ContentType *ContentTypeID `json:"content_type,omitempty" msgpack:"content_type,omitempty"`
	// Content is the decoded content, only while the message is
	// delivered.
	Content   *MessageContent `json:"content,omitempty" msgpack:"content,omitempty"`
	State     string          `json:"state" msgpack:"state"`
	DeletedBy string          `json:"deleted_by,omitempty" msgpack:"deleted_by,omitempty"`
	// Status is the current status of a message this installation sent
	// (SEND: published, or what a message.status_changed signal made it);
	// absent on the messages of other installations.
	Status MessageStatus `json:"status,omitempty" msgpack:"status,omitempty"`
}

// MessageContent is a message's decoded content: text, a reply, a
// reaction, a deletion, or the raw content bytes of a type the fabric does
// not read.
type MessageContent struct {
	Text       *string           `json:"text,omitempty" msgpack:"text,omitempty"`
	Reply      *Reply            `json:"reply,omitempty" msgpack:"reply,omitempty"`
	Reaction   *Reaction         `json:"reaction,omitempty" msgpack:"reaction,omitempty"`
	Deletion   *Deletion         `json:"deletion,omitempty" msgpack:"deletion,omitempty"`
	Raw        Bytes             `json:"raw,omitempty" msgpack:"raw,omitempty"`
	Parameters map[string]string `json:"parameters,omitempty" msgpack:"parameters,omitempty"`
}

// Reply is a reply and the message it references.
type Reply struct {
	Reference   Bytes           `json:"reference" msgpack:"reference"`
	ContentType *ContentTypeID  `json:"content_type,omitempty" msgpack:"content_type,omitempty"`
	Content     *MessageContent `json:"content,omitempty" msgpack:"content,omitempty"`
}

// Reaction is a reaction to a message.
type Reaction struct {
	Reference        Bytes  `json:"reference" msgpack:"reference"`
	ReferenceInboxID string `json:"reference_inbox_id,omitempty" msgpack:"reference_inbox_id,omitempty"`
	Action           string `json:"action" msgpack:"action"`
	Content          string `json:"content" msgpack:"content"`
	Schema           string `json:"schema" msgpack:"schema"`
}

// Deletion names the message a deletion deletes.
type Deletion struct {
	MessageID Bytes `json:"message_id" msgpack:"message_id"`
}

// MessagePage is a page of GET …/conversations/{group_id}/messages.
type MessagePage struct {
	Messages   []Message `json:"messages" msgpack:"messages"`
	NextCursor string    `json:"next_cursor,omitempty" msgpack:"next_cursor,omitempty"`
}

// ConsentRecord is one stored consent record.
type ConsentRecord struct {
	EntityKind ConsentEntityKind `json:"entity_kind" msgpack:"entity_kind"`
	Entity     string            `json:"entity" msgpack:"entity"`
	State      ConsentState      `json:"state" msgpack:"state"`
}

// ConsentPage is a page of GET …/consent.
type ConsentPage struct {
	Consent    []ConsentRecord `json:"consent" msgpack:"consent"`
	NextCursor string          `json:"next_cursor,omitempty" msgpack:"next_cursor,omitempty"`
}

// HeldIdentity is the association state a client holds for an inbox.
type HeldIdentity struct {
	InboxID string      `json:"inbox_id" msgpack:"inbox_id"`
	Held    Association `json:"held" msgpack:"held"`
}

// IdentityPage is a page of GET …/identities.
type IdentityPage struct {
	Identities []HeldIdentity `json:"identities" msgpack:"identities"`
	NextCursor string         `json:"next_cursor,omitempty" msgpack:"next_cursor,omitempty"`
}
