package components

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"unicode/utf8"
)

// ExtensionType is the private-use MLS extension type (RFC 9420 §17.3,
// 0xF000–0xFFFF) of the GroupContext extension that carries the components.
// mls-go v1.6.0 defines 0x0001–0x0005 and 0x000A; Marmot claims 0xF2xx; GREASE
// values have the form 0x?A?A. 0xF0FA collides with none of them.
const ExtensionType uint16 = 0xF0FA

// ID is a 16-bit app component id.
type ID uint16

// Component ids. The 0x80xx ids are Marmot's registry ids (foundation/registries.md)
// with Marmot's byte layout; the 0xFAxx ids are the fabric's own.
const (
	Profile          ID = 0x8001 // marmot.group.profile.v1: name, description
	AdminPolicy      ID = 0x8003 // marmot.group.admin-policy.v1: admin list
	MessageRetention ID = 0x8005 // marmot.group.message-retention.v1: disappearing messages
	AvatarURL        ID = 0x8007 // marmot.group.avatar-url.v1: image
	SuperAdmins      ID = 0xFA01 // fabric.group.super-admins.v1
	Permissions      ID = 0xFA02 // fabric.group.permission-policy.v1
	ProtocolFloor    ID = 0xFA03 // fabric.group.protocol-floor.v1
	Conversation     ID = 0xFA04 // fabric.group.conversation-type.v1
)

// Size bounds of the fields, from the Marmot documents where they have one.
const (
	MaxNameLen        = 256
	MaxDescriptionLen = 4096
	MaxURLLen         = 2048
	MaxHintLen        = 256
	MaxVersionLen     = 64
	// MaxEncodedLen bounds a whole extension body so a decoder never allocates
	// for an absurd length prefix.
	MaxEncodedLen = 1 << 20
)

// AccountID is a 32-byte account id; its lowercase hex is the inbox id.
type AccountID [32]byte

// InboxID returns the lowercase hex inbox id of a.
func (a AccountID) InboxID() string { return hex.EncodeToString(a[:]) }

// ParseInboxID parses a 64-digit hex inbox id.
func ParseInboxID(s string) (AccountID, error) {
	var a AccountID
	if len(s) != 64 {
		return a, errors.New("components: inbox id is not 64 hex digits")
	}
	if _, err := hex.Decode(a[:], []byte(s)); err != nil {
		return a, errors.New("components: inbox id is not hex")
	}
	return a, nil
}

// ProfileState is the body of [Profile]: struct { opaque name<0..256>; opaque description<0..4096>; }.
type ProfileState struct {
	Name        string
	Description string
}

// AvatarState is the body of [AvatarURL]:
// struct { opaque url<0..2048>; opaque dim<0..256>; opaque thumbhash<0..256>; }.
// An empty URL means no avatar.
type AvatarState struct {
	URL       string
	Dim       []byte
	Thumbhash []byte
}

// RetentionState is the body of [MessageRetention]: struct { uint64 disappearing_message_secs; }.
// Zero disables disappearing messages.
type RetentionState struct {
	DisappearingSecs uint64
}

// Action is a permission-controlled action of [PermissionPolicy].
type Action uint8

// Actions of the permission policy set.
const (
	ActionAddMember         Action = 1
	ActionRemoveMember      Action = 2
	ActionUpdateMetadata    Action = 3
	ActionAddAdmin          Action = 4
	ActionRemoveAdmin       Action = 5
	ActionUpdatePermissions Action = 6
)

// Policy says who may perform an [Action].
type Policy uint8

// Policies, from most to least permissive.
const (
	PolicyAllow      Policy = 0 // any member
	PolicyAdmin      Policy = 1 // an admin or super admin
	PolicySuperAdmin Policy = 2 // a super admin
	PolicyDeny       Policy = 3 // nobody
)

// PermissionPolicy is the body of [Permissions]:
// struct { PolicyEntry entries<V>; } with PolicyEntry { uint8 action; uint8 policy; },
// strictly ascending by action, actions 1–6, policies 0–3.
type PermissionPolicy map[Action]Policy

