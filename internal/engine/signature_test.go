package engine

import (
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
