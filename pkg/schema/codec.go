package schema

import (
	"encoding/binary"
	"math"
	"unicode/utf8"
)

// This file holds the two wire formats behind one writer and one reader, so
// each type has a single encode and a single decode function. Both are
// hand-written: msgpack encoding appends without reflection, and decoding is
// strict by construction, since a member a type does not define is an error
// rather than something to skip.

// writer appends one value in msgpack or JSON.
type writer struct {
	buf   []byte
	start int // where this value starts in buf: no separator before it
	json  bool
}

// sep writes the JSON separator a value or key needs.
func (w *writer) sep() {
	if len(w.buf) == w.start {
		return
	}
	switch w.buf[len(w.buf)-1] {
	case '{', '[', ':':
		return
	}
	w.buf = append(w.buf, ',')
}

func (w *writer) mapStart(n int) {
	if w.json {
		w.sep()
		w.buf = append(w.buf, '{')
		return
	}
	switch {
	case n < 16:
		w.buf = append(w.buf, 0x80|byte(n))
	case n <= math.MaxUint16:
		w.buf = append(w.buf, 0xde, byte(n>>8), byte(n))
	default:
		w.buf = append(w.buf, 0xdf)
		w.buf = binary.BigEndian.AppendUint32(w.buf, uint32(n))
	}
}

func (w *writer) mapEnd() {
	if w.json {
		w.buf = append(w.buf, '}')
	}
}

func (w *writer) arrayStart(n int) {
	if w.json {
		w.sep()
		w.buf = append(w.buf, '[')
		return
	}
	switch {
	case n < 16:
		w.buf = append(w.buf, 0x90|byte(n))
	case n <= math.MaxUint16:
		w.buf = append(w.buf, 0xdc, byte(n>>8), byte(n))
	default:
		w.buf = append(w.buf, 0xdd)
		w.buf = binary.BigEndian.AppendUint32(w.buf, uint32(n))
	}
}

func (w *writer) arrayEnd() {
	if w.json {
		w.buf = append(w.buf, ']')
	}
}

// key writes a member name. Names are this package's constants: plain
// ASCII that JSON needs no escape for.
func (w *writer) key(k string) {
	if w.json {
		w.sep()
		w.buf = append(w.buf, '"')
		w.buf = append(w.buf, k...)
		w.buf = append(w.buf, '"', ':')
		return
	}
	w.msgpackStr(k)
}

func (w *writer) str(s string) {
	if w.json {
		w.sep()
		w.jsonStr(s)
		return
	}
	w.msgpackStr(s)
}

func (w *writer) msgpackStr(s string) {
	n := len(s)
	switch {
	case n < 32:
		w.buf = append(w.buf, 0xa0|byte(n))
	case n <= math.MaxUint8:
		w.buf = append(w.buf, 0xd9, byte(n))
	case n <= math.MaxUint16:
		w.buf = append(w.buf, 0xda, byte(n>>8), byte(n))
	default:
		w.buf = append(w.buf, 0xdb)
		w.buf = binary.BigEndian.AppendUint32(w.buf, uint32(n))
	}
	w.buf = append(w.buf, s...)
}

const hexDigits = "0123456789abcdef"

// jsonStr writes s as a JSON string. Control characters, U+2028 and U+2029
// are escaped; invalid UTF-8 (which Validate refuses) becomes U+FFFD.
func (w *writer) jsonStr(s string) {
	w.buf = append(w.buf, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			w.buf = append(w.buf, s[start:i]...)
			switch c {
			case '"', '\\':
				w.buf = append(w.buf, '\\', c)
			case '\n':
				w.buf = append(w.buf, '\\', 'n')
			case '\r':
				w.buf = append(w.buf, '\\', 'r')
			case '\t':
				w.buf = append(w.buf, '\\', 't')
			default:
				w.buf = append(w.buf, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			w.buf = append(w.buf, s[start:i]...)
			w.buf = append(w.buf, `\ufffd`...)
			i++
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			w.buf = append(w.buf, s[start:i]...)
			w.buf = append(w.buf, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	w.buf = append(w.buf, s[start:]...)
	w.buf = append(w.buf, '"')
}

// bin writes octets: msgpack bin, or a lowercase hex JSON string.
func (w *writer) bin(b []byte) {
	if w.json {
		w.sep()
		w.buf = append(w.buf, '"')
		for _, c := range b {
			w.buf = append(w.buf, hexDigits[c>>4], hexDigits[c&0xf])
		}
		w.buf = append(w.buf, '"')
		return
	}
	n := len(b)
	switch {
	case n <= math.MaxUint8:
		w.buf = append(w.buf, 0xc4, byte(n))
	case n <= math.MaxUint16:
		w.buf = append(w.buf, 0xc5, byte(n>>8), byte(n))
	default:
		w.buf = append(w.buf, 0xc6)
		w.buf = binary.BigEndian.AppendUint32(w.buf, uint32(n))
	}
	w.buf = append(w.buf, b...)
}

// uint writes an unsigned integer in its shortest msgpack form.
func (w *writer) uint(u uint64) {
	if w.json {
		w.sep()
		w.buf = appendUintDecimal(w.buf, u)
		return
	}
	switch {
	case u < 128:
		w.buf = append(w.buf, byte(u))
	case u <= math.MaxUint8:
		w.buf = append(w.buf, 0xcc, byte(u))
	case u <= math.MaxUint16:
		w.buf = append(w.buf, 0xcd, byte(u>>8), byte(u))
	case u <= math.MaxUint32:
		w.buf = append(w.buf, 0xce)
		w.buf = binary.BigEndian.AppendUint32(w.buf, uint32(u))
	default:
		w.buf = append(w.buf, 0xcf)
		w.buf = binary.BigEndian.AppendUint64(w.buf, u)
	}
}

func appendUintDecimal(b []byte, u uint64) []byte {
	var tmp [20]byte
	i := len(tmp)
	for {
		i--
		tmp[i] = byte('0' + u%10)
		u /= 10
		if u == 0 {
			break
		}
	}
	return append(b, tmp[i:]...)
}

func (w *writer) boolean(v bool) {
	if w.json {
		w.sep()
		if v {
			w.buf = append(w.buf, "true"...)
		} else {
			w.buf = append(w.buf, "false"...)
		}
		return
	}
	if v {
		w.buf = append(w.buf, 0xc3)
	} else {
		w.buf = append(w.buf, 0xc2)
	}
}