// ConversationKind tells a group from a DM.
type ConversationKind uint8

// Conversation kinds.
const (
	KindGroup ConversationKind = 0
	KindDM    ConversationKind = 1
)

// ConversationState is the body of [Conversation]:
// struct { uint8 kind; select (kind) { case group: {}; case dm: opaque members[32][2]; } }.
// A DM names both of its inboxes, lower first, so each side finds its peer.
type ConversationState struct {
	Kind    ConversationKind
	Members [2]AccountID // DM only, Members[0] < Members[1]
}

// PeerOf returns the other inbox of a DM, or false for a group or a
// non-member.
func (c ConversationState) PeerOf(self AccountID) (AccountID, bool) {
	if c.Kind != KindDM {
		return AccountID{}, false
	}
	switch self {
	case c.Members[0]:
		return c.Members[1], true
	case c.Members[1]:
		return c.Members[0], true
	}
	return AccountID{}, false
}

// NewDM returns the conversation state of a DM between a and b.
func NewDM(a, b AccountID) ConversationState {
	if bytes.Compare(a[:], b[:]) > 0 {
		a, b = b, a
	}
	return ConversationState{Kind: KindDM, Members: [2]AccountID{a, b}}
}

// Set is a decoded components extension. A nil field is an absent component.
// Other keeps every component this package does not define, byte for byte.
type Set struct {
	Profile       *ProfileState
	Avatar        *AvatarState
	Retention     *RetentionState
	Admins        []AccountID // AdminPolicy; nil when absent; sorted, unique, non-empty when present
	SuperAdmins   []AccountID // nil when absent; sorted, unique (may be empty when present)
	Permissions   PermissionPolicy
	ProtocolFloor *string // minimum protocol version, e.g. "1.2.0"
	Conversation  *ConversationState
	Other         map[ID][]byte
}

// DecodeError is the error of a malformed components extension.
type DecodeError struct {
	Component ID // 0 when the error is in the outer framing
	Reason    string
}

func (e *DecodeError) Error() string {
	if e.Component == 0 {
		return "components: malformed extension: " + e.Reason
	}
	return fmt.Sprintf("components: malformed component 0x%04x: %s", uint16(e.Component), e.Reason)
}

// ErrMalformed is matched by every [DecodeError] with errors.Is.
var ErrMalformed = errors.New("components: malformed")

// Is makes errors.Is(err, ErrMalformed) true for a DecodeError.
func (e *DecodeError) Is(target error) bool { return target == ErrMalformed }

func malformed(id ID, reason string) error { return &DecodeError{Component: id, Reason: reason} }

// Clone returns a deep copy of s.
func (s Set) Clone() Set {
	c := Set{}
	if s.Profile != nil {
		p := *s.Profile
		c.Profile = &p
	}
	if s.Avatar != nil {
		a := AvatarState{URL: s.Avatar.URL, Dim: bytes.Clone(s.Avatar.Dim), Thumbhash: bytes.Clone(s.Avatar.Thumbhash)}
		c.Avatar = &a
	}
	if s.Retention != nil {
		r := *s.Retention
		c.Retention = &r
	}
	if s.Admins != nil {
		c.Admins = slices.Clone(s.Admins)
	}
	if s.SuperAdmins != nil {
		c.SuperAdmins = append(make([]AccountID, 0, len(s.SuperAdmins)), s.SuperAdmins...)
	}
	if s.Permissions != nil {
		c.Permissions = maps.Clone(s.Permissions)
	}
	if s.ProtocolFloor != nil {
		f := *s.ProtocolFloor
		c.ProtocolFloor = &f
	}
	if s.Conversation != nil {
		cv := *s.Conversation
		c.Conversation = &cv
	}
	if s.Other != nil {
		c.Other = make(map[ID][]byte, len(s.Other))
		for id, b := range s.Other {
			c.Other[id] = bytes.Clone(b)
		}
	}
	return c
}

