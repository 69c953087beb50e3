package schema

import (
	"encoding/binary"
	"math"
	"math/bits"
	"unicode/utf16"
	"unicode/utf8"
	"unsafe"
)

// readErr is a malformation found by the reader; the decode functions turn
// it into a DecodeError naming the member.
type readErr struct{ reason string }

func (e *readErr) Error() string { return e.reason }

var (
	errEOF        = &readErr{"unexpected end of input"}
	errWantMap    = &readErr{"want a map"}
	errWantArray  = &readErr{"want an array"}
	errWantStr    = &readErr{"want a string"}
	errWantBin    = &readErr{"want octets"}
	errWantUint   = &readErr{"want an unsigned integer"}
	errWantBool   = &readErr{"want a boolean"}
	errTooLong    = &readErr{"length exceeds the input"}
	errRange      = &readErr{"integer out of range"}
	errNull       = &readErr{"null is not allowed: omit an absent member"}
	errTrailing   = &readErr{"trailing data after the value"}
	errJSONSyntax = &readErr{"invalid JSON syntax"}
	errJSONString = &readErr{"invalid JSON string"}
)

// reader reads one value in msgpack or JSON.
type reader struct {
	data []byte
	pos  int
	json bool
	// arena backs decoded octets, so one value's byte members share one
	// allocation.
	arena []byte
	// view makes msgpack strings and octets point into data instead of
	// copying them (ClientEvent.UnmarshalMsgpackView).
	view bool
}

// iter is the state of a map or array being read.
type iter struct {
	n       int // msgpack: entries left
	started bool
}

func (r *reader) format() string {
	if r.json {
		return "json"
	}
	return "msgpack"
}

// wrap prefixes member to err's path, turning a reader error into a
// DecodeError.
func (r *reader) wrap(member string, err error) error {
	switch e := err.(type) {
	case *DecodeError:
		e.Member = path(member, e.Member)
		return e
	case *ValidationError:
		return err
	case *readErr:
		return &DecodeError{Format: r.format(), Member: member, Err: ErrMalformed, Reason: e.reason}
	}
	return &DecodeError{Format: r.format(), Member: member, Err: ErrMalformed, Reason: err.Error()}
}

// fields reads a map whose members are names (at most 64), calling fn with
// each member's index to read its value. Unknown, duplicate and missing
// required members (bits of required) are errors.
func (r *reader) fields(names []string, required uint64, fn func(i int) error) error {
	it, err := r.mapOpen()
	if err != nil {
		return r.wrap("", err)
	}
	var seen uint64
	for {
		k, ok, err := r.mapNext(&it)
		if err != nil {
			return r.wrap("", err)
		}
		if !ok {
			break
		}
		i := indexOf(names, k)
		if i < 0 {
			return &DecodeError{Format: r.format(), Err: ErrUnknownMember, Reason: quoteName(k)}
		}
		if seen&(1<<i) != 0 {
			return &DecodeError{Format: r.format(), Member: names[i], Err: ErrDuplicateMember}
		}
		seen |= 1 << i
		if err := fn(i); err != nil {
			return r.wrap(names[i], err)
		}
	}
	if miss := required &^ seen; miss != 0 {
		return &DecodeError{Format: r.format(), Member: names[bits.TrailingZeros64(miss)], Err: ErrMissingMember}
	}
	return nil
}

func indexOf(names []string, k []byte) int {
	for i, n := range names {
		if n == string(k) {
			return i
		}
	}
	return -1
}

// end checks that nothing but JSON whitespace follows the value.
func (r *reader) end() error {
	if r.json {
		r.skipSpace()
	}
	if r.pos != len(r.data) {
		return errTrailing
	}
	return nil
}

func (r *reader) skipSpace() {
	for r.pos < len(r.data) {
		switch r.data[r.pos] {
		case ' ', '\t', '\n', '\r':
			r.pos++
		default:
			return
		}
	}
}

// peek returns the next byte (after JSON whitespace).
func (r *reader) peek() (byte, error) {
	if r.json {
		r.skipSpace()
	}
	if r.pos >= len(r.data) {
		return 0, errEOF
	}
	return r.data[r.pos], nil
}

