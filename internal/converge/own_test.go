package converge

import (
	"crypto/sha256"
	"encoding/hex"
	"testing"

	"github.com/thomas-vilte/mls-go/credentials"
	"github.com/thomas-vilte/mls-go/framing"
	"github.com/thomas-vilte/mls-go/group"
	"github.com/thomas-vilte/mls-go/keypackages"

	"github.com/fabric-mls/fabric/internal/apppayload"
	"github.com/fabric-mls/fabric/internal/clientstore"
	"github.com/fabric-mls/fabric/internal/components"
	"github.com/fabric-mls/fabric/internal/testpeer"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// device is the app-side copy of a hosted installation: the same key
// material, imported into the fabric, so the app can send as the
// installation whose inbound side the fabric hosts.
type device struct {
	cred *credentials.CredentialWithKey
	kp   *keypackages.KeyPackage
	priv *keypackages.KeyPackagePrivateKeys
	st   *group.Group
}

func newDevice(t *testing.T, e *env, account [32]byte) (*device, hosted) {
	t.Helper()
	cred, _, err := credentials.GenerateCredentialWithKeyForCS(account[:], testpeer.CipherSuite)
	if err != nil {
		t.Fatal(err)
	}
	kp, priv, err := components.GenerateKeyPackage(cred, testpeer.CipherSuite)
	if err != nil {
		t.Fatal(err)
	}
	kpMsg := (&framing.MLSMessage{KeyPackage: kp.Marshal()}).Marshal()
	zero := 0
	rec, kps, err := e.store.RegisterClient(e.ctx, tenant, clientstore.RegisterRequest{
		InboxID:     hex.EncodeToString(account[:]),
		KeyPackages: &zero,
		Import: &clientstore.ImportMaterial{
			KeyPackage:           kpMsg,
			SignaturePrivateKey:  priv.Ed25519SignatureKey.Seed(),
			EncryptionPrivateKey: priv.EncryptionKey.Bytes(),
			InitPrivateKey:       priv.InitKey.Bytes(),
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(kps) == 0 {
		kps = [][]byte{kpMsg}
	}
	return &device{cred: cred, kp: kp, priv: priv}, hosted{rec: rec, kps: kps}
}

func (d *device) join(t *testing.T, welcome testpeer.Message) {
	t.Helper()
	m, err := framing.UnmarshalMLSMessage(welcome.MLS)
	if err != nil || m.Welcome == nil {
		t.Fatal("not a welcome")
	}
	w, err := group.UnmarshalWelcome(m.Welcome)
	if err != nil {
		t.Fatal(err)
	}
	if d.st, err = group.JoinFromWelcome(w, d.kp, d.priv, nil); err != nil {
		t.Fatal(err)
	}
}

func (d *device) send(t *testing.T, text string) testpeer.Message {
	t.Helper()
	b, err := apppayload.Encode(apppayload.NewText(text))
	if err != nil {
		t.Fatal(err)
	}
	pm, err := d.st.SendMessage(b, d.priv.GetSignaturePrivateKey())
	if err != nil {
		t.Fatal(err)
	}
	raw := framing.NewMLSMessagePrivate(pm).Marshal()
	id := schema.Bytes(sha256Sum(raw))
	return testpeer.Message{MLS: raw, ID: id, Transport: schema.TransportMessage{V: schema.TransportVersion, Group: d.st.ID().AsSlice(), Kind: schema.TransportMLS, Payload: raw}}
}

// TestOwnMessagesSkipped: a message the hosted installation itself sent
// (from the app's copy of it) gives no message.received to that
// installation, and does to the other hosted members.
func TestOwnMessagesSkipped(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	alice := peer(t, "alice")
	u1, u2 := peer(t, "u1"), peer(t, "u2")
	dev, h1 := newDevice(t, e, u1.AccountID())
	h2 := e.register(u2.AccountID(), 1)
	e.worker("w1", nil)
	ga := must[*testpeer.Group](t)(alice.CreateGroup(components.Set{Admins: []components.AccountID{alice.AccountID()}}))
	_, welcome, err := ga.Invite(h1.kps[0], h2.kps[0])
	if err != nil {
		t.Fatal(err)
	}
	dev.join(t, welcome)
	e.publish(welcome)
	own := dev.send(t, "sent by h1's own installation")
	e.publish(own)
	after := must[testpeer.Message](t)(ga.SendText("after"))
	e.publish(after)

	ev1 := e.waitEvents(h1.rec.ClientID, 2)
	if ev1[0].Event.Kind != schema.KindConversationJoined || !ev1[1].Event.MessageReceived.MessageID.Equal(after.ID) {
		t.Fatalf("h1 events %v", kinds(ev1))
	}
	ev2 := e.waitEvents(h2.rec.ClientID, 3)
	if r := ev2[1].Event.MessageReceived; r == nil || !r.MessageID.Equal(own.ID) || r.SenderInboxID != u1.InboxID() {
		t.Fatalf("h2 event 1 %s", describe(ev2[1].Event))
	}
	if o := e.settledOutcome(own.ID); o.Disposition != schema.DispositionAccepted {
		t.Fatalf("own message outcome %+v", o)
	}
}

func sha256Sum(b []byte) []byte {
	s := sha256.Sum256(b)
	return s[:]
}