// Encode returns the extension body of s: entries in ascending id order. It
// returns an error when a component violates its bounds, so that what is
// encoded always decodes.
func Encode(s Set) ([]byte, error) {
	bodies, err := s.bodies()
	if err != nil {
		return nil, err
	}
	ids := slices.Sorted(maps.Keys(bodies))
	var entries []byte
	for _, id := range ids {
		entries = append(entries, byte(id>>8), byte(id))
		entries = appendVarBytes(entries, bodies[id])
	}
	if len(entries) > MaxEncodedLen {
		return nil, errors.New("components: encoded set too large")
	}
	return appendVarBytes(nil, entries), nil
}

// MustEncode is Encode for sets built by the program itself; it panics on an
// invalid set. Tests and peers use it; it is never used on received input.
func MustEncode(s Set) []byte {
	b, err := Encode(s)
	if err != nil {
		panic(err)
	}
	return b
}

// bodies encodes each present component, validating it as Decode would.
func (s Set) bodies() (map[ID][]byte, error) {
	for id := range s.Other {
		if _, known := names[id]; known {
			return nil, fmt.Errorf("components: component 0x%04x must use its typed field", uint16(id))
		}
	}
	out := rawBodies(s)
	// Every known body goes through its strict decoder: one rule for
	// validity, on both sides.
	for id, b := range out {
		if _, known := names[id]; !known {
			continue
		}
		var probe Set
		if err := probe.decodeComponent(id, b); err != nil {
			return nil, fmt.Errorf("components: invalid set: %w", err)
		}
	}
	return out, nil
}

// Decode parses an extension body strictly: minimal varints, no trailing
// bytes, strictly ascending ids, and valid bodies for known components. It
// never panics.
func Decode(b []byte) (Set, error) {
	var s Set
	if len(b) > MaxEncodedLen+4 {
		return Set{}, malformed(0, "too large")
	}
	entries, rest, err := readVarBytes(b)
	if err != nil {
		return Set{}, malformed(0, err.Error())
	}
	if len(rest) != 0 {
		return Set{}, malformed(0, "trailing bytes")
	}
	prev := -1
	for len(entries) > 0 {
		if len(entries) < 2 {
			return Set{}, malformed(0, "truncated component id")
		}
		id := ID(uint16(entries[0])<<8 | uint16(entries[1]))
		if int(id) <= prev {
			return Set{}, malformed(0, "component ids not strictly ascending")
		}
		prev = int(id)
		var body []byte
		body, entries, err = readVarBytes(entries[2:])
		if err != nil {
			return Set{}, malformed(id, err.Error())
		}
		if err := s.decodeComponent(id, body); err != nil {
			return Set{}, err
		}
	}
	return s, nil
}

func (s *Set) decodeComponent(id ID, body []byte) error {
	switch id {
	case Profile:
		p, err := decodeProfile(body)
		if err != nil {
			return malformed(id, err.Error())
		}
		s.Profile = &p
	case AvatarURL:
		a, err := decodeAvatar(body)
		if err != nil {
			return malformed(id, err.Error())
		}
		s.Avatar = &a
	case MessageRetention:
		if len(body) != 8 {
			return malformed(id, "body is not 8 bytes")
		}
		var v uint64
		for _, c := range body {
			v = v<<8 | uint64(c)
		}
		s.Retention = &RetentionState{DisappearingSecs: v}
	case AdminPolicy:
		a, err := decodeAccounts(body)
		if err != nil {
			return malformed(id, err.Error())
		}
		if len(a) == 0 {
			return malformed(id, "empty admin list")
		}
		s.Admins = a
	case SuperAdmins:
		a, err := decodeAccounts(body)
		if err != nil {
			return malformed(id, err.Error())
		}
		s.SuperAdmins = a
	case Permissions:
		p, err := decodePermissions(body)
		if err != nil {
			return malformed(id, err.Error())
		}
		s.Permissions = p
	case ProtocolFloor:
		v, rest, err := readVarBytes(body)
		switch {
		case err != nil:
			return malformed(id, err.Error())
		case len(rest) != 0:
			return malformed(id, "trailing bytes")
		case len(v) > MaxVersionLen || !utf8.Valid(v):
			return malformed(id, "version is not UTF-8 of at most 64 bytes")
		}
		f := string(v)
		s.ProtocolFloor = &f
	case Conversation:
		c, err := decodeConversation(body)
		if err != nil {
			return malformed(id, err.Error())
		}
		s.Conversation = &c
	default:
		if s.Other == nil {
			s.Other = make(map[ID][]byte)
		}
		s.Other[id] = bytes.Clone(body)
	}
	return nil
}