// take returns the next n bytes.
func (r *reader) take(n int) ([]byte, error) {
	if n < 0 || n > len(r.data)-r.pos {
		return nil, errTooLong
	}
	b := r.data[r.pos : r.pos+n]
	r.pos += n
	return b, nil
}

// msgpackLen reads a big-endian length of size 1, 2 or 4 bytes.
func (r *reader) msgpackLen(size int) (int, error) {
	b, err := r.take(size)
	if err != nil {
		return 0, errEOF
	}
	switch size {
	case 1:
		return int(b[0]), nil
	case 2:
		return int(binary.BigEndian.Uint16(b)), nil
	}
	n := binary.BigEndian.Uint32(b)
	if uint64(n) > uint64(len(r.data)) {
		return 0, errTooLong
	}
	return int(n), nil
}

func (r *reader) mapOpen() (iter, error) {
	c, err := r.peek()
	if err != nil {
		return iter{}, err
	}
	if r.json {
		if c == 'n' {
			return iter{}, errNull
		}
		if c != '{' {
			return iter{}, errWantMap
		}
		r.pos++
		return iter{}, nil
	}
	r.pos++
	var n int
	switch {
	case c&0xf0 == 0x80:
		n = int(c & 0x0f)
	case c == 0xde:
		n, err = r.msgpackLen(2)
	case c == 0xdf:
		n, err = r.msgpackLen(4)
	case c == 0xc0:
		return iter{}, errNull
	default:
		return iter{}, errWantMap
	}
	if err != nil {
		return iter{}, err
	}
	if n > (len(r.data)-r.pos)/2 {
		return iter{}, errTooLong
	}
	return iter{n: n}, nil
}

// mapNext reads the next member name of a map, or reports its end.
func (r *reader) mapNext(it *iter) ([]byte, bool, error) {
	if !r.json {
		if it.n == 0 {
			return nil, false, nil
		}
		it.n--
		k, err := r.strBytes()
		return k, true, err
	}
	more, err := r.jsonNext(it, '}')
	if err != nil || !more {
		return nil, false, err
	}
	if c, err := r.peek(); err != nil {
		return nil, false, err
	} else if c != '"' {
		return nil, false, errJSONSyntax
	}
	k, err := r.strBytes()
	if err != nil {
		return nil, false, err
	}
	if c, err := r.peek(); err != nil {
		return nil, false, err
	} else if c != ':' {
		return nil, false, errJSONSyntax
	}
	r.pos++
	return k, true, nil
}

// jsonNext consumes the separator before the next element of a JSON object
// or array, or its closing byte.
func (r *reader) jsonNext(it *iter, closing byte) (bool, error) {
	c, err := r.peek()
	if err != nil {
		return false, err
	}
	if c == closing {
		r.pos++
		return false, nil
	}
	if it.started {
		if c != ',' {
			return false, errJSONSyntax
		}
		r.pos++
		if c, err = r.peek(); err != nil {
			return false, err
		}
		if c == closing {
			return false, errJSONSyntax // trailing comma
		}
	}
	it.started = true
	return true, nil
}

func (r *reader) arrayOpen() (iter, error) {
	c, err := r.peek()
	if err != nil {
		return iter{}, err
	}
	if r.json {
		if c == 'n' {
			return iter{}, errNull
		}
		if c != '[' {
			return iter{}, errWantArray
		}
		r.pos++
		return iter{}, nil
	}
	r.pos++
	var n int
	switch {
	case c&0xf0 == 0x90:
		n = int(c & 0x0f)
	case c == 0xdc:
		n, err = r.msgpackLen(2)
	case c == 0xdd:
		n, err = r.msgpackLen(4)
	case c == 0xc0:
		return iter{}, errNull
	default:
		return iter{}, errWantArray
	}
	if err != nil {
		return iter{}, err
	}
	if n > len(r.data)-r.pos {
		return iter{}, errTooLong
	}
	return iter{n: n}, nil
}

// arrayNext reports whether another element follows.
func (r *reader) arrayNext(it *iter) (bool, error) {
	if !r.json {
		if it.n == 0 {
			return false, nil
		}
		it.n--
		return true, nil
	}
	return r.jsonNext(it, ']')
}

