package engine

import (
	"crypto/sha256"

	"github.com/fabric-mls/fabric/pkg/schema"
)

// WireFormat is the MLSMessage wire format (RFC 9420 §6).
type WireFormat uint16

// Wire formats.
const (
	WirePublicMessage  WireFormat = 1
	WirePrivateMessage WireFormat = 2
	WireWelcome        WireFormat = 3
	WireGroupInfo      WireFormat = 4
	WireKeyPackage     WireFormat = 5
)

// ContentType is the FramedContent content type (RFC 9420 §6).
type ContentType uint8

// Content types.
const (
	ContentApplication ContentType = 1
	ContentProposal    ContentType = 2
	ContentCommit      ContentType = 3
)

// SenderType is the Sender type of a PublicMessage (RFC 9420 §6).
type SenderType uint8

// Sender types.
const (
	SenderMember            SenderType = 1
	SenderExternal          SenderType = 2
	SenderNewMemberProposal SenderType = 3
	SenderNewMemberCommit   SenderType = 4
)

// MessageID is SHA-256 of the MLSMessage bytes (DESIGN §2): the dedup id, and
// for a commit its commit_digest.
type MessageID [32]byte

// NewMessageID returns the id of MLSMessage bytes.
func NewMessageID(mlsMessage []byte) MessageID { return sha256.Sum256(mlsMessage) }

// Classification is what the cleartext header of an MLSMessage says.
type Classification struct {
	Class       schema.InputClass
	WireFormat  WireFormat
	ContentType ContentType // PublicMessage and PrivateMessage only
	// GroupID aliases the classified bytes (no copy, for speed); it is nil
	// for a Welcome and a KeyPackage, which do not show it.
	GroupID     []byte
	Epoch       uint64 // valid when HasEpoch
	HasEpoch    bool
	CipherSuite uint16     // Welcome, GroupInfo and KeyPackage only
	Sender      SenderType // PublicMessage only
	SenderIndex uint32     // PublicMessage member or external sender only
	MessageID   MessageID
}

// SupportedCipherSuite reports whether mls-go implements cs (RFC 9420 suites 1–3).
func SupportedCipherSuite(cs uint16) bool { return cs >= 1 && cs <= 3 }

// Classify reads the header of an MLSMessage (RFC 9420 §6): wire format,
// content type, group id and epoch where they are in the clear, and the
// message id. It walks the whole framing, and a Welcome's, GroupInfo's and
// KeyPackage's structure, to the last byte without decrypting or copying
// anything, so a cut, padded or garbled message is malformed here, before
// convergence. Malformed bytes fail closed with category
// invalid_encoding; another protocol version, an unknown wire format or an
// unimplemented cipher suite with unsupported_required_feature. It never
// panics on any input.
func Classify(mlsMessage []byte) (Classification, error) {
	c, err := classifyFraming(mlsMessage)
	if err != nil {
		return Classification{}, err
	}
	c.MessageID = sha256.Sum256(mlsMessage)
	return c, nil
}

func classifyFraming(b []byte) (Classification, error) {
	var c Classification
	r := reader{b: b}
	version, ok := r.u16()
	if !ok {
		return c, malformedInput(ErrTruncated)
	}
	wf, ok := r.u16()
	if !ok {
		return c, malformedInput(ErrTruncated)
	}
	if version != 1 {
		return c, unsupportedInput(ErrVersion)
	}
	c.WireFormat = WireFormat(wf)
	switch c.WireFormat {
	case WirePublicMessage:
		if !r.varBytes(&c.GroupID) || !r.u64(&c.Epoch) {
			return c, malformedInput(r.err())
		}
		c.HasEpoch = true
		st, ok := r.u8()
		if !ok {
			return c, malformedInput(ErrTruncated)
		}
		c.Sender = SenderType(st)
		switch c.Sender {
		case SenderMember, SenderExternal:
			if !r.u32(&c.SenderIndex) {
				return c, malformedInput(ErrTruncated)
			}
		case SenderNewMemberProposal, SenderNewMemberCommit:
		default:
			return c, malformedInput(ErrSenderType)
		}
		var aad []byte
		if !r.varBytes(&aad) {
			return c, malformedInput(r.err())
		}
		ct, ok := r.u8()
		if !ok {
			return c, malformedInput(ErrTruncated)
		}
		c.ContentType = ContentType(ct)
		if !walkPublicBody(&r, c.ContentType, c.Sender) {
			return c, bodyError(r.err())
		}
	case WirePrivateMessage:
		if !r.varBytes(&c.GroupID) || !r.u64(&c.Epoch) {
			return c, malformedInput(r.err())
		}
		c.HasEpoch = true
		ct, ok := r.u8()
		if !ok {
			return c, malformedInput(ErrTruncated)
		}
		c.ContentType = ContentType(ct)
		// The rest is three opaque<V> fields; checking their framing is cheap
		// and catches truncation before convergence.
		var skip []byte
		for range 3 { // authenticated_data, encrypted_sender_data, ciphertext
			if !r.varBytes(&skip) {
				return c, malformedInput(r.err())
			}
		}
		if r.off != len(b) {
			return c, malformedInput(ErrTrailing)
		}
	case WireWelcome:
		cs, ok := r.u16()
		if !ok {
			return c, malformedInput(ErrTruncated)
		}
		c.CipherSuite = cs
		c.Class = schema.ClassWelcome
		if SupportedCipherSuite(cs) && !walkWelcomeBody(&r) {
			return c, bodyError(r.err())
		}
	case WireGroupInfo:
		var gcVersion uint16
		if gcVersion, ok = r.u16(); !ok {
			return c, malformedInput(ErrTruncated)
		}
		if gcVersion != 1 {
			return c, unsupportedInput(ErrVersion)
		}
		if c.CipherSuite, ok = r.u16(); !ok {
			return c, malformedInput(ErrTruncated)
		}
		if !r.varBytes(&c.GroupID) || !r.u64(&c.Epoch) {
			return c, malformedInput(r.err())
		}
		c.HasEpoch = true
		c.Class = schema.ClassGroupInfo
		if SupportedCipherSuite(c.CipherSuite) && !walkGroupInfoBody(&r) {
			return c, bodyError(r.err())
		}
	case WireKeyPackage:
		var kpVersion uint16
		if kpVersion, ok = r.u16(); !ok {
			return c, malformedInput(ErrTruncated)
		}
		if kpVersion != 1 {
			return c, unsupportedInput(ErrVersion)
		}
		if c.CipherSuite, ok = r.u16(); !ok {
			return c, malformedInput(ErrTruncated)
		}
		c.Class = schema.ClassKeyPackage
		if SupportedCipherSuite(c.CipherSuite) && !walkKeyPackageBody(&r) {
			return c, bodyError(r.err())
		}
	default:
		return c, unsupportedInput(ErrWireFormat)
	}
	switch c.WireFormat {
	case WirePublicMessage, WirePrivateMessage:
		switch c.ContentType {
		case ContentApplication:
			c.Class = schema.ClassApplication
		case ContentProposal:
			c.Class = schema.ClassProposal
		case ContentCommit:
			c.Class = schema.ClassCommit
		default:
			return c, malformedInput(ErrContentType)
		}
	default:
		if !SupportedCipherSuite(c.CipherSuite) {
			return c, unsupportedInput(ErrCipherSuite)
		}
	}
	return c, nil
}

