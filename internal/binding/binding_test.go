package binding

import (
	"bytes"
	"crypto/rand"
	"errors"
	"testing"

	"github.com/thomas-vilte/mls-go/ciphersuite"
	"github.com/thomas-vilte/mls-go/credentials"
	"github.com/thomas-vilte/mls-go/group"
	"github.com/thomas-vilte/mls-go/keypackages"
	"golang.org/x/crypto/chacha20poly1305"

	"github.com/fabric-mls/fabric/pkg/schema"
)

func key(b byte) [KeySize]byte {
	var k [KeySize]byte
	for i := range k {
		k[i] = b + byte(i)
	}
	return k
}

var mlsBytes = []byte("\x00\x01\x00\x02 an MLSMessage, opaque to the binding")

func sealed(t testing.TB, k [KeySize]byte, m []byte) schema.TransportMessage {
	t.Helper()
	p, err := Seal(k, m, rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return schema.TransportMessage{V: 1, Group: []byte{1, 2, 3}, Kind: schema.TransportSealed, Payload: p}
}

// The sealed layout is nonce(12) || ChaCha20-Poly1305(key, nonce, m, aad="").
func TestSealLayout(t *testing.T) {
	k := key(1)
	nonce := bytes.Repeat([]byte{9}, NonceSize)
	got, err := Seal(k, mlsBytes, bytes.NewReader(nonce))
	if err != nil {
		t.Fatal(err)
	}
	aead, _ := chacha20poly1305.New(k[:])
	want := append(append([]byte{}, nonce...), aead.Seal(nil, nonce, mlsBytes, nil)...)
	if !bytes.Equal(got, want) {
		t.Fatal("sealed bytes differ from nonce || ChaCha20-Poly1305(m, aad=\"\")")
	}
	if len(got) != len(mlsBytes)+Overhead {
		t.Fatalf("len = %d", len(got))
	}
}

func TestSealUsesFreshNonces(t *testing.T) {
	a := sealed(t, key(1), mlsBytes).Payload
	b := sealed(t, key(1), mlsBytes).Payload
	if bytes.Equal(a[:NonceSize], b[:NonceSize]) {
		t.Fatal("two seals share a nonce")
	}
}

func TestSealFailsWithoutRandomness(t *testing.T) {
	if _, err := Seal(key(1), mlsBytes, bytes.NewReader(nil)); err == nil {
		t.Fatal("Seal succeeded with an empty random source")
	}
}

func TestPeelMLSIsIdentity(t *testing.T) {
	got, err := Peel(schema.TransportMessage{V: 1, Group: []byte{1}, Kind: schema.TransportMLS, Payload: mlsBytes}, nil)
	if err != nil || !bytes.Equal(got, mlsBytes) {
		t.Fatalf("Peel = %q, %v", got, err)
	}
}

// Peeling tries every candidate key: the key of an older retained epoch
// opens a message sent in that epoch.
func TestPeelTriesEveryCandidate(t *testing.T) {
	msg := sealed(t, key(3), mlsBytes)
	got, err := Peel(msg, [][KeySize]byte{key(1), key(2), key(3), key(4)})
	if err != nil || !bytes.Equal(got, mlsBytes) {
		t.Fatalf("Peel = %q, %v", got, err)
	}
}

func TestPeelWithoutMatchingKeyIsTransportDeferred(t *testing.T) {
	msg := sealed(t, key(3), mlsBytes)
	for _, keys := range [][][KeySize]byte{nil, {key(1)}, {key(1), key(2)}} {
		_, err := Peel(msg, keys)
		if !errors.Is(err, ErrTransportDeferred) {
			t.Fatalf("Peel with %d keys = %v, want ErrTransportDeferred", len(keys), err)
		}
		var pe *Error
		if !errors.As(err, &pe) || pe.Category != schema.CategoryTransportDeferred {
			t.Fatalf("category = %v", pe)
		}
	}
	// Tampering makes the right key fail too.
	msg.Payload[len(msg.Payload)-1] ^= 1
	if _, err := Peel(msg, [][KeySize]byte{key(3)}); !errors.Is(err, ErrTransportDeferred) {
		t.Fatalf("tampered Peel = %v", err)
	}
}

func TestPeelRejectsMalformed(t *testing.T) {
	good := sealed(t, key(1), mlsBytes)
	emptySealed, err := Seal(key(1), nil, rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	cases := map[string]schema.TransportMessage{
		"version 0":        {V: 0, Group: []byte{1}, Kind: schema.TransportMLS, Payload: mlsBytes},
		"version 2":        {V: 2, Group: []byte{1}, Kind: schema.TransportMLS, Payload: mlsBytes},
		"unknown kind":     {V: 1, Group: []byte{1}, Kind: "nostr", Payload: mlsBytes},
		"empty mls":        {V: 1, Group: []byte{1}, Kind: schema.TransportMLS},
		"short sealed":     {V: 1, Group: []byte{1}, Kind: schema.TransportSealed, Payload: good.Payload[:schema.MinSealedPayloadSize-1]},
		"sealed empty mls": {V: 1, Group: []byte{1}, Kind: schema.TransportSealed, Payload: emptySealed},
		"no group":         {V: 1, Kind: schema.TransportMLS, Payload: mlsBytes},
		"oversized":        {V: 1, Group: []byte{1}, Kind: schema.TransportMLS, Payload: make([]byte, schema.MaxTransportPayloadSize+1)},
	}
	for name, msg := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := Peel(msg, [][KeySize]byte{key(1)})
			var pe *Error
			if !errors.Is(err, ErrInvalidEncoding) || !errors.As(err, &pe) || pe.Category != schema.CategoryInvalidEncoding {
				t.Fatalf("Peel = %v, want ErrInvalidEncoding", err)
			}
		})
	}
}

// The group event key is MLS-Exporter("fabric", "group-event", 32) of a
// real mls-go group state, and changes with the epoch.
func TestGroupEventKeyFromMLSState(t *testing.T) {
	cs := ciphersuite.MLS128DHKEMX25519
	cred, sig, err := credentials.GenerateCredentialWithKeyForCS(make([]byte, 32), cs)
	if err != nil {
		t.Fatal(err)
	}
	kp, kpPriv, err := keypackages.Generate(cred, cs)
	if err != nil {
		t.Fatal(err)
	}
	id, err := group.NewGroupIDRandom()
	if err != nil {
		t.Fatal(err)
	}
	g, err := group.NewGroup(id, cs, kp, kpPriv)
	if err != nil {
		t.Fatal(err)
	}
	k0, err := GroupEventKey(g)
	if err != nil {
		t.Fatal(err)
	}
	want, err := g.Export("fabric", []byte("group-event"), 32)
	if err != nil || !bytes.Equal(k0[:], want) {
		t.Fatalf("key differs from the exporter output: %v", err)
	}
	staged, err := g.Commit(sig, sig.PublicKey(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.MergeCommit(staged); err != nil {
		t.Fatal(err)
	}
	k1, err := GroupEventKey(g)
	if err != nil {
		t.Fatal(err)
	}
	if k0 == k1 {
		t.Fatal("group event key did not change with the epoch")
	}
	if _, err := Peel(sealed(t, k0, mlsBytes), [][KeySize]byte{k1}); !errors.Is(err, ErrTransportDeferred) {
		t.Fatalf("epoch 1 key opened an epoch 0 message: %v", err)
	}
}
