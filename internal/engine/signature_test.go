package engine

import (
	"fmt"
	"testing"

	"github.com/thomas-vilte/mls-go/ciphersuite"
	"github.com/thomas-vilte/mls-go/framing"

	"github.com/fabric-mls/fabric/internal/apppayload"
	"github.com/fabric-mls/fabric/internal/testpeer"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// forgeApp returns an application message from leaf that decrypts on st,
// signed by a key that is not the leaf's: what a member of the epoch, who
// holds its secret tree, could send in another member's name.
func forgeApp(t *testing.T, st *State, leaf uint32, text string) []byte {
	t.Helper()
	c := must[*State](t)(st.Clone())
	key, err := ciphersuite.GenerateSignaturePrivateKeyForCS(c.g.CipherSuite())
	if err != nil {
		t.Fatal(err)
	}
	payload := must[[]byte](t)(apppayload.Encode(apppayload.Payload{ContentType: apppayload.TextType, Content: []byte(text)}))
	pm, err := framing.Encrypt(framing.EncryptParams{
		Content: framing.FramedContent{
			GroupID: c.g.ID().AsSlice(),
			Epoch:   c.g.Epoch().AsUint64(),
			Sender:  framing.Sender{Type: framing.SenderTypeMember, LeafIndex: leaf},
			Body:    framing.ApplicationData{Data: payload},
		},
		SenderLeafIndex:  leaf,
		CipherSuite:      c.g.CipherSuite(),
		SenderDataSecret: c.g.EpochSecrets().SenderDataSecret,
		SecretTree:       c.g.SecretTree(),
		SigKey:           key,
		GroupContext:     c.g.GroupContext().Marshal(),
	})
	if err != nil {
		t.Fatal(err)
	}
	return framing.NewMLSMessagePrivate(pm).Marshal()
}

// TestForgedAppSignatureIsInvalidSignature: an application message that
// decrypts but whose signature is not its sender's is invalid_signature,
// and the genuine message after it still decrypts.
func TestForgedAppSignatureIsInvalidSignature(t *testing.T) {
	w := newWorld(t)
	forged := forgeApp(t, w.state, w.bob.OwnLeaf(), "not from bob")
	if _, err := w.state.Decrypt(forged); CategoryOf(err) != schema.CategoryInvalidSignature {
		t.Fatalf("forged message: %v", err)
	}
	// The forgery spent bob's first key; his second message still opens.
	must[testpeer.Message](t)(w.bob.SendText("first"))
	second := must[testpeer.Message](t)(w.bob.SendText("second"))
	app, err := w.state.Decrypt(second.MLS)
	if err != nil {
		t.Fatalf("genuine message after a forgery: %v", err)
	}
	if app.Sender.InboxID != w.bob.Peer().InboxID() {
		t.Fatalf("sender %+v", app.Sender)
	}
}

// States that share a SignatureCache verify a message's signature once:
// the second state to decrypt it finds it there, a different message is
// verified afresh, and a forged signature is never remembered.
func TestSharedSignaturesVerifiedOnce(t *testing.T) {
	w := newWorld(t)
	cache := NewSignatureCache(0)
	w.state.ShareSignatures(cache)
	other := must[*State](t)(w.state.Clone()) // derived: shares the cache
	forged := forgeApp(t, w.state, w.bob.OwnLeaf(), "not from bob")
	for _, st := range []*State{w.state, other} {
		if _, err := st.Decrypt(forged); CategoryOf(err) != schema.CategoryInvalidSignature {
			t.Fatalf("forged message with a shared cache: %v", err)
		}
	}
	if len(cache.ok) != 0 {
		t.Fatalf("a forged signature was remembered (%d entries)", len(cache.ok))
	}
	must[testpeer.Message](t)(w.bob.SendText("the key the forgery spent"))
	for i, want := range []int{1, 2} {
		msg := must[testpeer.Message](t)(w.bob.SendText(fmt.Sprintf("hello %d", i))).MLS
		for _, st := range []*State{w.state, other} {
			app, err := st.Decrypt(msg)
			if err != nil || app.Sender.InboxID != w.bob.Peer().InboxID() {
				t.Fatalf("message %d: %+v, %v", i, app, err)
			}
		}
		if len(cache.ok) != want {
			t.Fatalf("after message %d the cache holds %d signatures, want %d", i, len(cache.ok), want)
		}
	}
}

// A SignatureCache keeps its newest n signatures.
func TestSignatureCacheBounded(t *testing.T) {
	w := newWorld(t)
	cache := NewSignatureCache(2)
	w.state.ShareSignatures(cache)
	var ids [][32]byte
	for i := range 3 {
		if _, err := w.state.Decrypt(must[testpeer.Message](t)(w.bob.SendText(fmt.Sprintf("hello %d", i))).MLS); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, cache.order.keys[(cache.order.next+len(cache.order.keys)-1)%len(cache.order.keys)])
	}
	if len(cache.ok) != 2 {
		t.Fatalf("cache of 2 holds %d", len(cache.ok))
	}
	if _, ok := cache.ok[ids[0]]; ok {
		t.Fatal("the oldest signature was kept")
	}
	for _, id := range ids[1:] {
		if _, ok := cache.ok[id]; !ok {
			t.Fatal("a newer signature was dropped")
		}
	}
}
