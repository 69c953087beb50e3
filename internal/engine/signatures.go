package engine

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"sync"

	"github.com/thomas-vilte/mls-go/ciphersuite"
)

// DefaultSignatureCacheSize is how many verified signatures a
// SignatureCache made with NewSignatureCache(0) remembers.
const DefaultSignatureCacheSize = 16384

// errNoSignature: a decrypted message carries no signature.
var errNoSignature = errors.New("no signature")

// SignatureCache remembers sender signatures that verified, so the states
// of one process that decrypt the same message, hosted members of one
// group, check its sender's signature once instead of once each. Every
// member decrypts the message on its own ratchet, but the signed content
// (FramedContentTBS, with the epoch's GroupContext), the sender's key and
// the signature are the same for all of them, and a verification depends
// on nothing else. An entry is the SHA-256 of all three, so a message whose
// content, key or signature differs in any byte is verified afresh. Only
// successes are kept, the oldest dropped first. It is safe for concurrent
// use.
type SignatureCache struct {
	mu    sync.Mutex
	ok    map[[32]byte]struct{}
	order fifo
}

// fifo is the insertion order of a bounded map's keys.
type fifo struct {
	keys [][32]byte
	next int
}

// push adds key and returns the oldest key when the bound is reached: the
// caller deletes it from its map.
func (f *fifo) push(key [32]byte) (oldest [32]byte, full bool) {
	if len(f.keys) < cap(f.keys) {
		f.keys = append(f.keys, key)
		return oldest, false
	}
	oldest = f.keys[f.next]
	f.keys[f.next] = key
	f.next = (f.next + 1) % len(f.keys)
	return oldest, true
}

// NewSignatureCache returns a cache of up to n verified signatures
// (DefaultSignatureCacheSize when n is 0).
func NewSignatureCache(n int) *SignatureCache {
	if n <= 0 {
		n = DefaultSignatureCacheSize
	}
	return &SignatureCache{ok: make(map[[32]byte]struct{}, n), order: fifo{keys: make([][32]byte, 0, n)}}
}

// ShareSignatures makes s, and every state later derived from it (by
// [State.Clone] or [State.ProcessHandshake]), remember verified signatures
// in c. A nil c stops that.
func (s *State) ShareSignatures(c *SignatureCache) { s.sigs = c }

// verify checks sig over the FramedContentTBS tbs with the sender's key
// (RFC 9420 §6.1, label "FramedContentTBS"), through c when c is not nil.
func (c *SignatureCache) verify(scheme ciphersuite.SignatureScheme, key, tbs []byte, sig *ciphersuite.Signature) error {
	if sig == nil {
		return errNoSignature
	}
	check := func() error {
		return ciphersuite.VerifyWithLabel(ciphersuite.NewMLSSignaturePublicKey(key, scheme), "FramedContentTBS", tbs, sig)
	}
	if c == nil {
		return check()
	}
	id := signatureID(scheme, key, tbs, sig.AsSlice())
	c.mu.Lock()
	_, seen := c.ok[id]
	c.mu.Unlock()
	if seen {
		return nil
	}
	if err := check(); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, seen := c.ok[id]; seen {
		return nil // verified meanwhile by another state
	}
	if oldest, full := c.order.push(id); full {
		delete(c.ok, oldest)
	}
	c.ok[id] = struct{}{}
	return nil
}

// signatureID is SHA-256 over the scheme and the length-prefixed key,
// content and signature.
func signatureID(scheme ciphersuite.SignatureScheme, key, tbs, sig []byte) [32]byte {
	h := sha256.New()
	var n [8]byte
	binary.BigEndian.PutUint16(n[:2], uint16(scheme))
	h.Write(n[:2])
	for _, b := range [][]byte{key, tbs, sig} {
		binary.BigEndian.PutUint64(n[:], uint64(len(b)))
		h.Write(n[:])
		h.Write(b)
	}
	var id [32]byte
	h.Sum(id[:0])
	return id
}