func encodeProfile(p ProfileState) []byte {
	b := appendVarBytes(nil, []byte(p.Name))
	return appendVarBytes(b, []byte(p.Description))
}

func decodeProfile(b []byte) (ProfileState, error) {
	name, b, err := readVarBytes(b)
	if err != nil {
		return ProfileState{}, err
	}
	desc, b, err := readVarBytes(b)
	switch {
	case err != nil:
		return ProfileState{}, err
	case len(b) != 0:
		return ProfileState{}, errors.New("trailing bytes")
	case len(name) > MaxNameLen || len(desc) > MaxDescriptionLen:
		return ProfileState{}, errors.New("field too long")
	case !utf8.Valid(name) || !utf8.Valid(desc):
		return ProfileState{}, errors.New("field is not UTF-8")
	}
	return ProfileState{Name: string(name), Description: string(desc)}, nil
}

func encodeAvatar(a AvatarState) []byte {
	b := appendVarBytes(nil, []byte(a.URL))
	b = appendVarBytes(b, a.Dim)
	return appendVarBytes(b, a.Thumbhash)
}

func decodeAvatar(b []byte) (AvatarState, error) {
	var f [3][]byte
	var err error
	for i := range f {
		if f[i], b, err = readVarBytes(b); err != nil {
			return AvatarState{}, err
		}
	}
	switch {
	case len(b) != 0:
		return AvatarState{}, errors.New("trailing bytes")
	case len(f[0]) > MaxURLLen || len(f[1]) > MaxHintLen || len(f[2]) > MaxHintLen:
		return AvatarState{}, errors.New("field too long")
	case !utf8.Valid(f[0]):
		return AvatarState{}, errors.New("url is not UTF-8")
	}
	return AvatarState{URL: string(f[0]), Dim: bytes.Clone(f[1]), Thumbhash: bytes.Clone(f[2])}, nil
}

func encodeRetention(r RetentionState) []byte {
	v := r.DisappearingSecs
	return []byte{byte(v >> 56), byte(v >> 48), byte(v >> 40), byte(v >> 32), byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}
}

func encodeAccounts(list []AccountID) []byte {
	sorted := slices.Clone(list)
	slices.SortFunc(sorted, func(a, b AccountID) int { return bytes.Compare(a[:], b[:]) })
	flat := make([]byte, 0, 32*len(sorted))
	for _, a := range sorted {
		flat = append(flat, a[:]...)
	}
	return appendVarBytes(nil, flat)
}

func decodeAccounts(b []byte) ([]AccountID, error) {
	flat, rest, err := readVarBytes(b)
	switch {
	case err != nil:
		return nil, err
	case len(rest) != 0:
		return nil, errors.New("trailing bytes")
	case len(flat)%32 != 0:
		return nil, errors.New("account list length is not a multiple of 32")
	}
	out := make([]AccountID, len(flat)/32)
	for i := range out {
		copy(out[i][:], flat[32*i:])
		if i > 0 && bytes.Compare(out[i-1][:], out[i][:]) >= 0 {
			return nil, errors.New("account list not sorted and unique")
		}
	}
	return out, nil
}

func encodePermissions(p PermissionPolicy) []byte {
	var flat []byte
	for _, a := range slices.Sorted(maps.Keys(p)) {
		flat = append(flat, byte(a), byte(p[a]))
	}
	return appendVarBytes(nil, flat)
}

