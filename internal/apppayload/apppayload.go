// Package apppayload encodes and decodes the app payload that a hosted client
// finds inside an MLS PrivateMessage: a content type, string parameters and
// content bytes, as msgpack. It also knows the few content types the fabric
// reads itself: text, replies and reactions (which reference another message,
// EVENT-021) and deletions (which name their target).
//
// The encoding is documented in docs/protocol.md, section "App payload".
package apppayload

import (
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"unicode/utf8"
)

// MessageIDSize is the length of a message id: SHA-256 of the MLS bytes.
const MessageIDSize = 32

// maxNesting bounds how deep replies may nest payloads, so a crafted
// payload cannot drive unbounded recursion in Decode.
const maxNesting = 4

// ErrMalformed is returned, wrapped with the reason, for bytes that are not a
// well-formed app payload. Callers map it to the invalid_encoding category.
var ErrMalformed = errors.New("malformed app payload")

// ErrWrongType is returned by the typed accessors of Payload when the
// payload has another content type.
var ErrWrongType = errors.New("app payload has another content type")

// ContentType identifies how Content is to be read.
type ContentType struct {
	AuthorityID  string
	TypeID       string
	VersionMajor uint32
	VersionMinor uint32
}

// The content types the fabric reads.
var (
	TextType     = ContentType{AuthorityID: "xmtp.org", TypeID: "text", VersionMajor: 1}
	ReplyType    = ContentType{AuthorityID: "xmtp.org", TypeID: "reply", VersionMajor: 1}
	ReactionType = ContentType{AuthorityID: "xmtp.org", TypeID: "reaction", VersionMajor: 2}
	DeletionType = ContentType{AuthorityID: "xmtp.org", TypeID: "deleteMessage", VersionMajor: 1}
)

// String returns the usual "authority/type:major.minor" spelling.
func (c ContentType) String() string {
	return fmt.Sprintf("%s/%s:%d.%d", c.AuthorityID, c.TypeID, c.VersionMajor, c.VersionMinor)
}

// Matches reports whether c and o name the same content type: authority,
// type and major version agree; the minor version is ignored (CTYPE-001).
func (c ContentType) Matches(o ContentType) bool {
	return c.AuthorityID == o.AuthorityID && c.TypeID == o.TypeID && c.VersionMajor == o.VersionMajor
}

// Payload is the app payload of one application message.
type Payload struct {
	ContentType ContentType
	// Parameters are content-type specific; a reply carries its reference here.
	Parameters map[string]string
	Content    []byte
}

// ParamReference is the parameter of a reply that names the referenced
// message id, as lowercase hex.
const ParamReference = "reference"

// Encode returns the msgpack encoding of p. Keys are written in a fixed
// order and parameters sorted by key, so equal payloads encode to equal bytes.
func Encode(p Payload) ([]byte, error) {
	if err := p.validate(0); err != nil {
		return nil, fmt.Errorf("encode app payload: %w", err)
	}
	return p.appendTo(make([]byte, 0, p.sizeHint())), nil
}

func (p Payload) sizeHint() int {
	n := 96 + len(p.ContentType.AuthorityID) + len(p.ContentType.TypeID) + len(p.Content)
	for k, v := range p.Parameters {
		n += 10 + len(k) + len(v)
	}
	return n
}

func (p Payload) appendTo(b []byte) []byte {
	b = appendMapLen(b, 3)
	b = appendStr(b, "content_type")
	b = appendMapLen(b, 4)
	b = appendStr(b, "authority_id")
	b = appendStr(b, p.ContentType.AuthorityID)
	b = appendStr(b, "type_id")
	b = appendStr(b, p.ContentType.TypeID)
	b = appendStr(b, "version_major")
	b = appendUint(b, p.ContentType.VersionMajor)
	b = appendStr(b, "version_minor")
	b = appendUint(b, p.ContentType.VersionMinor)
	b = appendStr(b, "parameters")
	b = appendMapLen(b, len(p.Parameters))
	for _, k := range slices.Sorted(maps.Keys(p.Parameters)) {
		b = appendStr(b, k)
		b = appendStr(b, p.Parameters[k])
	}
	b = appendStr(b, "content")
	return appendBin(b, p.Content)
}

// Decode parses an app payload strictly: exactly the three members, each of
// its msgpack type, no duplicate or unknown keys, valid UTF-8 strings, no
// trailing bytes. A payload of a content type the fabric reads must also be
// well formed for that type (a reply's reference, a reaction's or deletion's
// content). Any failure wraps ErrMalformed; the error never quotes the input.
func Decode(b []byte) (Payload, error) {
	return decode(b, 0)
}

