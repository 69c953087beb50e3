package schema

import (
	"errors"
	"strconv"
)

// Sentinel causes of a DecodeError, for errors.Is.
var (
	// ErrUnknownKind: the kind is not one this package knows.
	ErrUnknownKind = errors.New("unknown kind")
	// ErrUnknownMember: a map holds a member its type does not define.
	ErrUnknownMember = errors.New("unknown member")
	// ErrDuplicateMember: a map holds a member twice.
	ErrDuplicateMember = errors.New("duplicate member")
	// ErrMissingMember: a required member is absent.
	ErrMissingMember = errors.New("missing required member")
	// ErrMalformed: the bytes are not well-formed in the format, hold a
	// value of the wrong type, or are followed by trailing data.
	ErrMalformed = errors.New("malformed")
)

// ValidationError reports a value that breaks a rule of the contract.
// Member is the path of the offending member as the IDL spells it, such as
// "conversation_joined.adder_inbox_id"; it never contains a value.
type ValidationError struct {
	Member string
	Reason string
}

func (e *ValidationError) Error() string {
	return "schema: invalid " + e.Member + ": " + e.Reason
}

// DecodeError reports bytes that do not decode. Member is the path of the
// member being decoded ("" for the top level). Err is one of the sentinel
// errors above, so callers can branch with errors.Is.
type DecodeError struct {
	Format string // "msgpack" or "json"
	Member string
	Reason string
	Err    error
}

func (e *DecodeError) Error() string {
	s := "schema: decode " + e.Format
	if e.Member != "" {
		s += " " + e.Member
	}
	s += ": " + e.Err.Error()
	if e.Reason != "" {
		s += ": " + e.Reason
	}
	return s
}

// Unwrap returns the sentinel cause.
func (e *DecodeError) Unwrap() error { return e.Err }

// quoteName quotes an input-supplied name (a member or kind) for an error
// message, cut short so an error never carries a long input.
func quoteName(b []byte) string {
	const limit = 40
	if len(b) > limit {
		return strconv.QuoteToASCII(string(b[:limit])) + "…"
	}
	return strconv.QuoteToASCII(string(b))
}

// path joins a parent member path and a member name.
func path(parent, name string) string {
	switch {
	case parent == "":
		return name
	case name == "":
		return parent
	case name[0] == '[':
		return parent + name
	}
	return parent + "." + name
}
