// Package binding implements the transport binding fabric-native/1 (DESIGN
// section 3): a transport message carries an MLSMessage either as is (kind
// "mls") or sealed under the group event key of the epoch it was sent in
// (kind "sealed"). Peeling recovers the MLSMessage bytes, from which the
// message id is computed, so a re-wrapped copy is a duplicate.
//
// The binding is documented in docs/protocol.md, section "Transport binding
// fabric-native/1".
package binding

import (
	"crypto/cipher"
	"errors"
	"fmt"
	"io"

	"golang.org/x/crypto/chacha20poly1305"

	"github.com/fabric-mls/fabric/pkg/schema"
)

// Name is the binding's name.
const Name = "fabric-native/1"

// The group event key is MLS-Exporter(ExporterLabel, ExporterContext,
// KeySize) of the epoch a message was sent in.
const (
	ExporterLabel   = "fabric"
	ExporterContext = "group-event"
	KeySize         = chacha20poly1305.KeySize
	NonceSize       = chacha20poly1305.NonceSize
	// Overhead is what sealing adds to an MLSMessage: nonce and tag.
	Overhead = NonceSize + chacha20poly1305.Overhead
)

// Error is a peel failure together with the outcome category the input gets.
// Compare with errors.Is against the sentinels below; use errors.As to read
// the category.
type Error struct {
	Category schema.Category
	reason   string
}

func (e *Error) Error() string { return "fabric-native/1: " + e.reason }

// Sentinel peel failures.
var (
	// ErrTransportDeferred: no candidate key opens a sealed payload. The input
	// is retained and retried when the group's key set changes.
	ErrTransportDeferred = &Error{Category: schema.CategoryTransportDeferred, reason: "no candidate key opens the sealed payload"}
	// ErrInvalidEncoding: the transport message breaks the binding's rules
	// (version, kind, payload length).
	ErrInvalidEncoding = &Error{Category: schema.CategoryInvalidEncoding, reason: "malformed transport message"}
)

// Exporter is what GroupEventKey needs from an MLS group state;
// *group.Group of mls-go satisfies it.
type Exporter interface {
	Export(label string, context []byte, length int) ([]byte, error)
}

// GroupEventKey derives the group event key of the state's current epoch.
func GroupEventKey(state Exporter) ([KeySize]byte, error) {
	var key [KeySize]byte
	secret, err := state.Export(ExporterLabel, []byte(ExporterContext), KeySize)
	if err != nil {
		return key, fmt.Errorf("group event key: %w", err)
	}
	if len(secret) != KeySize {
		return key, fmt.Errorf("group event key: exporter returned %d bytes", len(secret))
	}
	copy(key[:], secret)
	return key, nil
}

// Seal returns nonce || ChaCha20-Poly1305(key, nonce, mlsMessage, aad=""),
// with a fresh nonce read from rand.
func Seal(key [KeySize]byte, mlsMessage []byte, rand io.Reader) ([]byte, error) {
	aead, err := chacha20poly1305.New(key[:])
	if err != nil {
		return nil, fmt.Errorf("seal: %w", err)
	}
	out := make([]byte, NonceSize, Overhead+len(mlsMessage))
	if _, err := io.ReadFull(rand, out); err != nil {
		return nil, fmt.Errorf("seal: nonce: %w", err)
	}
	return aead.Seal(out, out, mlsMessage, nil), nil
}

// Open reverses Seal. It returns ErrTransportDeferred when key does not open
// sealed and ErrInvalidEncoding when sealed is too short to hold a tag.
func Open(key [KeySize]byte, sealed []byte) ([]byte, error) {
	if len(sealed) < Overhead {
		return nil, fmt.Errorf("open: sealed payload shorter than %d bytes: %w", Overhead, ErrInvalidEncoding)
	}
	aead, err := chacha20poly1305.New(key[:])
	if err != nil {
		return nil, fmt.Errorf("open: %w", err)
	}
	return open(aead, nil, sealed)
}

// open decrypts sealed into dst's spare capacity.
func open(aead cipher.AEAD, dst, sealed []byte) ([]byte, error) {
	nonce, ct := sealed[:NonceSize], sealed[NonceSize:]
	pt, err := aead.Open(dst, nonce, ct, nil)
	if err != nil {
		return nil, ErrTransportDeferred
	}
	return pt, nil
}

// Peel returns the MLSMessage bytes a transport message carries. A sealed
// payload is tried with every candidate key, the keys of every retained state
// of the group; if none opens it, Peel returns ErrTransportDeferred. Peel does
// not parse the MLSMessage: classification is the caller's next step.
func Peel(msg schema.TransportMessage, candidateKeys [][KeySize]byte) ([]byte, error) {
	// The transport message's own rules (version, kind, lengths) live in
	// pkg/schema; a violation is invalid_encoding.
	if err := msg.Validate(); err != nil {
		return nil, fmt.Errorf("peel: %w: %w", err, ErrInvalidEncoding)
	}
	if msg.Kind == schema.TransportMLS {
		return msg.Payload, nil
	}
	// One output buffer serves every attempt: a failed Open leaves it unused.
	dst := make([]byte, 0, len(msg.Payload)-Overhead)
	for i := range candidateKeys {
		aead, err := chacha20poly1305.New(candidateKeys[i][:])
		if err != nil {
			return nil, fmt.Errorf("peel: %w", err)
		}
		pt, err := open(aead, dst, msg.Payload)
		if errors.Is(err, ErrTransportDeferred) {
			continue
		}
		if err == nil && len(pt) == 0 {
			return nil, fmt.Errorf("peel: sealed an empty MLSMessage: %w", ErrInvalidEncoding)
		}
		return pt, err
	}
	return nil, fmt.Errorf("peel: %d candidate keys: %w", len(candidateKeys), ErrTransportDeferred)
}
