package clientstore

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
)

// eventID derives an event id from what caused the event: each part
// length-prefixed, hashed, so distinct causes never share an id.
func eventID(parts ...string) string {
	h := sha256.New()
	var n [4]byte
	for _, p := range parts {
		binary.BigEndian.PutUint32(n[:], uint32(len(p)))
		h.Write(n[:])
		h.Write([]byte(p))
	}
	return hex.EncodeToString(h.Sum(nil))
}
