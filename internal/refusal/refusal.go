// Package refusal is the core's vocabulary for a request it will not do:
// a Kind (what sort of refusal) and a stable code (the error code callers
// see). It speaks no transport: each edge maps kinds to its own codes in
// one place, HTTP statuses in internal/httpapi and NATS reply statuses in
// ingest's intake (docs/ingest.md).
package refusal

import (
	"errors"
	"fmt"
	"time"
)

// Kind is what sort of refusal an error is; an edge maps it to a status.
type Kind uint8

// The kinds. Kind zero is not one: an error without a kind is internal.
const (
	Invalid         Kind = iota + 1 // the request is malformed
	TooLarge                        // the request exceeds a size bound
	Unauthenticated                 // no valid credential
	Forbidden                       // the credential does not grant it
	NotFound                        // what it names does not exist
	Conflict                        // the state it assumed has changed
	Unprocessable                   // well-formed, but not acceptable
	RateLimited                     // the caller is over its rate or quota
	Unavailable                     // not now: retry later
	StorageFull                     // a store is at its bound
	NotOffered                      // this deployment does not offer it
)

// Kinds lists every kind, for the edges' mapping tests.
var Kinds = []Kind{Invalid, TooLarge, Unauthenticated, Forbidden, NotFound, Conflict, Unprocessable, RateLimited, Unavailable, StorageFull, NotOffered}

var kindNames = [...]string{"", "invalid", "too_large", "unauthenticated", "forbidden", "not_found", "conflict", "unprocessable", "rate_limited", "unavailable", "storage_full", "not_offered"}

func (k Kind) String() string {
	if int(k) < len(kindNames) && k != 0 {
		return kindNames[k]
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Error is a refusal: its kind, its code and a message for the caller.
// Messages name the problem, never secret or private values. Its JSON and
// msgpack form is the body member "error" of every edge's answer.
type Error struct {
	Kind    Kind   `json:"-" msgpack:"-"`
	Code    string `json:"code" msgpack:"code"`
	Message string `json:"message" msgpack:"message"`
	// RetryAfter, when set, is how long until the same request may pass.
	RetryAfter time.Duration `json:"-" msgpack:"-"`

	cause error
}

// Internal stands for an error that is no refusal: its message reveals
// nothing.
var Internal = &Error{Code: CodeInternal, Message: "internal error"}

// New declares a refusal; a package's sentinels are made with it.
func New(kind Kind, code, message string) *Error {
	return &Error{Kind: kind, Code: code, Message: message}
}

func (e *Error) Error() string { return e.Code + ": " + e.Message }

// Is reports whether target is a refusal of the same kind and code, so a
// refusal with its own message still matches its package's sentinel.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Kind == e.Kind && t.Code == e.Code
}

// With returns e with the message format makes.
func (e *Error) With(format string, args ...any) *Error {
	c := *e
	c.Message = fmt.Sprintf(format, args...)
	return &c
}

// Because returns e with cause's message, and cause beneath it for
// errors.As (a schema.ValidationError names the member and its rule).
func (e *Error) Because(cause error) *Error {
	c := *e
	c.Message = cause.Error()
	c.cause = cause
	return &c
}

// Unwrap is the cause Because gave, if any.
func (e *Error) Unwrap() error { return e.cause }

// After returns e with RetryAfter d.
func (e *Error) After(d time.Duration) *Error {
	c := *e
	c.RetryAfter = d
	return &c
}

// ErrBadRequest is the refusal of a malformed request.
var ErrBadRequest = New(Invalid, "bad_request", "bad request")

// BadRequest is ErrBadRequest with its message from format.
func BadRequest(format string, args ...any) *Error {
	return ErrBadRequest.With(format, args...)
}

// CodeInternal is the code of an error that is no refusal.
const CodeInternal = "internal"

// Code is err's refusal code, or CodeInternal; a label value from a
// closed set.
func Code(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return CodeInternal
}
