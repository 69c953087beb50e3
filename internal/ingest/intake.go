package ingest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"

	"github.com/fabric-mls/fabric/internal/bus/subject"
	"github.com/fabric-mls/fabric/internal/refusal"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// Result is the intake answer for one transport message, in input order
// (DESIGN §10).
type Result struct {
	// MessageID is SHA-256 of the peeled MLS bytes; for a sealed object no
	// key opens yet, SHA-256 of the sealed payload (its transport id).
	MessageID schema.Bytes `json:"message_id" msgpack:"message_id"`
	// Status is queued, rejected or deferred.
	Status schema.OutcomeStatus `json:"status" msgpack:"status"`
	// Category says why, for rejected and deferred input.
	Category schema.Category `json:"category,omitempty" msgpack:"category,omitempty"`
}

// Response is the body of an intake answer.
type Response struct {
	Results []Result `json:"results" msgpack:"results"`
}

// EncodeMsgpack writes r as the struct tags say, without reflection: an
// answer has a result per message, up to the batch limit, on every request.
func (r Response) EncodeMsgpack(enc *msgpack.Encoder) error {
	if err := enc.EncodeMapLen(1); err != nil {
		return err
	}
	if err := enc.EncodeString("results"); err != nil {
		return err
	}
	if r.Results == nil {
		return enc.EncodeNil()
	}
	if err := enc.EncodeArrayLen(len(r.Results)); err != nil {
		return err
	}
	for _, res := range r.Results {
		n := 2
		if res.Category != "" {
			n = 3
		}
		if err := enc.EncodeMapLen(n); err != nil {
			return err
		}
		if err := enc.EncodeString("message_id"); err != nil {
			return err
		}
		if err := enc.EncodeBytes(res.MessageID); err != nil {
			return err
		}
		if err := enc.EncodeString("status"); err != nil {
			return err
		}
		if err := enc.EncodeString(string(res.Status)); err != nil {
			return err
		}
		if n == 3 {
			if err := enc.EncodeString("category"); err != nil {
				return err
			}
			if err := enc.EncodeString(string(res.Category)); err != nil {
				return err
			}
		}
	}
	return nil
}

// maxGroupBytes is the longest group id a subject can carry.
const maxGroupBytes = subject.MaxGroupHexLen / 2

func badField(field, format string, args ...any) *refusal.Error {
	return refusal.BadRequest("%s: %s", field, fmt.Sprintf(format, args...))
}

// decodeIntake decodes a request body: one transport message, or
// {"messages": [...]}. Errors are refusals naming the member at
// fault; they never quote payload bytes.
func decodeIntake(body []byte, isMsgpack bool, lim Limits) ([]schema.TransportMessage, error) {
	if int64(len(body)) > lim.MaxBodyBytes {
		return nil, ErrBodyTooLarge.With("body exceeds %d bytes", lim.MaxBodyBytes)
	}
	if len(body) == 0 {
		return nil, refusal.BadRequest("empty body")
	}
	var (
		msgs  []schema.TransportMessage
		batch bool
		err   error
	)
	if isMsgpack {
		msgs, batch, err = decodeIntakeMsgpack(body, lim)
	} else {
		msgs, batch, err = decodeIntakeJSON(body, lim)
	}
	if err != nil {
		return nil, err
	}
	for i := range msgs {
		if err := checkMessage(&msgs[i], batch, i, lim); err != nil {
			return nil, err
		}
	}
	return msgs, nil
}

// fieldOf names message i for an error.
func fieldOf(batch bool, i int) string {
	if !batch {
		return "message"
	}
	return "messages[" + strconv.Itoa(i) + "]"
}

// payloadHeadroom is what the fabric adds to a transport payload on the
// largest message it writes for it: the retained object (msgpack framing,
// the group id, a Nats-Msg-Id naming tenant, reason and message id) or the
// input (two headers). Both stay well under it.
const payloadHeadroom = 1024 + maxGroupBytes

// limits are the configured limits with MaxMessageBytes lowered, when the
// server's max_payload is the smaller bound, to what fits in one message
// with payloadHeadroom: a payload that can never be stored is refused as
// message_too_large, not answered 503 and retried for ever. The connection
// reports the max_payload of the server it is connected to.
func (s *Service) limits() Limits {
	l := s.cfg.Limits
	if fit := int(s.cfg.Conn.MaxPayload()) - payloadHeadroom; fit > 0 && fit < l.MaxMessageBytes {
		l.MaxMessageBytes = fit
	}
	return l
}

// checkMessage applies the envelope rules of fabric-native/1 (DESIGN §3).
// Payload content is not judged here: bytes that do not peel or parse get a
// category, not a 400.
func checkMessage(m *schema.TransportMessage, batch bool, i int, lim Limits) error {
	// The member's name is made only for an error: this runs per message.
	field := func(member string) string { return fieldOf(batch, i) + member }
	switch {
	case m.V != schema.TransportVersion:
		return badField(field(".v"), "version %d is not supported, want %d", m.V, schema.TransportVersion)
	case !m.Kind.Valid():
		return badField(field(".kind"), "want %q or %q", schema.TransportMLS, schema.TransportSealed)
	case len(m.Group) == 0:
		return badField(field(".group"), "missing or empty")
	case len(m.Group) > maxGroupBytes:
		return badField(field(".group"), "longer than %d bytes", maxGroupBytes)
	case len(m.Payload) == 0:
		return badField(field(".payload"), "missing or empty")
	case len(m.Payload) > lim.MaxMessageBytes:
		return ErrMessageTooLarge.With("%s: exceeds %d bytes", field(".payload"), lim.MaxMessageBytes)
	}
	return nil
}

