package ingest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/fabric-mls/fabric/internal/httpapi"
	"github.com/fabric-mls/fabric/internal/subject"
	"github.com/fabric-mls/fabric/pkg/schema"
	"github.com/vmihailenco/msgpack/v5"
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

// Error codes of intake refusals; each is also a label value of the
// refusals metric.
const (
	codeBadRequest      = "bad_request"
	codeBodyTooLarge    = "body_too_large"
	codeBatchTooLarge   = "batch_too_large"
	codeMessageTooLarge = "message_too_large"
	codeRateLimited     = "rate_limited"
	codeUnavailable     = "unavailable"
)

// maxGroupBytes is the longest group id a subject can carry.
const maxGroupBytes = subject.MaxGroupHexLen / 2

func badField(field, format string, args ...any) *httpapi.Error {
	return httpapi.BadRequest("%s: %s", field, fmt.Sprintf(format, args...))
}

// decodeIntake decodes a request body: one transport message, or
// {"messages": [...]}. Errors are *httpapi.Error values naming the member at
// fault; they never quote payload bytes.
func decodeIntake(body []byte, isMsgpack bool, lim Limits) ([]schema.TransportMessage, error) {
	if int64(len(body)) > lim.MaxBodyBytes {
		return nil, httpapi.Errorf(http.StatusRequestEntityTooLarge, codeBodyTooLarge, "body exceeds %d bytes", lim.MaxBodyBytes)
	}
	if len(body) == 0 {
		return nil, httpapi.BadRequest("empty body")
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
		if err := checkMessage(&msgs[i], fieldOf(batch, i), lim); err != nil {
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

// checkMessage applies the envelope rules of fabric-native/1 (DESIGN §3).
// Payload content is not judged here: bytes that do not peel or parse get a
// category, not a 400.
func checkMessage(m *schema.TransportMessage, field string, lim Limits) error {
	switch {
	case m.V != schema.TransportVersion:
		return badField(field+".v", "version %d is not supported, want %d", m.V, schema.TransportVersion)
	case !m.Kind.Valid():
		return badField(field+".kind", "want %q or %q", schema.TransportMLS, schema.TransportSealed)
	case len(m.Group) == 0:
		return badField(field+".group", "missing or empty")
	case len(m.Group) > maxGroupBytes:
		return badField(field+".group", "longer than %d bytes", maxGroupBytes)
	case len(m.Payload) == 0:
		return badField(field+".payload", "missing or empty")
	case len(m.Payload) > lim.MaxMessageBytes:
		return httpapi.Errorf(http.StatusRequestEntityTooLarge, codeMessageTooLarge, "%s.payload: exceeds %d bytes", field, lim.MaxMessageBytes)
	}
	return nil
}

func batchTooLarge(n, limit int) error {
	return httpapi.Errorf(http.StatusRequestEntityTooLarge, codeBatchTooLarge, "messages: %d messages exceed the batch limit of %d", n, limit)
}

func decodeIntakeJSON(body []byte, lim Limits) (msgs []schema.TransportMessage, batch bool, err error) {
	var top map[string]json.RawMessage
	if err := strictJSON(body, &top); err != nil {
		return nil, false, httpapi.BadRequest("malformed JSON: %v", err)
	}
	if top == nil {
		return nil, false, httpapi.BadRequest("malformed JSON: want an object")
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
		return nil, true, httpapi.BadRequest("malformed JSON: a batch has only the member \"messages\"")
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
		var members map[string]json.RawMessage
		if err := json.Unmarshal(item, &members); err != nil || members == nil {
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

// strictJSON decodes exactly one JSON value.
func strictJSON(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(v); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return fmt.Errorf("want %s", te.Type)
		}
		return err
	}
	if dec.More() {
		return errors.New("trailing data after the value")
	}
	return nil
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
	r := bytes.NewReader(body)
	dec := msgpack.NewDecoder(r)
	n, err := dec.DecodeMapLen()
	if err != nil || n < 0 {
		return nil, false, httpapi.BadRequest("malformed msgpack: want a map")
	}
	single := schema.TransportMessage{}
	present := map[string]bool{}
	for i := 0; i < n; i++ {
		name, err := dec.DecodeString()
		if err != nil {
			return nil, false, httpapi.BadRequest("malformed msgpack: member name: want a string")
		}
		if present[name] {
			return nil, false, httpapi.BadRequest("malformed msgpack: duplicate member %s", quoteMember(name))
		}
		present[name] = true
		if name == "messages" {
			if n != 1 {
				return nil, false, httpapi.BadRequest("malformed msgpack: a batch has only the member \"messages\"")
			}
			msgs, err = decodeBatchMsgpack(dec, lim)
			if err != nil {
				return nil, true, err
			}
			continue
		}
		if err := decodeMemberMsgpack(dec, &single, name, "message"); err != nil {
			return nil, true, err
		}
	}
	if r.Len() != 0 {
		return nil, false, httpapi.BadRequest("malformed msgpack: trailing data after the value")
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

func decodeBatchMsgpack(dec *msgpack.Decoder, lim Limits) ([]schema.TransportMessage, error) {
	n, err := dec.DecodeArrayLen()
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
		field := fieldOf(true, i)
		k, err := dec.DecodeMapLen()
		if err != nil || k < 0 {
			return nil, badField(field, "want a map")
		}
		present := map[string]bool{}
		for j := 0; j < k; j++ {
			name, err := dec.DecodeString()
			if err != nil {
				return nil, badField(field, "member name: want a string")
			}
			if present[name] {
				return nil, badField(field, "duplicate member %s", quoteMember(name))
			}
			present[name] = true
			if err := decodeMemberMsgpack(dec, &msgs[i], name, field); err != nil {
				return nil, err
			}
		}
		for _, name := range requiredMembers {
			if !present[name] {
				return nil, badField(field+"."+name, "missing")
			}
		}
	}
	return msgs, nil
}

func decodeMemberMsgpack(dec *msgpack.Decoder, m *schema.TransportMessage, name, field string) error {
	f := field + "." + name
	switch name {
	case "v":
		v, err := dec.DecodeInt()
		if err != nil {
			return badField(f, "want an integer")
		}
		m.V = v
	case "group":
		b, err := dec.DecodeBytes()
		if err != nil {
			return badField(f, "want bin")
		}
		m.Group = b
	case "kind":
		s, err := dec.DecodeString()
		if err != nil {
			return badField(f, "want a string")
		}
		m.Kind = schema.TransportKind(s)
	case "payload":
		b, err := dec.DecodeBytes()
		if err != nil {
			return badField(f, "want bin")
		}
		m.Payload = b
	default:
		return badField(field, "unknown member %s", quoteMember(name))
	}
	return nil
}
