package apppayload

import (
	"errors"
	"fmt"
	"unicode/utf8"
)

// NewText returns an xmtp.org/text:1.0 payload: the UTF-8 text as content.
func NewText(text string) Payload {
	return Payload{ContentType: TextType, Parameters: map[string]string{}, Content: []byte(text)}
}

// Text returns the text of an xmtp.org/text payload.
func (p Payload) Text() (string, error) {
	if !p.ContentType.Matches(TextType) {
		return "", ErrWrongType
	}
	if !utf8.Valid(p.Content) {
		return "", fmt.Errorf("%w: text is not UTF-8", ErrMalformed)
	}
	return string(p.Content), nil
}

// NewReply returns an xmtp.org/reply:1.0 payload that answers the message
// ref with inner: the reference is the "reference" parameter in lowercase
// hex, and the content is inner's own app payload encoding.
func NewReply(ref []byte, inner Payload) (Payload, error) {
	hexRef, err := formatID(ref)
	if err != nil {
		return Payload{}, fmt.Errorf("reply: %w", err)
	}
	content, err := Encode(inner)
	if err != nil {
		return Payload{}, fmt.Errorf("reply: %w", err)
	}
	return Payload{
		ContentType: ReplyType,
		Parameters:  map[string]string{ParamReference: hexRef},
		Content:     content,
	}, nil
}

// Reply returns the referenced message id and the inner payload of an
// xmtp.org/reply payload.
func (p Payload) Reply() (ref []byte, inner Payload, err error) {
	if !p.ContentType.Matches(ReplyType) {
		return nil, Payload{}, ErrWrongType
	}
	ref, err = parseID(p.Parameters[ParamReference])
	if err != nil {
		return nil, Payload{}, fmt.Errorf("%w: reply reference: %w", ErrMalformed, err)
	}
	inner, err = decode(p.Content, 1)
	if err != nil {
		return nil, Payload{}, fmt.Errorf("reply content: %w", err)
	}
	return ref, inner, nil
}

// ReactionAction says whether a reaction is added or taken back.
type ReactionAction string

// Reaction actions.
const (
	ReactionAdded   ReactionAction = "added"
	ReactionRemoved ReactionAction = "removed"
)

// ReactionSchema says how Reaction.Content is to be read.
type ReactionSchema string

// Reaction schemas.
const (
	SchemaUnicode   ReactionSchema = "unicode"
	SchemaShortcode ReactionSchema = "shortcode"
	SchemaCustom    ReactionSchema = "custom"
)

// Reaction is ReactionV2, the content of an xmtp.org/reaction:2.0 payload.
type Reaction struct {
	// Reference is the id of the message reacted to (EVENT-021).
	Reference []byte
	// ReferenceInboxID is the inbox of that message's sender, when known;
	// empty otherwise.
	ReferenceInboxID string
	Action           ReactionAction
	// Content is the reaction itself, e.g. an emoji under SchemaUnicode.
	Content string
	Schema  ReactionSchema
}

// NewReaction returns an xmtp.org/reaction:2.0 payload carrying r.
func NewReaction(r Reaction) (Payload, error) {
	content, err := encodeReaction(r)
	if err != nil {
		return Payload{}, fmt.Errorf("reaction: %w", err)
	}
	return Payload{ContentType: ReactionType, Parameters: map[string]string{}, Content: content}, nil
}

// Reaction returns the ReactionV2 of an xmtp.org/reaction payload.
func (p Payload) Reaction() (Reaction, error) {
	if !p.ContentType.Matches(ReactionType) {
		return Reaction{}, ErrWrongType
	}
	r, err := decodeReaction(p.Content)
	if err != nil {
		return Reaction{}, fmt.Errorf("%w: reaction: %w", ErrMalformed, err)
	}
	return r, nil
}

// NewDeletion returns an xmtp.org/deleteMessage:1.0 payload that deletes
// the message target.
func NewDeletion(target []byte) (Payload, error) {
	hexID, err := formatID(target)
	if err != nil {
		return Payload{}, fmt.Errorf("deletion: %w", err)
	}
	b := appendMapLen(nil, 1)
	b = appendStr(b, "message_id")
	b = appendStr(b, hexID)
	return Payload{ContentType: DeletionType, Parameters: map[string]string{}, Content: b}, nil
}

// DeletionTarget returns the id of the message an xmtp.org/deleteMessage
// payload deletes; ok is false for any other payload or a malformed one.
func (p Payload) DeletionTarget() (msgID []byte, ok bool) {
	if !p.ContentType.Matches(DeletionType) {
		return nil, false
	}
	id, err := decodeDeletion(p.Content)
	return id, err == nil
}