func batchTooLarge(n, limit int) error {
	return ErrBatchTooLarge.With("messages: %d messages exceed the batch limit of %d", n, limit)
}

func decodeIntakeJSON(body []byte, lim Limits) (msgs []schema.TransportMessage, batch bool, err error) {
	top, err := jsonObject(body)
	if err != nil {
		return nil, false, refusal.BadRequest("malformed JSON: %v", err)
	}
	raw, ok := top["messages"]
	if !ok {
		m, err := decodeMessageJSON(top, "message")
		if err != nil {
			return nil, false, err
		}
		return []schema.TransportMessage{m}, false, nil
	}
	if len(top) != 1 {
		return nil, true, refusal.BadRequest("malformed JSON: a batch has only the member \"messages\"")
	}
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil || items == nil {
		return nil, true, badField("messages", "want an array of transport messages")
	}
	if len(items) == 0 {
		return nil, true, badField("messages", "empty batch")
	}
	if len(items) > lim.MaxBatch {
		return nil, true, batchTooLarge(len(items), lim.MaxBatch)
	}
	msgs = make([]schema.TransportMessage, len(items))
	for i, item := range items {
		field := fieldOf(true, i)
		members, err := jsonObject(item)
		if errors.Is(err, errDuplicateMember) {
			return nil, true, badField(field, "%v", err)
		}
		if err != nil {
			return nil, true, badField(field, "want an object")
		}
		m, err := decodeMessageJSON(members, field)
		if err != nil {
			return nil, true, err
		}
		msgs[i] = m
	}
	return msgs, true, nil
}

var errDuplicateMember = errors.New("duplicate member")

// jsonObject decodes one JSON object, and nothing after it, into its
// members, refusing a member given twice: decoding is strict, never
// last-wins (docs/wire-formats.md).
func jsonObject(b []byte) (map[string]json.RawMessage, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, errors.New("want an object")
	}
	members := map[string]json.RawMessage{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		name, ok := tok.(string)
		if !ok {
			return nil, errors.New("want an object")
		}
		if _, dup := members[name]; dup {
			return nil, fmt.Errorf("%w %s", errDuplicateMember, quoteMember(name))
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, err
		}
		members[name] = raw
	}
	if _, err := dec.Token(); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("trailing data after the value")
	}
	return members, nil
}

func decodeMessageJSON(members map[string]json.RawMessage, field string) (schema.TransportMessage, error) {
	var m schema.TransportMessage
	for name, raw := range members {
		f := field + "." + name
		var err error
		switch name {
		case "v":
			err = json.Unmarshal(raw, &m.V)
		case "group":
			err = json.Unmarshal(raw, &m.Group)
		case "kind":
			err = json.Unmarshal(raw, &m.Kind)
		case "payload":
			err = json.Unmarshal(raw, &m.Payload)
		default:
			return m, badField(field, "unknown member %s", quoteMember(name))
		}
		if err != nil {
			return m, badField(f, "%s", jsonMemberProblem(name))
		}
	}
	for _, name := range requiredMembers {
		if _, ok := members[name]; !ok {
			return m, badField(field+"."+name, "missing")
		}
	}
	return m, nil
}

// requiredMembers are the members of every transport message.
var requiredMembers = []string{"v", "group", "kind", "payload"}

func jsonMemberProblem(name string) string {
	switch name {
	case "v":
		return "want an integer"
	case "kind":
		return "want a string"
	}
	return "want lowercase hexadecimal of even length"
}

// quoteMember quotes a caller-supplied member name, cut short.
func quoteMember(name string) string {
	const limit = 40
	if len(name) > limit {
		return strconv.QuoteToASCII(name[:limit]) + "…"
	}
	return strconv.QuoteToASCII(name)
}

func decodeIntakeMsgpack(body []byte, lim Limits) (msgs []schema.TransportMessage, batch bool, err error) {
	if err := schema.CheckMsgpack(body); err != nil {
		return nil, false, refusal.BadRequest("malformed msgpack: %v", err)
	}
	d := newBodyDecoder(body)
	n, err := d.dec.DecodeMapLen()
	if err != nil || n < 0 {
		return nil, false, refusal.BadRequest("malformed msgpack: want a map")
	}
	single := schema.TransportMessage{}
	present := map[string]bool{}
	for i := 0; i < n; i++ {
		name, err := d.dec.DecodeString()
		if err != nil {
			return nil, false, refusal.BadRequest("malformed msgpack: member name: want a string")
		}
		if present[name] {
			return nil, false, refusal.BadRequest("malformed msgpack: duplicate member %s", quoteMember(name))
		}
		present[name] = true
		if name == "messages" {
			if n != 1 {
				return nil, false, refusal.BadRequest("malformed msgpack: a batch has only the member \"messages\"")
			}
			msgs, err = decodeBatchMsgpack(d, lim)
			if err != nil {
				return nil, true, err
			}
			continue
		}
		if err := decodeMemberMsgpack(d, &single, name, -1); err != nil {
			return nil, true, err
		}
	}
	if msgs != nil {
		return msgs, true, nil
	}
	for _, name := range requiredMembers {
		if !present[name] {
			return nil, false, badField("message."+name, "missing")
		}
	}
	return []schema.TransportMessage{single}, false, nil
}

