package schema

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/vmihailenco/msgpack/v5"
)

// The msgpack library allocates whatever length a bin, string, array or map
// header declares before it reads the bytes behind it, so a few bytes of
// input could claim gigabytes. Every msgpack the fabric decodes with the
// library goes through NewMsgpackDecoder or UnmarshalMsgpack, which first
// walk the bytes: after that walk no declared length exceeds the input, and
// what the library allocates is bounded by a small multiple of it.

// MaxMsgpackDepth bounds the nesting of containers CheckMsgpack accepts, so
// decoding (which recurses per level) needs bounded stack.
const MaxMsgpackDepth = 32

// ErrMsgpackShape is the cause CheckMsgpack reports.
var ErrMsgpackShape = errors.New("msgpack is malformed, nested too deep, or claims more than it holds")

// CheckMsgpack reports whether b is exactly one msgpack value in which no
// bin, string or extension claims more bytes, and no array or map more
// elements, than remain in b, nested at most MaxMsgpackDepth containers.
// It allocates nothing. Errors wrap ErrMsgpackShape.
func CheckMsgpack(b []byte) error {
	rest, err := skipValue(b, 0)
	if err != nil {
		return err
	}
	if len(rest) != 0 {
		return fmt.Errorf("%w: trailing data after the value", ErrMsgpackShape)
	}
	return nil
}

// NewMsgpackDecoder checks b with CheckMsgpack and returns a decoder for
// its one value. Callers set decoder options (DisallowUnknownFields)
// themselves.
func NewMsgpackDecoder(b []byte) (*msgpack.Decoder, error) {
	if err := CheckMsgpack(b); err != nil {
		return nil, err
	}
	return msgpack.NewDecoder(bytes.NewReader(b)), nil
}

// UnmarshalMsgpack is msgpack.Unmarshal after CheckMsgpack: b must be
// exactly one value, and members v does not define are skipped.
func UnmarshalMsgpack(b []byte, v any) error {
	dec, err := NewMsgpackDecoder(b)
	if err != nil {
		return err
	}
	return dec.Decode(v)
}

func skipValue(b []byte, depth int) ([]byte, error) {
	if len(b) == 0 {
		return nil, fmt.Errorf("%w: unexpected end of input", ErrMsgpackShape)
	}
	c, b := b[0], b[1:]
	switch {
	case c <= 0x7f || c >= 0xe0 || c == 0xc0 || c == 0xc2 || c == 0xc3:
		return b, nil
	case c >= 0x80 && c <= 0x8f:
		return skipN(b, 2*uint64(c&0x0f), depth)
	case c >= 0x90 && c <= 0x9f:
		return skipN(b, uint64(c&0x0f), depth)
	case c >= 0xa0 && c <= 0xbf:
		return skipBytes(b, uint64(c&0x1f))
	}
	switch c {
	case 0xc4, 0xd9:
		return skipLen(b, 1, 0)
	case 0xc5, 0xda:
		return skipLen(b, 2, 0)
	case 0xc6, 0xdb:
		return skipLen(b, 4, 0)
	case 0xc7:
		return skipLen(b, 1, 1)
	case 0xc8:
		return skipLen(b, 2, 1)
	case 0xc9:
		return skipLen(b, 4, 1)
	case 0xcc, 0xd0:
		return skipBytes(b, 1)
	case 0xcd, 0xd1:
		return skipBytes(b, 2)
	case 0xca, 0xce, 0xd2:
		return skipBytes(b, 4)
	case 0xcb, 0xcf, 0xd3:
		return skipBytes(b, 8)
	case 0xd4, 0xd5, 0xd6, 0xd7, 0xd8:
		return skipBytes(b, 1+(uint64(1)<<(c-0xd4)))
	case 0xdc, 0xdd, 0xde, 0xdf:
		width := 2
		if c == 0xdd || c == 0xdf {
			width = 4
		}
		n, rest, err := readLen(b, width)
		if err != nil {
			return nil, err
		}
		if c >= 0xde {
			n *= 2
		}
		return skipN(rest, n, depth)
	}
	return nil, fmt.Errorf("%w: unused code 0x%02x", ErrMsgpackShape, c)
}

func readLen(b []byte, width int) (uint64, []byte, error) {
	if len(b) < width {
		return 0, nil, fmt.Errorf("%w: unexpected end of input", ErrMsgpackShape)
	}
	switch width {
	case 1:
		return uint64(b[0]), b[1:], nil
	case 2:
		return uint64(binary.BigEndian.Uint16(b)), b[2:], nil
	}
	return uint64(binary.BigEndian.Uint32(b)), b[4:], nil
}

func skipLen(b []byte, width int, extra uint64) ([]byte, error) {
	n, rest, err := readLen(b, width)
	if err != nil {
		return nil, err
	}
	return skipBytes(rest, n+extra)
}

func skipBytes(b []byte, n uint64) ([]byte, error) {
	if n > uint64(len(b)) {
		return nil, fmt.Errorf("%w: %d bytes declared, %d remain", ErrMsgpackShape, n, len(b))
	}
	return b[n:], nil
}

// skipN skips the n values of a container; each needs at least one byte,
// so a count beyond the remaining input is refused before any walk.
func skipN(b []byte, n uint64, depth int) ([]byte, error) {
	if n > uint64(len(b)) {
		return nil, fmt.Errorf("%w: %d elements declared, %d bytes remain", ErrMsgpackShape, n, len(b))
	}
	if depth >= MaxMsgpackDepth {
		return nil, fmt.Errorf("%w: nested deeper than %d", ErrMsgpackShape, MaxMsgpackDepth)
	}
	var err error
	for range n {
		if b, err = skipValue(b, depth+1); err != nil {
			return nil, err
		}
	}
	return b, nil
}
