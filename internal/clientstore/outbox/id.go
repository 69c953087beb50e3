package outbox

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
)

// ID derives an event id from what caused the event: the parts, each
// length-prefixed, hashed with SHA-256, so distinct causes never share an
// id and the same cause always has the same one (EVENT-001).
func ID(parts ...string) string {
	h := sha256.New()
	var n [4]byte
	for _, p := range parts {
		binary.BigEndian.PutUint32(n[:], uint32(len(p)))
		h.Write(n[:])
		h.Write([]byte(p))
	}
	return hex.EncodeToString(h.Sum(nil))
}