// strBytes reads a string and returns its bytes, which may alias the input
// or be freshly made; the caller copies them if it keeps them.
func (r *reader) strBytes() ([]byte, error) {
	c, err := r.peek()
	if err != nil {
		return nil, err
	}
	if r.json {
		if c == 'n' {
			return nil, errNull
		}
		if c != '"' {
			return nil, errWantStr
		}
		return r.jsonString()
	}
	r.pos++
	var n int
	switch {
	case c&0xe0 == 0xa0:
		n = int(c & 0x1f)
	case c == 0xd9:
		n, err = r.msgpackLen(1)
	case c == 0xda:
		n, err = r.msgpackLen(2)
	case c == 0xdb:
		n, err = r.msgpackLen(4)
	case c == 0xc0:
		return nil, errNull
	default:
		return nil, errWantStr
	}
	if err != nil {
		return nil, err
	}
	return r.take(n)
}

func (r *reader) str() (string, error) {
	b, err := r.strBytes()
	if r.view && len(b) > 0 {
		return unsafe.String(&b[0], len(b)), err
	}
	return string(b), err
}

// bin reads octets: msgpack bin, or a lowercase hex JSON string. The result
// is never nil, and never aliases the input unless the reader is a view.
func (r *reader) bin() (Bytes, error) {
	if r.json {
		c, err := r.peek()
		if err != nil {
			return nil, err
		}
		if c == 'n' {
			return nil, errNull
		}
		if c != '"' {
			return nil, errWantBin
		}
		s, err := r.jsonString()
		if err != nil {
			return nil, err
		}
		b, err := decodeLowerHex(s)
		if err != nil {
			return nil, &readErr{err.Error()}
		}
		return b, nil
	}
	c, err := r.peek()
	if err != nil {
		return nil, err
	}
	r.pos++
	var n int
	switch c {
	case 0xc4:
		n, err = r.msgpackLen(1)
	case 0xc5:
		n, err = r.msgpackLen(2)
	case 0xc6:
		n, err = r.msgpackLen(4)
	case 0xc0:
		return nil, errNull
	default:
		return nil, errWantBin
	}
	if err != nil {
		return nil, err
	}
	b, err := r.take(n)
	if err != nil {
		return nil, err
	}
	if r.view {
		return b[:n:n], nil
	}
	out := r.alloc(n)
	copy(out, b)
	return out, nil
}

// alloc returns n fresh bytes. Small values share an arena sized by the
// input left (at most arenaSize), so one event's ids cost one allocation;
// large values, such as a transport payload, get their own.
func (r *reader) alloc(n int) Bytes {
	if n > len(r.arena) {
		if n > arenaSize/2 {
			return make(Bytes, n)
		}
		r.arena = make([]byte, max(n, min(n+len(r.data)-r.pos, arenaSize)))
	}
	out := r.arena[:n:n]
	r.arena = r.arena[n:]
	return out
}

const arenaSize = 512

// uint reads an unsigned integer no greater than max. msgpack accepts every
// integer form holding a non-negative value; JSON accepts digits only.
func (r *reader) uint(max uint64) (uint64, error) {
	c, err := r.peek()
	if err != nil {
		return 0, err
	}
	var u uint64
	if r.json {
		u, err = r.jsonUint()
	} else {
		u, err = r.msgpackUint(c)
	}
	if err != nil {
		return 0, err
	}
	if u > max {
		return 0, errRange
	}
	return u, nil
}

func (r *reader) msgpackUint(c byte) (uint64, error) {
	r.pos++
	if c <= 0x7f {
		return uint64(c), nil
	}
	var size int
	switch c {
	case 0xcc, 0xd0:
		size = 1
	case 0xcd, 0xd1:
		size = 2
	case 0xce, 0xd2:
		size = 4
	case 0xcf, 0xd3:
		size = 8
	case 0xc0:
		return 0, errNull
	default:
		if c >= 0xe0 { // negative fixint
			return 0, errRange
		}
		return 0, errWantUint
	}
	signed := c >= 0xd0
	b, err := r.take(size)
	if err != nil {
		return 0, errEOF
	}
	var u uint64
	for _, x := range b {
		u = u<<8 | uint64(x)
	}
	if signed && b[0]&0x80 != 0 {
		return 0, errRange
	}
	return u, nil
}

