package schema

import (
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/vmihailenco/msgpack/v5"
)

// Bytes is an octet sequence (the IDL's sequence<octet>). In JSON it is a
// lowercase hexadecimal string; in msgpack it is bin. Decoding JSON accepts
// lowercase hex only, so every value has exactly one JSON form.
type Bytes []byte

// String returns b as lowercase hex.
func (b Bytes) String() string { return hex.EncodeToString(b) }

// Equal reports whether b and o hold the same octets.
func (b Bytes) Equal(o Bytes) bool { return string(b) == string(o) }

// MarshalText encodes b as lowercase hex; encoding/json uses it.
func (b Bytes) MarshalText() ([]byte, error) {
	out := make([]byte, hex.EncodedLen(len(b)))
	hex.Encode(out, b)
	return out, nil
}

// UnmarshalText decodes lowercase hex into b.
func (b *Bytes) UnmarshalText(text []byte) error {
	v, err := decodeLowerHex(text)
	if err != nil {
		return err
	}
	*b = v
	return nil
}

// EncodeMsgpack encodes b as msgpack bin. It takes precedence over
// MarshalText in the msgpack library, which would otherwise write a string.
func (b Bytes) EncodeMsgpack(enc *msgpack.Encoder) error {
	return enc.EncodeBytes(b)
}

// DecodeMsgpack decodes msgpack bin into b. Nil decodes to nil. The
// declared length is not trusted: bytes are read in chunks of at most
// binChunk, so a header claiming more than the input holds fails at the
// end of the input having allocated about what the input held.
func (b *Bytes) DecodeMsgpack(dec *msgpack.Decoder) error {
	n, err := dec.DecodeBytesLen()
	if err != nil {
		return err
	}
	if n < 0 {
		*b = nil
		return nil
	}
	v := make(Bytes, 0, min(n, binChunk))
	for len(v) < n {
		k := min(n-len(v), binChunk)
		v = append(v, make([]byte, k)...)
		if err := dec.ReadFull(v[len(v)-k:]); err != nil {
			return fmt.Errorf("bin of %d bytes: %w", n, err)
		}
	}
	*b = v
	return nil
}

// binChunk is how much DecodeMsgpack reads ahead of the input it has seen.
const binChunk = 64 << 10

// errHex is the reason every malformed hex string reports.
var errHex = errors.New("not lowercase hexadecimal of even length")

// decodeLowerHex decodes an even-length lowercase hex string. It never
// returns nil for valid input, so an empty string gives an empty, non-nil
// value.
func decodeLowerHex(s []byte) (Bytes, error) {
	if len(s)%2 != 0 {
		return nil, errHex
	}
	out := make(Bytes, len(s)/2)
	for i := 0; i < len(out); i++ {
		hi, ok1 := lowerHexNibble(s[2*i])
		lo, ok2 := lowerHexNibble(s[2*i+1])
		if !ok1 || !ok2 {
			return nil, fmt.Errorf("%w at offset %d", errHex, 2*i)
		}
		out[i] = hi<<4 | lo
	}
	return out, nil
}

func lowerHexNibble(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	}
	return 0, false
}

// isLowerHex reports whether s is non-empty, even-length lowercase hex.
func isLowerHex(s string) bool {
	if s == "" || len(s)%2 != 0 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if _, ok := lowerHexNibble(s[i]); !ok {
			return false
		}
	}
	return true
}