// ReferenceKind says how a payload references another message.
type ReferenceKind int

// Reference kinds.
const (
	ReferenceNone ReferenceKind = iota
	ReferenceReply
	ReferenceReaction
)

// String names the kind.
func (k ReferenceKind) String() string {
	switch k {
	case ReferenceReply:
		return "reply"
	case ReferenceReaction:
		return "reaction"
	default:
		return "none"
	}
}

// References returns the message id a reply or reaction names, for
// references_own_messages (EVENT-021). ok is false for other content types
// and for a malformed reference.
func (p Payload) References() (msgID []byte, kind ReferenceKind, ok bool) {
	switch {
	case p.ContentType.Matches(ReplyType):
		id, err := parseID(p.Parameters[ParamReference])
		if err != nil {
			return nil, ReferenceNone, false
		}
		return id, ReferenceReply, true
	case p.ContentType.Matches(ReactionType):
		r, err := decodeReaction(p.Content)
		if err != nil {
			return nil, ReferenceNone, false
		}
		return r.Reference, ReferenceReaction, true
	}
	return nil, ReferenceNone, false
}

func encodeReaction(r Reaction) ([]byte, error) {
	ref, err := formatID(r.Reference)
	if err != nil {
		return nil, err
	}
	if err := r.check(); err != nil {
		return nil, err
	}
	n := 4
	if r.ReferenceInboxID != "" {
		n = 5
	}
	b := appendMapLen(make([]byte, 0, 128+len(r.Content)), n)
	b = appendStr(b, "reference")
	b = appendStr(b, ref)
	if r.ReferenceInboxID != "" {
		b = appendStr(b, "reference_inbox_id")
		b = appendStr(b, r.ReferenceInboxID)
	}
	b = appendStr(b, "action")
	b = appendStr(b, string(r.Action))
	b = appendStr(b, "content")
	b = appendStr(b, r.Content)
	b = appendStr(b, "schema")
	return appendStr(b, string(r.Schema)), nil
}

func (r Reaction) check() error {
	switch r.Action {
	case ReactionAdded, ReactionRemoved:
	default:
		return errors.New("unknown action")
	}
	switch r.Schema {
	case SchemaUnicode, SchemaShortcode, SchemaCustom:
	default:
		return errors.New("unknown schema")
	}
	if r.ReferenceInboxID != "" {
		if _, err := parseID(r.ReferenceInboxID); err != nil {
			return errors.New("reference inbox id is not 32 bytes of lowercase hex")
		}
	}
	if !utf8.ValidString(r.Content) {
		return errors.New("content is not UTF-8")
	}
	return nil
}

func decodeReaction(b []byte) (Reaction, error) {
	var out Reaction
	rd := reader{b: b}
	n, err := rd.mapLen()
	if err != nil {
		return out, err
	}
	var seen [5]bool
	for range n {
		k, err := rd.strBytes()
		if err != nil {
			return out, fmt.Errorf("key: %w", err)
		}
		var i int
		var v string
		switch string(k) {
		case "reference":
			i = 0
			if v, err = rd.str(); err == nil {
				out.Reference, err = parseID(v)
			}
		case "reference_inbox_id":
			i = 1
			out.ReferenceInboxID, err = rd.str()
		case "action":
			i = 2
			v, err = rd.str()
			out.Action = ReactionAction(v)
		case "content":
			i = 3
			out.Content, err = rd.str()
		case "schema":
			i = 4
			v, err = rd.str()
			out.Schema = ReactionSchema(v)
		default:
			return out, errors.New("unknown member")
		}
		if err != nil {
			return out, fmt.Errorf("%s: %w", k, err)
		}
		if seen[i] {
			return out, fmt.Errorf("duplicate member %s", k)
		}
		seen[i] = true
	}
	if !seen[0] || !seen[2] || !seen[3] || !seen[4] {
		return out, errors.New("missing member")
	}
	if err := rd.end(); err != nil {
		return out, err
	}
	if seen[1] && out.ReferenceInboxID == "" {
		return out, errors.New("empty reference inbox id")
	}
	return out, out.check()
}

func decodeDeletion(b []byte) ([]byte, error) {
	rd := reader{b: b}
	n, err := rd.mapLen()
	if err != nil {
		return nil, err
	}
	if n != 1 {
		return nil, errors.New("want exactly one member")
	}
	k, err := rd.str()
	if err != nil {
		return nil, fmt.Errorf("key: %w", err)
	}
	if k != "message_id" {
		return nil, errors.New("unknown member")
	}
	v, err := rd.str()
	if err != nil {
		return nil, fmt.Errorf("message_id: %w", err)
	}
	if err := rd.end(); err != nil {
		return nil, err
	}
	return parseID(v)
}
