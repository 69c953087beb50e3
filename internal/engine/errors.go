package engine

import (
	"errors"
	"regexp"
	"strings"
	"unicode/utf8"

	"github.com/fabric-mls/fabric/pkg/schema"
)

// Error is a failure with the Marmot category it maps to (DESIGN §4). Op
// names the engine operation; Err is the cause, for errors.Is and errors.As.
type Error struct {
	Op       string
	Category schema.Category
	Err      error
}

// hexRun matches what could be an id, a key or ciphertext in a cause's text.
var hexRun = regexp.MustCompile(`[0-9a-fA-F]{16,}`)

// Error returns a message with long hexadecimal runs redacted: mls-go's
// messages sometimes print group ids or keys, and error strings must not.
func (e *Error) Error() string {
	msg := "engine: " + e.Op + ": " + string(e.Category)
	if e.Err != nil {
		msg += ": " + hexRun.ReplaceAllString(e.Err.Error(), "<redacted>")
	}
	return msg
}

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Err }

// CategoryOf returns the category of the first *Error in err's chain, or ""
// when there is none.
func CategoryOf(err error) schema.Category {
	var e *Error
	if errors.As(err, &e) {
		return e.Category
	}
	return ""
}

// ReasonOf returns what went wrong in the first *Error of err's chain, as
// an outcome record's reason says it: the operation and the cause, long
// hexadecimal runs redacted, cut to schema.MaxOutcomeReason bytes; "" when
// there is none.
func ReasonOf(err error) string {
	var e *Error
	if !errors.As(err, &e) || e.Err == nil {
		return ""
	}
	r := e.Op + ": " + hexRun.ReplaceAllString(e.Err.Error(), "<redacted>")
	r = strings.ToValidUTF8(r, "?")
	if len(r) > schema.MaxOutcomeReason {
		cut := schema.MaxOutcomeReason
		for !utf8.RuneStart(r[cut]) {
			cut--
		}
		r = r[:cut]
	}
	return r
}

func fail(op string, c schema.Category, err error) error {
	return &Error{Op: op, Category: c, Err: err}
}

// Sentinel causes, for errors.Is.
var (
	// ErrTruncated: the bytes end inside a field.
	ErrTruncated = errors.New("truncated")
	// ErrTrailing: bytes follow a complete structure.
	ErrTrailing = errors.New("trailing bytes")
	// ErrVarint: a length is not a minimal RFC 9420 §2.1.2 varint.
	ErrVarint = errors.New("invalid variable-length integer")
	// ErrVersion: the protocol version is not mls10.
	ErrVersion = errors.New("unsupported protocol version")
	// ErrWireFormat: the wire format is not one the fabric processes.
	ErrWireFormat = errors.New("unsupported wire format")
	// ErrCipherSuite: the cipher suite is not one mls-go implements (1–3).
	ErrCipherSuite = errors.New("unsupported cipher suite")
	// ErrContentType: the content type is not application, proposal or commit.
	ErrContentType = errors.New("invalid content type")
	// ErrSenderType: the sender type is not defined by RFC 9420.
	ErrSenderType = errors.New("invalid sender type")
	// ErrWrongGroup: the message names another group than the state.
	ErrWrongGroup = errors.New("message for another group")
	// ErrWrongEpoch: the message is of an earlier epoch than the state's
	// (category stale_epoch against this state).
	ErrWrongEpoch = errors.New("message for an earlier epoch")
	// ErrFutureEpoch: the message is of a later epoch than the state's; its
	// parent state is not here yet, so convergence defers it (category
	// missing_history).
	ErrFutureEpoch = errors.New("message for a later epoch")
	// ErrNotHandshake: a handshake was expected (PublicMessage commit or proposal).
	ErrNotHandshake = errors.New("not a PublicMessage commit or proposal")
	// ErrNotApplication: an application PrivateMessage was expected.
	ErrNotApplication = errors.New("not an application PrivateMessage")
	// ErrNoKeyPackage: no KeyPackage of the installation matches the Welcome.
	ErrNoKeyPackage = errors.New("welcome names no KeyPackage of this installation")
	// ErrUnsupportedExtension: a KeyPackage to add does not list every
	// non-default extension of the group's GroupContext in its
	// capabilities (RFC 9420 §13, the adder's check).
	ErrUnsupportedExtension = errors.New("key package does not support every GroupContext extension")
	// ErrSealed: sealed installation bytes do not open under the master key.
	ErrSealed = errors.New("sealed installation does not open")
)

// ErrParserPanic: mls-go panicked on the input; the engine turned the panic
// into an invalid_encoding error (missing_history in Restore) so malformed
// input can never crash a role.
var ErrParserPanic = errors.New("mls parser rejected the input")

// recoverDecode is deferred by every entry point that hands received bytes to
// mls-go.
func recoverDecode(op string, err *error) {
	if r := recover(); r != nil {
		*err = fail(op, schema.CategoryInvalidEncoding, ErrParserPanic)
	}
}