func decode(b []byte, depth int) (Payload, error) {
	r := reader{b: b}
	p, err := readPayload(&r)
	if err == nil {
		err = r.end()
	}
	if err == nil {
		err = p.validate(depth)
	}
	if err != nil {
		return Payload{}, fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	return p, nil
}

func readPayload(r *reader) (Payload, error) {
	var p Payload
	n, err := r.mapLen()
	if err != nil {
		return p, err
	}
	var seen [3]bool
	for range n {
		k, err := r.strBytes()
		if err != nil {
			return p, fmt.Errorf("key: %w", err)
		}
		var i int
		switch string(k) {
		case "content_type":
			i = 0
			p.ContentType, err = readContentType(r)
		case "parameters":
			i = 1
			p.Parameters, err = readParameters(r)
		case "content":
			i = 2
			if r.peekNil() {
				p.Content = []byte{}
			} else {
				p.Content, err = r.bin()
			}
		default:
			return p, errors.New("unknown member")
		}
		if err != nil {
			return p, fmt.Errorf("%s: %w", k, err)
		}
		if seen[i] {
			return p, fmt.Errorf("duplicate member %s", k)
		}
		seen[i] = true
	}
	if seen != [3]bool{true, true, true} {
		return p, errors.New("missing member")
	}
	return p, nil
}

func readContentType(r *reader) (ContentType, error) {
	var c ContentType
	n, err := r.mapLen()
	if err != nil {
		return c, err
	}
	var seen [4]bool
	for range n {
		k, err := r.strBytes()
		if err != nil {
			return c, fmt.Errorf("key: %w", err)
		}
		var i int
		switch string(k) {
		case "authority_id":
			i = 0
			c.AuthorityID, err = r.str()
		case "type_id":
			i = 1
			c.TypeID, err = r.str()
		case "version_major":
			i = 2
			c.VersionMajor, err = r.uint32()
		case "version_minor":
			i = 3
			c.VersionMinor, err = r.uint32()
		default:
			return c, errors.New("unknown member")
		}
		if err != nil {
			return c, fmt.Errorf("%s: %w", k, err)
		}
		if seen[i] {
			return c, fmt.Errorf("duplicate member %s", k)
		}
		seen[i] = true
	}
	if seen != [4]bool{true, true, true, true} {
		return c, errors.New("missing member")
	}
	return c, nil
}

func readParameters(r *reader) (map[string]string, error) {
	if r.peekNil() {
		return map[string]string{}, nil
	}
	n, err := r.mapLen()
	if err != nil {
		return nil, err
	}
	m := make(map[string]string, n)
	for range n {
		k, err := r.str()
		if err != nil {
			return nil, fmt.Errorf("key: %w", err)
		}
		v, err := r.str()
		if err != nil {
			return nil, fmt.Errorf("value: %w", err)
		}
		if _, dup := m[k]; dup {
			return nil, errors.New("duplicate key")
		}
		m[k] = v
	}
	return m, nil
}

// validate checks what both Encode and Decode require: non-empty UTF-8
// content type names, UTF-8 parameters, and the shape of the known types.
func (p Payload) validate(depth int) error {
	c := p.ContentType
	if c.AuthorityID == "" || c.TypeID == "" {
		return errors.New("empty content type")
	}
	if !utf8.ValidString(c.AuthorityID) || !utf8.ValidString(c.TypeID) {
		return errors.New("content type is not UTF-8")
	}
	for k, v := range p.Parameters {
		if !utf8.ValidString(k) || !utf8.ValidString(v) {
			return errors.New("parameter is not UTF-8")
		}
	}
	switch {
	case c.Matches(TextType):
		if !utf8.Valid(p.Content) {
			return errors.New("text is not UTF-8")
		}
	case c.Matches(ReplyType):
		if _, err := parseID(p.Parameters[ParamReference]); err != nil {
			return fmt.Errorf("reply reference: %w", err)
		}
		if depth >= maxNesting {
			return errors.New("replies nested too deep")
		}
		if _, err := decode(p.Content, depth+1); err != nil {
			return fmt.Errorf("reply content: %w", err)
		}
	case c.Matches(ReactionType):
		if _, err := decodeReaction(p.Content); err != nil {
			return fmt.Errorf("reaction: %w", err)
		}
	case c.Matches(DeletionType):
		if _, err := decodeDeletion(p.Content); err != nil {
			return fmt.Errorf("deletion: %w", err)
		}
	}
	return nil
}

// parseID reads a message id spelled as 64 lowercase hex digits.
func parseID(s string) ([]byte, error) {
	if len(s) != 2*MessageIDSize {
		return nil, errors.New("message id is not 32 bytes of hex")
	}
	for i := range len(s) {
		if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return nil, errors.New("message id is not lowercase hex")
		}
	}
	return hex.DecodeString(s)
}

// formatID spells a message id as lowercase hex, refusing other lengths.
func formatID(id []byte) (string, error) {
	if len(id) != MessageIDSize {
		return "", fmt.Errorf("message id has %d bytes, want %d", len(id), MessageIDSize)
	}
	return hex.EncodeToString(id), nil
}
