package apppayload

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// The app payload uses a small subset of msgpack: maps with string keys,
// strings, binary, unsigned integers and nil. The reader below accepts every
// msgpack form of those types and nothing else, so a payload that another
// encoder wrote with str8 instead of fixstr still decodes, while a float
// where a version belongs does not.

// errShort reports input that ends inside a value.
var errShort = errors.New("truncated")

// reader walks msgpack bytes without allocating for headers. Every method
// checks bounds before slicing, so no input can make it panic.
type reader struct {
	b   []byte
	off int
}

func (r *reader) byte() (byte, error) {
	if r.off >= len(r.b) {
		return 0, errShort
	}
	c := r.b[r.off]
	r.off++
	return c, nil
}

func (r *reader) n(n int) ([]byte, error) {
	if n < 0 || n > len(r.b)-r.off {
		return nil, errShort
	}
	s := r.b[r.off : r.off+n : r.off+n]
	r.off += n
	return s, nil
}

func (r *reader) uintN(size int) (uint64, error) {
	s, err := r.n(size)
	if err != nil {
		return 0, err
	}
	switch size {
	case 1:
		return uint64(s[0]), nil
	case 2:
		return uint64(binary.BigEndian.Uint16(s)), nil
	case 4:
		return uint64(binary.BigEndian.Uint32(s)), nil
	default:
		return binary.BigEndian.Uint64(s), nil
	}
}

// peekNil consumes a nil and reports whether there was one.
func (r *reader) peekNil() bool {
	if r.off < len(r.b) && r.b[r.off] == 0xc0 {
		r.off++
		return true
	}
	return false
}

// mapLen reads a map header. The length is bounded by the bytes left (each
// entry takes at least two bytes), so a forged header cannot drive a large
// allocation or a long loop.
func (r *reader) mapLen() (int, error) {
	c, err := r.byte()
	if err != nil {
		return 0, err
	}
	var n uint64
	switch {
	case c >= 0x80 && c <= 0x8f:
		n = uint64(c & 0x0f)
	case c == 0xde:
		n, err = r.uintN(2)
	case c == 0xdf:
		n, err = r.uintN(4)
	default:
		return 0, fmt.Errorf("want map, got type 0x%02x", c)
	}
	if err != nil {
		return 0, err
	}
	if n > uint64(len(r.b)-r.off)/2 {
		return 0, errShort
	}
	return int(n), nil
}

// str reads a msgpack str (never bin).
func (r *reader) str() (string, error) {
	s, err := r.strBytes()
	return string(s), err
}

// strBytes reads a msgpack str and returns a view of its bytes, for keys that
// are only compared.
func (r *reader) strBytes() ([]byte, error) {
	c, err := r.byte()
	if err != nil {
		return nil, err
	}
	var n uint64
	switch {
	case c >= 0xa0 && c <= 0xbf:
		n = uint64(c & 0x1f)
	case c == 0xd9:
		n, err = r.uintN(1)
	case c == 0xda:
		n, err = r.uintN(2)
	case c == 0xdb:
		n, err = r.uintN(4)
	default:
		return nil, fmt.Errorf("want str, got type 0x%02x", c)
	}
	if err != nil {
		return nil, err
	}
	if n > math.MaxInt32 {
		return nil, errShort
	}
	return r.n(int(n))
}

// bin reads a msgpack bin (never str) and returns a copy.
func (r *reader) bin() ([]byte, error) {
	c, err := r.byte()
	if err != nil {
		return nil, err
	}
	var n uint64
	switch c {
	case 0xc4:
		n, err = r.uintN(1)
	case 0xc5:
		n, err = r.uintN(2)
	case 0xc6:
		n, err = r.uintN(4)
	default:
		return nil, fmt.Errorf("want bin, got type 0x%02x", c)
	}
	if err != nil {
		return nil, err
	}
	if n > math.MaxInt32 {
		return nil, errShort
	}
	s, err := r.n(int(n))
	if err != nil {
		return nil, err
	}
	return append([]byte{}, s...), nil
}

// uint32 reads a non-negative msgpack integer that fits in 32 bits. Signed
// forms are accepted when their value is non-negative, as some encoders
// write every integer signed.
func (r *reader) uint32() (uint32, error) {
	c, err := r.byte()
	if err != nil {
		return 0, err
	}
	var v uint64
	switch {
	case c <= 0x7f:
		v = uint64(c)
	case c == 0xcc, c == 0xd0:
		v, err = r.signedOr(c == 0xd0, 1)
	case c == 0xcd, c == 0xd1:
		v, err = r.signedOr(c == 0xd1, 2)
	case c == 0xce, c == 0xd2:
		v, err = r.signedOr(c == 0xd2, 4)
	case c == 0xcf, c == 0xd3:
		v, err = r.signedOr(c == 0xd3, 8)
	default:
		return 0, fmt.Errorf("want unsigned integer, got type 0x%02x", c)
	}
	if err != nil {
		return 0, err
	}
	if v > math.MaxUint32 {
		return 0, errors.New("integer out of range")
	}
	return uint32(v), nil
}

func (r *reader) signedOr(signed bool, size int) (uint64, error) {
	v, err := r.uintN(size)
	if err != nil || !signed {
		return v, err
	}
	if v>>(uint(size)*8-1) != 0 {
		return 0, errors.New("negative integer")
	}
	return v, nil
}

// end reports trailing bytes after the top-level value.
func (r *reader) end() error {
	if r.off != len(r.b) {
		return errors.New("trailing bytes")
	}
	return nil
}

// Writers append the shortest msgpack form.

func appendMapLen(b []byte, n int) []byte {
	switch {
	case n < 16:
		return append(b, 0x80|byte(n))
	case n <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(b, 0xde), uint16(n))
	default:
		return binary.BigEndian.AppendUint32(append(b, 0xdf), uint32(n))
	}
}

func appendStr(b []byte, s string) []byte {
	n := len(s)
	switch {
	case n < 32:
		b = append(b, 0xa0|byte(n))
	case n <= math.MaxUint8:
		b = append(b, 0xd9, byte(n))
	case n <= math.MaxUint16:
		b = binary.BigEndian.AppendUint16(append(b, 0xda), uint16(n))
	default:
		b = binary.BigEndian.AppendUint32(append(b, 0xdb), uint32(n))
	}
	return append(b, s...)
}

func appendBin(b []byte, p []byte) []byte {
	n := len(p)
	switch {
	case n <= math.MaxUint8:
		b = append(b, 0xc4, byte(n))
	case n <= math.MaxUint16:
		b = binary.BigEndian.AppendUint16(append(b, 0xc5), uint16(n))
	default:
		b = binary.BigEndian.AppendUint32(append(b, 0xc6), uint32(n))
	}
	return append(b, p...)
}

func appendUint(b []byte, v uint32) []byte {
	switch {
	case v <= 0x7f:
		return append(b, byte(v))
	case v <= math.MaxUint8:
		return append(b, 0xcc, byte(v))
	case v <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(b, 0xcd), uint16(v))
	default:
		return binary.BigEndian.AppendUint32(append(b, 0xce), v)
	}
}
