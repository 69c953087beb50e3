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
	// Event is the decoded, validated event. Its strings and octets point
	// into the message's Data (schema.ClientEvent.UnmarshalMsgpackView),
	// which must not change while they are in use.
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
// get), a message of another stream subject, missing stream headers, a
// message on a live subject with a reply (a consumer's delivery) or a body
// that is not a valid ClientEvent give an *InvalidEventError.
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
		// A republished copy has no reply; a consumer's delivery has its
		// acknowledgement subject (a push consumer pointed here, issue 27).
		if msg.Reply != "" {
			return Delivered{}, invalidEvent("subject", errors.New("a consumer's delivery, not a republished copy"))
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
	if d.Time, err = timeStamp(msg.Header.Get(jetstream.TimeStampHeaer)); err != nil {
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
	if err := d.Event.UnmarshalMsgpackView(body); err != nil {
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

// timeStamp reads Nats-Time-Stamp. nats-server writes it in UTC,
// 2006-01-02T15:04:05Z with a fraction of 1 to 9 digits or none; that
// shape is read without time.Parse's generality (a tenth of Decode's
// time), and anything else goes to time.Parse, so the two accept the same
// strings with the same times (FuzzTimeStamp).
func timeStamp(v string) (time.Time, error) {
	if t, ok := utcTimeStamp(v); ok {
		return t, nil
	}
	return time.Parse(time.RFC3339Nano, v)
}

func utcTimeStamp(v string) (time.Time, bool) {
	if len(v) < 20 || len(v) == 21 || len(v) > 30 || v[len(v)-1] != 'Z' ||
		v[4] != '-' || v[7] != '-' || v[10] != 'T' || v[13] != ':' || v[16] != ':' {
		return time.Time{}, false
	}
	year, ok1 := digits(v[0:4])
	month, ok2 := digits(v[5:7])
	day, ok3 := digits(v[8:10])
	hour, ok4 := digits(v[11:13])
	minute, ok5 := digits(v[14:16])
	sec, ok6 := digits(v[17:19])
	// Days past 28 need the month's length: time.Parse checks them.
	if !ok1 || !ok2 || !ok3 || !ok4 || !ok5 || !ok6 ||
		month < 1 || month > 12 || day < 1 || day > 28 || hour > 23 || minute > 59 || sec > 59 {
		return time.Time{}, false
	}
	nsec := 0
	if len(v) > 20 {
		frac := v[20 : len(v)-1]
		n, ok := digits(frac)
		if v[19] != '.' || !ok {
			return time.Time{}, false
		}
		for range 9 - len(frac) {
			n *= 10
		}
		nsec = n
	}
	return time.Date(year, time.Month(month), day, hour, minute, sec, nsec, time.UTC), true
}

// digits reads s as a decimal number of at most 9 digits, no sign.
func digits(s string) (int, bool) {
	n := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	return n, true
}