func (r *reader) jsonUint() (uint64, error) {
	start := r.pos
	var u uint64
	for r.pos < len(r.data) {
		c := r.data[r.pos]
		if c < '0' || c > '9' {
			break
		}
		hi, lo := bits.Mul64(u, 10)
		if hi != 0 || lo > math.MaxUint64-uint64(c-'0') {
			return 0, errRange
		}
		u = lo + uint64(c-'0')
		r.pos++
	}
	n := r.pos - start
	switch {
	case n == 0:
		if r.pos < len(r.data) && r.data[r.pos] == 'n' {
			return 0, errNull
		}
		if r.pos < len(r.data) && r.data[r.pos] == '-' {
			return 0, errRange
		}
		return 0, errWantUint
	case n > 1 && r.data[start] == '0':
		return 0, errJSONSyntax // leading zero
	}
	if r.pos < len(r.data) {
		switch r.data[r.pos] {
		case '.', 'e', 'E':
			return 0, errWantUint
		}
	}
	return u, nil
}

func (r *reader) boolean() (bool, error) {
	c, err := r.peek()
	if err != nil {
		return false, err
	}
	if !r.json {
		r.pos++
		switch c {
		case 0xc3:
			return true, nil
		case 0xc2:
			return false, nil
		case 0xc0:
			return false, errNull
		}
		return false, errWantBool
	}
	rest := r.data[r.pos:]
	switch {
	case len(rest) >= 4 && string(rest[:4]) == "true":
		r.pos += 4
		return true, nil
	case len(rest) >= 5 && string(rest[:5]) == "false":
		r.pos += 5
		return false, nil
	case len(rest) >= 4 && string(rest[:4]) == "null":
		return false, errNull
	}
	return false, errWantBool
}

// jsonString reads a JSON string at r.pos (which holds '"'). Without escapes
// the result aliases the input.
func (r *reader) jsonString() ([]byte, error) {
	r.pos++
	start := r.pos
	for r.pos < len(r.data) {
		c := r.data[r.pos]
		switch {
		case c == '"':
			s := r.data[start:r.pos]
			r.pos++
			return s, nil
		case c == '\\':
			return r.jsonStringEscaped(start)
		case c < 0x20:
			return nil, errJSONString
		}
		r.pos++
	}
	return nil, errEOF
}

func (r *reader) jsonStringEscaped(start int) ([]byte, error) {
	out := make([]byte, 0, r.pos-start+16)
	out = append(out, r.data[start:r.pos]...)
	for r.pos < len(r.data) {
		c := r.data[r.pos]
		switch {
		case c == '"':
			r.pos++
			return out, nil
		case c < 0x20:
			return nil, errJSONString
		case c != '\\':
			out = append(out, c)
			r.pos++
			continue
		}
		if r.pos+1 >= len(r.data) {
			return nil, errEOF
		}
		e := r.data[r.pos+1]
		r.pos += 2
		switch e {
		case '"', '\\', '/':
			out = append(out, e)
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		case 'u':
			rn, ok := r.hex4()
			if !ok {
				return nil, errJSONString
			}
			if utf16.IsSurrogate(rn) {
				rn2 := utf8.RuneError
				if r.pos+1 < len(r.data) && r.data[r.pos] == '\\' && r.data[r.pos+1] == 'u' {
					save := r.pos
					r.pos += 2
					if lo, ok := r.hex4(); ok && utf16.DecodeRune(rn, lo) != utf8.RuneError {
						rn2 = utf16.DecodeRune(rn, lo)
					} else {
						r.pos = save
					}
				}
				rn = rn2
			}
			out = utf8.AppendRune(out, rn)
		default:
			return nil, errJSONString
		}
	}
	return nil, errEOF
}

func (r *reader) hex4() (rune, bool) {
	if len(r.data)-r.pos < 4 {
		return 0, false
	}
	var v rune
	for _, c := range r.data[r.pos : r.pos+4] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c -= 'a' - 10
		case c >= 'A' && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, false
		}
		v = v<<4 | rune(c)
	}
	r.pos += 4
	return v, true
}
