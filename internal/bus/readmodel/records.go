package readmodel

import "github.com/fabric-mls/fabric/pkg/schema"

// MessageState is where a message stands for the clients that hold it.
type MessageState string

// Message states.
const (
	StateDelivered   MessageState = "delivered"
	StateDeleted     MessageState = "deleted"
	StateExpired     MessageState = "expired"
	StateInvalidated MessageState = "invalidated"
	// StateDeletedLocally is how the read API shows a message one client
	// deleted locally (a signal); the group's record never holds it.
	StateDeletedLocally MessageState = "deleted_locally"
)

// Message is one message a group delivered, at its delivery number N
// (1, 2, … in the order converge delivered them: the canonical order).
// Content is the app payload (internal/apppayload), sealed (Sealer); a
// message no longer delivered has none: its record is replaced by one
// without it, so the content is gone from storage, not hidden.
type Message struct {
	N                  uint64 `msgpack:"n"`
	ID                 []byte `msgpack:"id"`
	GroupID            []byte `msgpack:"group_id"`
	SenderInboxID      string `msgpack:"sender_inbox_id"`
	SenderInstallation []byte `msgpack:"sender_installation"`
	// Seq is the FABRIC_IN sequence of the input that carried it: a
	// client holds it when Seq is past the client's JoinedSeq, or when it
	// sent it.
	Seq       uint64       `msgpack:"seq"`
	SentAt    int64        `msgpack:"sent_at"`
	ExpiresAt int64        `msgpack:"expires_at,omitempty"`
	State     MessageState `msgpack:"state"`
	// ContentType is the payload's content type, in the clear as in
	// message.received; nil when the payload has none, or once the
	// content is gone.
	ContentType *schema.ContentTypeID `msgpack:"content_type,omitempty"`
	// DeletedBy is the inbox whose deletion applied (StateDeleted).
	DeletedBy string `msgpack:"deleted_by,omitempty"`
	Content   []byte `msgpack:"content,omitempty"`
}

// Pointer names where a message id's record is.
type Pointer struct {
	GroupID []byte `msgpack:"group_id"`
	N       uint64 `msgpack:"n"`
}

// Conversation is one client's view of one group, written whenever a
// transaction emitted an event of the group to the client.
type Conversation struct {
	GroupID      []byte `msgpack:"group_id"`
	ClientID     string `msgpack:"client_id"`
	InboxID      string `msgpack:"inbox_id"`
	Installation []byte `msgpack:"installation"`
	// Components is the canonical components extension body.
	Components []byte `msgpack:"components,omitempty"`
	Epoch      uint64 `msgpack:"epoch"`
	// DMKey is the DM conversation key of a DM's group (EVENT-020).
	DMKey []byte `msgpack:"dm_key,omitempty"`
	// PausedFloor is the protocol version floor that pauses the group;
	// empty when it is not paused.
	PausedFloor string `msgpack:"paused_floor,omitempty"`
	Forked      bool   `msgpack:"forked,omitempty"`
	// Removed is set once the client no longer holds the group (removed
	// or left); it then holds the messages up to LastN.
	Removed bool   `msgpack:"removed,omitempty"`
	LastN   uint64 `msgpack:"last_n,omitempty"`
	// FirstN is the first delivery number after the client joined.
	FirstN uint64 `msgpack:"first_n,omitempty"`
	// JoinedSeq is the input sequence the client joined at (Message.Seq).
	JoinedSeq     uint64 `msgpack:"joined_seq"`
	Inboxes       int    `msgpack:"inboxes"`
	Installations int    `msgpack:"installations"`
	// Delivered is the group's newest delivery number when written.
	Delivered uint64 `msgpack:"delivered"`
	// Activity is the stream time of the change (unix ms).
	Activity int64 `msgpack:"activity"`
}

// Holds reports whether the client of c holds m.
func (c *Conversation) Holds(m *Message) bool {
	if c.Removed && m.N > c.LastN {
		return false
	}
	return m.Seq > c.JoinedSeq || string(m.SenderInstallation) == string(c.Installation)
}

// Members are a group's members at its canonical epoch.
type Members struct {
	Epoch   uint64   `msgpack:"epoch"`
	Members []Member `msgpack:"members"`
}

// Member is one inbox of a group and its installations (leaf signature
// keys), sorted.
type Member struct {
	InboxID       string   `msgpack:"inbox_id"`
	Installations [][]byte `msgpack:"installations"`
}

// Sibling lists one group of a DM a client holds (SiblingSubject).
type Sibling struct {
	GroupID []byte `msgpack:"group_id"`
	// Removed is set once the client no longer holds the group.
	Removed bool `msgpack:"removed,omitempty"`
}
