package schema

import "time"

// OperationKind names what a hosted client was asked to do (issue 19).
type OperationKind string

// OperationKind values.
const (
	OpCreateConversation OperationKind = "create_conversation"
	OpSendMessage        OperationKind = "send_message"
	OpAddMembers         OperationKind = "add_members"
	OpRemoveMember       OperationKind = "remove_member"
	OpUpdateConversation OperationKind = "update_conversation"
	OpLeave              OperationKind = "leave"
	OpSelfUpdate         OperationKind = "self_update"
)

// Valid reports whether k is a known value.
func (k OperationKind) Valid() bool {
	switch k {
	case OpCreateConversation, OpSendMessage, OpAddMembers, OpRemoveMember,
		OpUpdateConversation, OpLeave, OpSelfUpdate:
		return true
	}
	return false
}

// OperationStatus is where an operation stands.
type OperationStatus string

// OperationStatus values.
const (
	// OperationQueued: stored, serialized with the group's input, not yet
	// executed.
	OperationQueued OperationStatus = "queued"
	// OperationPending: an own commit is on the outbound stream and waits
	// to be accepted on the canonical branch.
	OperationPending OperationStatus = "pending"
	// OperationDone: what the operation produced is on the outbound
	// stream (a message, a leave request) or accepted (a commit).
	OperationDone OperationStatus = "done"
	// OperationFailed: nothing more will be sent; Category says why.
	OperationFailed OperationStatus = "failed"
)

// Operation is the record of one operation, as GET
// /v1/tenants/{tenant}/clients/{client_id}/operations/{operation_id}
// returns it; each change is a new record, the last current.
type Operation struct {
	ID       Bytes           `msgpack:"operation_id" json:"operation_id"`
	Kind     OperationKind   `msgpack:"kind" json:"kind"`
	ClientID string          `msgpack:"client_id" json:"client_id"`
	GroupID  Bytes           `msgpack:"group_id" json:"group_id"`
	Status   OperationStatus `msgpack:"status" json:"status"`
	// Category says why a failed operation failed (authorization_failed,
	// unknown_group, wrong_recipient, invalid_encoding, …); "" is absent.
	Category Category `msgpack:"category,omitempty" json:"category,omitempty"`
	// MessageIDs are the ids of the MLS messages it produced, in the
	// order they are on the outbound stream (a commit before its Welcomes).
	MessageIDs []Bytes `msgpack:"message_ids,omitempty" json:"message_ids,omitempty"`
	// Time is when this record was made.
	Time time.Time `msgpack:"time" json:"time"`
}

// OperationAccepted answers an operation request (202): the operation id,
// the group it is about (a create's new group id), and queued.
type OperationAccepted struct {
	OperationID Bytes           `json:"operation_id" msgpack:"operation_id"`
	GroupID     Bytes           `json:"group_id" msgpack:"group_id"`
	Status      OperationStatus `json:"status" msgpack:"status"`
}

// ConversationChanges are the components a create sets or a PATCH
// changes; an absent member is not set (kept).
type ConversationChanges struct {
	Name             *string `json:"name,omitempty" msgpack:"name,omitempty"`
	Description      *string `json:"description,omitempty" msgpack:"description,omitempty"`
	ImageURL         *string `json:"image_url,omitempty" msgpack:"image_url,omitempty"`
	DisappearingSecs *uint64 `json:"disappearing_secs,omitempty" msgpack:"disappearing_secs,omitempty"`
	// Admins replaces the admin list (inbox ids).
	Admins []string `json:"admins,omitempty" msgpack:"admins,omitempty"`
}

// CreateConversation is the body of POST …/conversations: {"name": "…"}
// makes a group with only the client; KeyPackages adds members at once;
// DMKeyPackage makes a DM with the one inbox of that KeyPackage.
type CreateConversation struct {
	Name             *string  `json:"name,omitempty" msgpack:"name,omitempty"`
	Description      *string  `json:"description,omitempty" msgpack:"description,omitempty"`
	ImageURL         *string  `json:"image_url,omitempty" msgpack:"image_url,omitempty"`
	DisappearingSecs *uint64  `json:"disappearing_secs,omitempty" msgpack:"disappearing_secs,omitempty"`
	Admins           []string `json:"admins,omitempty" msgpack:"admins,omitempty"`
	KeyPackages      []Bytes  `json:"key_packages,omitempty" msgpack:"key_packages,omitempty"`
	DMKeyPackage     Bytes    `json:"dm_key_package,omitempty" msgpack:"dm_key_package,omitempty"`
}

// SendMessage is the body of POST …/messages: {"text": "…"} sends a
// text, with ReplyTo a reply; Reaction, Delete, or ContentType with
// Content the others. Exactly one of Text, Reaction, Delete and
// ContentType is set.
type SendMessage struct {
	Text        *string           `json:"text,omitempty" msgpack:"text,omitempty"`
	ReplyTo     Bytes             `json:"reply_to,omitempty" msgpack:"reply_to,omitempty"`
	Reaction    *SendReaction     `json:"reaction,omitempty" msgpack:"reaction,omitempty"`
	Delete      Bytes             `json:"delete,omitempty" msgpack:"delete,omitempty"`
	ContentType *ContentTypeID    `json:"content_type,omitempty" msgpack:"content_type,omitempty"`
	Parameters  map[string]string `json:"parameters,omitempty" msgpack:"parameters,omitempty"`
	Content     Bytes             `json:"content,omitempty" msgpack:"content,omitempty"`
}

// SendReaction is an xmtp.org/reaction:2.0 adding (or removing) an emoji
// to the message Reference.
type SendReaction struct {
	Reference Bytes  `json:"reference" msgpack:"reference"`
	Emoji     string `json:"emoji" msgpack:"emoji"`
	Removed   bool   `json:"removed,omitempty" msgpack:"removed,omitempty"`
}

// AddMembers is the body of POST …/members.
type AddMembers struct {
	KeyPackages []Bytes `json:"key_packages" msgpack:"key_packages"`
}

// Changes returns the components a create sets.
func (c CreateConversation) Changes() ConversationChanges {
	return ConversationChanges{Name: c.Name, Description: c.Description, ImageURL: c.ImageURL, DisappearingSecs: c.DisappearingSecs, Admins: c.Admins}
}
