package bus

import (
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fabric-mls/fabric/internal/bus/subject"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// Delivered is an event as the gateway receives it: from the republished
// subject fabric.live.<tenant>.<client>, or from a direct get of
// FABRIC_EVENTS when it repairs a gap.
type Delivered struct {
	// Tenant and ClientID name the client the event is for, from the
	// stored subject.
	Tenant   string
	ClientID string
	// ID is the event id (Nats-Msg-Id).
	ID string
	// Event is the decoded, validated event.
	Event schema.ClientEvent
	// ConversationKey and ReferencesOwn are the filter facts convergence
	// attached (EVENT-020, EVENT-021).
	ConversationKey []byte
	ReferencesOwn   bool
	// Sequence is the event's stream sequence (Nats-Sequence).
	Sequence uint64
	// LastSequence is Nats-Last-Sequence: on a republished copy, the
	// sequence of the client's previous event still stored, 0 for none; a
	// gap shows as LastSequence above the last sequence seen. On a batched
	// direct get it is the previous message of that response.
	LastSequence uint64
	// Time is when the stream stored the event (Nats-Time-Stamp).
	Time time.Time
	// Live reports a republished copy rather than a direct-get response.
	Live bool
}

// Decode reads an event from a republished message or a direct-get
// response. A status message (such as the 204 ending a batched direct
// get), a message of another stream subject, missing stream headers or a
// body that is not a valid ClientEvent give an *InvalidEventError.
func Decode(msg *nats.Msg) (Delivered, error) {
	if msg == nil || msg.Header == nil {
		return Delivered{}, invalidEvent("subject", errors.New("message has no headers"))
	}
	if st := msg.Header.Get("Status"); st != "" {
		return Delivered{}, invalidEvent("subject", errors.New("status message "+strconv.Quote(st)))
	}
	var d Delivered
	stored := msg.Header.Get(jetstream.SubjectHeader)
	var err error
	if d.Tenant, d.ClientID, err = subject.ParseEvents(stored); err != nil {
		return Delivered{}, invalidEvent("subject", err)
	}
	if strings.HasPrefix(msg.Subject, "fabric.live.") {
		tenant, client, err := subject.ParseLive(msg.Subject)
		if err != nil {
			return Delivered{}, invalidEvent("subject", err)
		}
		if tenant != d.Tenant || client != d.ClientID {
			return Delivered{}, invalidEvent("subject", errors.New("live subject and stored subject name different clients"))
		}
		d.Live = true
	}
	if d.Sequence, err = strconv.ParseUint(msg.Header.Get(jetstream.SequenceHeader), 10, 64); err != nil || d.Sequence == 0 {
		return Delivered{}, invalidEvent("sequence", errors.New("missing or malformed Nats-Sequence"))
	}
	if v := msg.Header.Get(HeaderLastSequence); v != "" {
		if d.LastSequence, err = strconv.ParseUint(v, 10, 64); err != nil || d.LastSequence >= d.Sequence {
			return Delivered{}, invalidEvent("sequence", errors.New("malformed Nats-Last-Sequence"))
		}
	} else if d.Live {
		return Delivered{}, invalidEvent("sequence", errors.New("republished copy lacks Nats-Last-Sequence"))
	}
	if d.Time, err = time.Parse(time.RFC3339Nano, msg.Header.Get(jetstream.TimeStampHeaer)); err != nil {
		return Delivered{}, invalidEvent("time", errors.New("missing or malformed Nats-Time-Stamp"))
	}
	if err := decodeStored(&d, msg.Header, msg.Data); err != nil {
		return Delivered{}, err
	}
	return d, nil
}

// DecodeStored reads an event from a message fetched from FABRIC_EVENTS
// (Stream.GetMsg, jetstreamext.GetBatch). LastSequence is left 0 and Live
// false.
func DecodeStored(m *jetstream.RawStreamMsg) (Delivered, error) {
	if m == nil {
		return Delivered{}, invalidEvent("subject", errors.New("no message"))
	}
	var d Delivered
	var err error
	if d.Tenant, d.ClientID, err = subject.ParseEvents(m.Subject); err != nil {
		return Delivered{}, invalidEvent("subject", err)
	}
	if m.Sequence == 0 {
		return Delivered{}, invalidEvent("sequence", errors.New("zero sequence"))
	}
	d.Sequence, d.Time = m.Sequence, m.Time
	if err := decodeStored(&d, m.Header, m.Data); err != nil {
		return Delivered{}, err
	}
	return d, nil
}

// decodeStored reads what the publisher stored: id, filter headers, body.
func decodeStored(d *Delivered, h nats.Header, body []byte) error {
	d.ID = h.Get(jetstream.MsgIDHeader)
	if err := validID(d.ID); err != nil {
		return err
	}
	if err := d.Event.UnmarshalMsgpack(body); err != nil {
		return invalidEvent("event", err)
	}
	if v := h.Get(HeaderConversationKey); v != "" {
		k, ok := conversationKey(v)
		if !ok {
			return invalidEvent("conversation key", errors.New("not lowercase hex of at most 64 bytes"))
		}
		if _, ok := d.Event.GroupID(); !ok {
			return invalidEvent("conversation key", errors.New("event names no group"))
		}
		d.ConversationKey = k
	}
	switch v := h.Get(HeaderReferencesOwn); v {
	case "":
	case "1":
		if d.Event.Kind != schema.KindMessageReceived {
			return invalidEvent("references own", errors.New("only on message.received"))
		}
		d.ReferencesOwn = true
	default:
		return invalidEvent("references own", errors.New("value is not 1"))
	}
	return nil
}

// conversationKey decodes the conversation key header, lowercase hex of
// at most MaxConversationKeyLen bytes, with the key as its one allocation.
func conversationKey(v string) ([]byte, bool) {
	if len(v)%2 != 0 || len(v) > 2*MaxConversationKeyLen {
		return nil, false
	}
	k := make([]byte, len(v)/2)
	for i := 0; i < len(v); i++ {
		var n byte
		switch c := v[i]; {
		case c >= '0' && c <= '9':
			n = c - '0'
		case c >= 'a' && c <= 'f':
			n = c - 'a' + 10
		default:
			return nil, false
		}
		k[i/2] = k[i/2]<<4 | n
	}
	return k, true
}
