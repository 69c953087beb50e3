package schema

// TransportVersion is the only version of the fabric-native/1 transport
// message.
const TransportVersion = 1

// Size bounds of a TransportMessage, checked by Validate.
const (
	// MaxGroupIDSize bounds the routing group id.
	MaxGroupIDSize = 255
	// MaxTransportPayloadSize bounds the payload (the MLSMessage, or the
	// sealed MLSMessage).
	MaxTransportPayloadSize = 1 << 20
	// MinSealedPayloadSize is the nonce (12) plus the Poly1305 tag (16): a
	// sealed payload shorter than this cannot open.
	MinSealedPayloadSize = 12 + 16
)

// TransportKind says what a TransportMessage's payload is.
type TransportKind string

// TransportKind values (DESIGN section 3).
const (
	// TransportMLS: the payload is the MLSMessage itself.
	TransportMLS TransportKind = "mls"
	// TransportSealed: the payload is nonce(12) || ChaCha20-Poly1305 of the
	// MLSMessage under the group event key of the epoch it was sent in.
	TransportSealed TransportKind = "sealed"
)

// Valid reports whether k is a known value.
func (k TransportKind) Valid() bool { return k == TransportMLS || k == TransportSealed }

// TransportMessage is one message of the transport binding fabric-native/1:
// {v:1, group, kind, payload}.
type TransportMessage struct {
	// V is the binding version; it must be TransportVersion.
	V int `msgpack:"v" json:"v"`
	// Group is the routing id: the MLS group id. For a welcome it is a hint,
	// verified against the decrypted GroupInfo.
	Group Bytes `msgpack:"group" json:"group"`
	// Kind says whether Payload is plain or sealed.
	Kind TransportKind `msgpack:"kind" json:"kind"`
	// Payload is the MLSMessage, or its sealed form.
	Payload Bytes `msgpack:"payload" json:"payload"`
}
