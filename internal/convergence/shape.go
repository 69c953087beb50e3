package convergence

import (
	"encoding/binary"
	"errors"
)

// maxShapeDepth bounds msgpack nesting in persisted bytes; the format
// nests four levels.
const maxShapeDepth = 16

var errShape = errors.New("msgpack structure is malformed or claims more than it holds")

// checkShape walks msgpack bytes before they are decoded: one complete
// value, no container or string claiming more elements or bytes than the
// input holds, bounded nesting. The decoder preallocates from claimed
// lengths, so this keeps damaged bytes from exhausting memory.
func checkShape(b []byte) error {
	rest, err := skipValue(b, 0)
	if err != nil {
		return err
	}
	if len(rest) != 0 {
		return errShape
	}
	return nil
}

func skipValue(b []byte, depth int) ([]byte, error) {
	if len(b) == 0 || depth > maxShapeDepth {
		return nil, errShape
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
	return nil, errShape
}

func readLen(b []byte, width int) (uint64, []byte, error) {
	if len(b) < width {
		return 0, nil, errShape
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
		return nil, errShape
	}
	return b[n:], nil
}

// skipN skips n values; each needs at least one byte, so a count beyond
// the remaining input is refused before any walk.
func skipN(b []byte, n uint64, depth int) ([]byte, error) {
	if n > uint64(len(b)) {
		return nil, errShape
	}
	var err error
	for range n {
		if b, err = skipValue(b, depth+1); err != nil {
			return nil, err
		}
	}
	return b, nil
}