func decodePermissions(b []byte) (PermissionPolicy, error) {
	flat, rest, err := readVarBytes(b)
	switch {
	case err != nil:
		return nil, err
	case len(rest) != 0:
		return nil, errors.New("trailing bytes")
	case len(flat)%2 != 0:
		return nil, errors.New("policy entries length is odd")
	}
	p := make(PermissionPolicy, len(flat)/2)
	prev := 0
	for i := 0; i < len(flat); i += 2 {
		a, pol := Action(flat[i]), Policy(flat[i+1])
		switch {
		case a < ActionAddMember || a > ActionUpdatePermissions:
			return nil, errors.New("unknown action")
		case pol > PolicyDeny:
			return nil, errors.New("unknown policy")
		case int(a) <= prev:
			return nil, errors.New("actions not strictly ascending")
		}
		prev = int(a)
		p[a] = pol
	}
	return p, nil
}

func encodeConversation(c ConversationState) []byte {
	b := []byte{byte(c.Kind)}
	if c.Kind == KindDM {
		b = append(b, c.Members[0][:]...)
		b = append(b, c.Members[1][:]...)
	}
	return b
}

func decodeConversation(b []byte) (ConversationState, error) {
	if len(b) == 0 {
		return ConversationState{}, errors.New("empty body")
	}
	switch ConversationKind(b[0]) {
	case KindGroup:
		if len(b) != 1 {
			return ConversationState{}, errors.New("trailing bytes")
		}
		return ConversationState{Kind: KindGroup}, nil
	case KindDM:
		if len(b) != 65 {
			return ConversationState{}, errors.New("dm body is not 65 bytes")
		}
		var c ConversationState
		c.Kind = KindDM
		copy(c.Members[0][:], b[1:33])
		copy(c.Members[1][:], b[33:65])
		if bytes.Compare(c.Members[0][:], c.Members[1][:]) >= 0 {
			return ConversationState{}, errors.New("dm members not sorted and distinct")
		}
		return c, nil
	}
	return ConversationState{}, errors.New("unknown conversation kind")
}

// appendVarBytes appends opaque<V>: an MLS varint length (RFC 9420 §2.1.2) and
// the bytes. Lengths above 2^30-1 cannot occur: Encode bounds the set first.
func appendVarBytes(b, v []byte) []byte {
	n := len(v)
	switch {
	case n < 1<<6:
		b = append(b, byte(n))
	case n < 1<<14:
		b = append(b, 0x40|byte(n>>8), byte(n))
	default:
		b = append(b, 0x80|byte(n>>24), byte(n>>16), byte(n>>8), byte(n))
	}
	return append(b, v...)
}

// readVarBytes reads opaque<V>, rejecting non-minimal and 0b11-prefixed
// lengths and lengths beyond the input.
func readVarBytes(b []byte) (v, rest []byte, err error) {
	if len(b) == 0 {
		return nil, nil, errors.New("truncated length")
	}
	var n, size int
	switch b[0] >> 6 {
	case 0:
		n, size = int(b[0]), 1
	case 1:
		if len(b) < 2 {
			return nil, nil, errors.New("truncated length")
		}
		n, size = int(b[0]&0x3f)<<8|int(b[1]), 2
		if n < 1<<6 {
			return nil, nil, errors.New("non-minimal length")
		}
	case 2:
		if len(b) < 4 {
			return nil, nil, errors.New("truncated length")
		}
		n, size = int(b[0]&0x3f)<<24|int(b[1])<<16|int(b[2])<<8|int(b[3]), 4
		if n < 1<<14 {
			return nil, nil, errors.New("non-minimal length")
		}
	default:
		return nil, nil, errors.New("invalid length prefix")
	}
	if n > len(b)-size {
		return nil, nil, errors.New("length beyond input")
	}
	return b[size : size+n], b[size+n:], nil
}
