package bus

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fabric-mls/fabric/internal/bus/streams"
	"github.com/fabric-mls/fabric/internal/bus/subject"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// Headers of an event message (docs/architecture.md, "Event messages").
const (
	// HeaderConversationKey carries a stitched DM's conversation key in
	// lowercase hex on events of the DM's groups (EVENT-020).
	HeaderConversationKey = "Fabric-Conversation-Key"
	// HeaderReferencesOwn is "1" on a message.received that replies or
	// reacts to a message of the receiving client's own inbox (EVENT-021).
	HeaderReferencesOwn = "Fabric-References-Own"
	// HeaderLastSequence is the stream sequence of the previous message on
	// the same subject, set by RePublish and by batched direct gets.
	HeaderLastSequence = "Nats-Last-Sequence"
)

// IDLen is the length of an event id: lowercase hex of a SHA-256 digest.
const IDLen = 64

// MaxConversationKeyLen bounds a conversation key in bytes.
const MaxConversationKeyLen = 64

// idDomain separates event ids from every other SHA-256 the fabric takes.
const idDomain = "fabric/event-id/v1"

// EventID derives a deterministic event id from what caused the event, for
// example the group, the input's message id and the event's position among
// the events that input caused. Parts are length-prefixed, so ("ab", "c")
// and ("a", "bc") give different ids. The result is lowercase hex.
func EventID(parts ...[]byte) string {
	// Hashed in one call from a buffer on the stack when the parts are
	// small, as converge's are (an event per recipient of each message).
	var stack [256]byte
	in := append(stack[:0], idDomain...)
	for _, p := range parts {
		in = binary.AppendUvarint(in, uint64(len(p)))
		in = append(in, p...)
	}
	sum := sha256.Sum256(in)
	var out [2 * sha256.Size]byte
	hex.Encode(out[:], sum[:])
	return string(out[:])
}

// Event is one client event to publish.
type Event struct {
	// Tenant and ClientID (lowercase hex) name the client whose subject,
	// fabric.ev.<tenant>.<client>, the event goes to.
	Tenant   string
	ClientID string
	// ID is the deterministic event id (see EventID), sent as Nats-Msg-Id.
	ID string
	// Event is the event itself. Events may share one (a message's
	// recipients): it must not change until they are published.
	Event *schema.ClientEvent
	// ConversationKey, for an event of a stitched DM's group, is the DM's
	// conversation key (EVENT-020). Only for events that name a group.
	ConversationKey []byte
	// ReferencesOwn marks a message.received that replies or reacts to a
	// message of the receiving client's own inbox (EVENT-021).
	ReferencesOwn bool
}

// InvalidEventError reports an event that cannot be published or a message
// that does not decode as one. Field names what is wrong; the error never
// carries an id, a key or a payload.
type InvalidEventError struct {
	// Field is the part at fault: "tenant", "client id", "id", "event",
	// "conversation key", "references own", "subject", "sequence", "time".
	Field string
	// Err is the cause: a *subject.InvalidTokenError, a
	// *schema.ValidationError, a *schema.DecodeError or a plain reason.
	Err error
}

func (e *InvalidEventError) Error() string {
	return "bus: invalid " + e.Field + ": " + e.Err.Error()
}

// Unwrap returns the cause.
func (e *InvalidEventError) Unwrap() error { return e.Err }

func invalidEvent(field string, err error) error {
	return &InvalidEventError{Field: field, Err: err}
}

// validID checks an event id: exactly IDLen lowercase hex characters.
func validID(id string) error {
	if len(id) != IDLen {
		return invalidEvent("id", errors.New("not 64 lowercase hex characters"))
	}
	for i := 0; i < len(id); i++ {
		if !lowerHex[id[i]] {
			return invalidEvent("id", errors.New("not 64 lowercase hex characters"))
		}
	}
	return nil
}

// lowerHex marks the bytes of lowercase hex.
var lowerHex = func() (t [256]bool) {
	for _, c := range "0123456789abcdef" {
		t[c] = true
	}
	return t
}()

// Msg validates e and builds its NATS message: subject, headers and the
// msgpack body.
func (e Event) Msg() (*nats.Msg, error) {
	subj, err := e.check()
	if err != nil {
		return nil, err
	}
	body, err := e.body()
	if err != nil {
		return nil, err
	}
	m := nats.NewMsg(subj)
	m.Data = body
	e.setHeaders(m.Header, new(eventHeaders))
	return m, nil
}

// eventHeaders holds the values of an event's headers: a batch reuses one
// for all its events (Batch.Publish).
type eventHeaders struct {
	id, conversationKey [1]string
}

// one is the value of a flag header, read only.
var one = []string{"1"}

// setHeaders sets e's headers on h, their values held in v: the id
// (Nats-Msg-Id) and the filter facts (EVENT-020, EVENT-021).
func (e Event) setHeaders(h nats.Header, v *eventHeaders) {
	v.id[0] = e.ID
	h[jetstream.MsgIDHeader] = v.id[:]
	if len(e.ConversationKey) > 0 {
		v.conversationKey[0] = hex.EncodeToString(e.ConversationKey)
		h[HeaderConversationKey] = v.conversationKey[:]
	}
	if e.ReferencesOwn {
		h[HeaderReferencesOwn] = one
	}
}

// body is the event's msgpack encoding.
func (e Event) body() ([]byte, error) {
	body, err := e.Event.MarshalMsgpack()
	if err != nil {
		return nil, invalidEvent("event", err)
	}
	return body, nil
}

// check validates e but its body and returns its subject.
func (e Event) check() (string, error) {
	if e.Event == nil {
		return "", invalidEvent("event", errors.New("missing"))
	}
	subj, err := subject.Events(e.Tenant, e.ClientID)
	if err != nil {
		var ite *subject.InvalidTokenError
		if errors.As(err, &ite) && ite.Role == subject.RoleClient {
			return "", invalidEvent("client id", err)
		}
		return "", invalidEvent("tenant", err)
	}
	if err := validID(e.ID); err != nil {
		return "", err
	}
	if len(e.ConversationKey) > 0 {
		if _, ok := e.Event.GroupID(); !ok {
			return "", invalidEvent("conversation key", errors.New("event names no group"))
		}
		if len(e.ConversationKey) > MaxConversationKeyLen {
			return "", invalidEvent("conversation key", errors.New("too long"))
		}
	}
	if e.ReferencesOwn && e.Event.Kind != schema.KindMessageReceived {
		return "", invalidEvent("references own", errors.New("only on message.received"))
	}
	return subj, nil
}

// Publish validates ev and stores it on its client's subject in
// FABRIC_EVENTS. It returns the stream sequence; publishing an id again
// within the dedup window stores nothing and returns the original's
// sequence, so a retry is safe.
func Publish(ctx context.Context, js jetstream.JetStream, ev Event) (seq uint64, err error) {
	m, err := ev.Msg()
	if err != nil {
		return 0, err
	}
	ack, err := js.PublishMsg(ctx, m, jetstream.WithExpectStream(streams.StreamEvents))
	if err != nil {
		return 0, fmt.Errorf("bus: publish %s: %w", ev.Event.Kind, err)
	}
	return ack.Sequence, nil
}