// bodyDecoder reads msgpack from a request body it holds whole, so bin
// members (group, payload) are taken as slices of the body rather than
// copied: the body lives as long as the request's inputs and is never
// written to.
type bodyDecoder struct {
	body []byte
	r    *bytes.Reader
	dec  *msgpack.Decoder
}

func newBodyDecoder(body []byte) *bodyDecoder {
	r := bytes.NewReader(body)
	// bytes.Reader is an io.ByteScanner, so the decoder reads it without
	// buffering and r's position is the decoder's.
	return &bodyDecoder{body: body, r: r, dec: msgpack.NewDecoder(r)}
}

// bin reads a bin value as a slice of the body. Octets are bin in msgpack,
// never str or nil (docs/wire-formats.md).
func (d *bodyDecoder) bin() ([]byte, error) {
	c, err := d.dec.PeekCode()
	if err != nil {
		return nil, err
	}
	if c != msgpcode.Bin8 && c != msgpcode.Bin16 && c != msgpcode.Bin32 {
		return nil, errors.New("want bin")
	}
	n, err := d.dec.DecodeBytesLen()
	if err != nil {
		return nil, err
	}
	off := len(d.body) - d.r.Len()
	if n > d.r.Len() {
		return nil, io.ErrUnexpectedEOF
	}
	if _, err := d.r.Seek(int64(n), io.SeekCurrent); err != nil {
		return nil, err
	}
	return d.body[off : off+n : off+n], nil
}

// Transport message members, as bits of a set.
const (
	memberV = 1 << iota
	memberGroup
	memberKind
	memberPayload
	memberAll = memberV | memberGroup | memberKind | memberPayload
)

func decodeBatchMsgpack(d *bodyDecoder, lim Limits) ([]schema.TransportMessage, error) {
	n, err := d.dec.DecodeArrayLen()
	if err != nil || n < 0 {
		return nil, badField("messages", "want an array of transport messages")
	}
	if n == 0 {
		return nil, badField("messages", "empty batch")
	}
	if n > lim.MaxBatch {
		return nil, batchTooLarge(n, lim.MaxBatch)
	}
	msgs := make([]schema.TransportMessage, n)
	for i := range msgs {
		k, err := d.dec.DecodeMapLen()
		if err != nil || k < 0 {
			return nil, badField(fieldOf(true, i), "want a map")
		}
		present := 0
		for j := 0; j < k; j++ {
			name, err := d.dec.DecodeString()
			if err != nil {
				return nil, badField(fieldOf(true, i), "member name: want a string")
			}
			bit := memberBit(name)
			if present&bit != 0 {
				return nil, badField(fieldOf(true, i), "duplicate member %s", quoteMember(name))
			}
			if err := decodeMemberMsgpack(d, &msgs[i], name, i); err != nil {
				return nil, err
			}
			present |= bit
		}
		if present != memberAll {
			for _, name := range requiredMembers {
				if present&memberBit(name) == 0 {
					return nil, badField(fieldOf(true, i)+"."+name, "missing")
				}
			}
		}
	}
	return msgs, nil
}

// memberBit is a known member's bit; 0 for any other name.
func memberBit(name string) int {
	switch name {
	case "v":
		return memberV
	case "group":
		return memberGroup
	case "kind":
		return memberKind
	case "payload":
		return memberPayload
	}
	return 0
}

// decodeMemberMsgpack decodes one member of a transport message: of the
// single message when i < 0, else of messages[i]. Field names for errors
// are made only when there is an error.
func decodeMemberMsgpack(d *bodyDecoder, m *schema.TransportMessage, name string, i int) error {
	field := func() string { return fieldOf(i >= 0, i) + "." + name }
	switch name {
	case "v":
		v, err := d.dec.DecodeInt()
		if err != nil {
			return badField(field(), "want an integer")
		}
		m.V = v
	case "group":
		b, err := d.bin()
		if err != nil {
			return badField(field(), "want bin")
		}
		m.Group = b
	case "kind":
		s, err := d.dec.DecodeString()
		if err != nil {
			return badField(field(), "want a string")
		}
		m.Kind = schema.TransportKind(s)
	case "payload":
		b, err := d.bin()
		if err != nil {
			return badField(field(), "want bin")
		}
		m.Payload = b
	default:
		return badField(fieldOf(i >= 0, i), "unknown member %s", quoteMember(name))
	}
	return nil
}