func malformedInput(err error) error {
	return fail("classify", schema.CategoryInvalidEncoding, err)
}

func unsupportedInput(err error) error {
	return fail("classify", schema.CategoryUnsupportedRequiredFeature, err)
}

// reader reads TLS-presentation fields; a failed read leaves off unchanged
// and records why.
type reader struct {
	b      []byte
	off    int
	failed error
}

func (r *reader) err() error {
	if r.failed != nil {
		return r.failed
	}
	return ErrTruncated
}

func (r *reader) u8() (uint8, bool) {
	if r.off >= len(r.b) {
		return 0, false
	}
	v := r.b[r.off]
	r.off++
	return v, true
}

func (r *reader) u16() (uint16, bool) {
	if len(r.b)-r.off < 2 {
		return 0, false
	}
	v := uint16(r.b[r.off])<<8 | uint16(r.b[r.off+1])
	r.off += 2
	return v, true
}

func (r *reader) u32(v *uint32) bool {
	if len(r.b)-r.off < 4 {
		return false
	}
	b := r.b[r.off:]
	*v = uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	r.off += 4
	return true
}

func (r *reader) u64(v *uint64) bool {
	if len(r.b)-r.off < 8 {
		r.failed = ErrTruncated
		return false
	}
	b := r.b[r.off:]
	*v = uint64(b[0])<<56 | uint64(b[1])<<48 | uint64(b[2])<<40 | uint64(b[3])<<32 |
		uint64(b[4])<<24 | uint64(b[5])<<16 | uint64(b[6])<<8 | uint64(b[7])
	r.off += 8
	return true
}

// varBytes reads opaque<V> with a minimal RFC 9420 §2.1.2 length.
func (r *reader) varBytes(v *[]byte) bool {
	n, size, err := readVarint(r.b[r.off:])
	if err != nil {
		r.failed = err
		return false
	}
	if uint64(len(r.b)-r.off-size) < n {
		r.failed = ErrTruncated
		return false
	}
	start := r.off + size
	*v = r.b[start : start+int(n)]
	r.off = start + int(n)
	return true
}

// readVarint decodes an RFC 9420 §2.1.2 variable-length integer: the top two
// bits of the first byte give its length (1, 2 or 4 bytes); 0b11 and
// non-minimal encodings are malformed.
func readVarint(b []byte) (v uint64, size int, err error) {
	if len(b) == 0 {
		return 0, 0, ErrTruncated
	}
	switch b[0] >> 6 {
	case 0:
		return uint64(b[0]), 1, nil
	case 1:
		if len(b) < 2 {
			return 0, 0, ErrTruncated
		}
		v = uint64(b[0]&0x3f)<<8 | uint64(b[1])
		if v < 1<<6 {
			return 0, 0, ErrVarint
		}
		return v, 2, nil
	case 2:
		if len(b) < 4 {
			return 0, 0, ErrTruncated
		}
		v = uint64(b[0]&0x3f)<<24 | uint64(b[1])<<16 | uint64(b[2])<<8 | uint64(b[3])
		if v < 1<<14 {
			return 0, 0, ErrVarint
		}
		return v, 4, nil
	}
	return 0, 0, ErrVarint
}
