package converge

import (
	"bytes"
	"crypto/rand"
	"strings"
	"testing"

	"github.com/fabric-mls/fabric/internal/components"
	"github.com/fabric-mls/fabric/internal/testpeer"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// TestThroughIngestSealed runs input through the ingest role: ingest admits
// the Welcome, converge joins and publishes the group's record and candidate
// group event keys, and ingest then peels a sealed application message with
// them (DESIGN section 3); the hosted client receives it and its outcome
// moves from queued to accepted.
func TestThroughIngestSealed(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	submit := e.startIngest()
	h, alice, g, welcome := e.hostedInvite()
	if r := submit(welcome.Transport); r.Status != schema.StatusQueued {
		t.Fatalf("welcome: %+v", r)
	}
	e.waitEvents(h.rec.ClientID, 1)

	g.SetSealed(true)
	m := must[testpeer.Message](t)(g.SendText("sealed"))
	if m.Transport.Kind != schema.TransportSealed {
		t.Fatal("not sealed")
	}
	// ingest may not have seen the keys yet: then it defers the object
	// and retries it when they arrive.
	if r := submit(m.Transport); r.Status == schema.StatusRejected {
		t.Fatalf("sealed message rejected: %+v", r)
	}
	evs := e.waitEvents(h.rec.ClientID, 2)
	if r := evs[1].Event.MessageReceived; r == nil || !r.MessageID.Equal(m.ID) || r.SenderInboxID != alice.InboxID() {
		t.Fatalf("second event %s", describe(evs[1].Event))
	}
	if o := e.settledOutcome(m.ID); o.Disposition != schema.DispositionAccepted || o.Revision < 2 {
		t.Fatalf("outcome %+v, want accepted after ingest's queued record", o)
	}
}

// A Welcome posted with a wrong routing hint (a wildcard, random bytes,
// another group) is refused for its routing, and refusing it never makes
// the genuine copy, the same MLS bytes with the right hint, a duplicate:
// the hosted client joins and the group's next message is delivered, not
// unknown_group. Anyone who may post to a tenant's intake could otherwise
// block any join.
func TestWelcomeWithWrongHintDoesNotBlockJoin(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	submit := e.startIngest()
	h, alice, g, welcome := e.hostedInvite()
	other, err := alice.CreateGroup(components.Set{Admins: []components.AccountID{alice.AccountID()}})
	if err != nil {
		t.Fatal(err)
	}
	random := make([]byte, 16)
	rand.Read(random)
	for _, hint := range [][]byte{[]byte("*.>"), random, other.ID()} {
		wrong := welcome.Transport
		wrong.Group = hint
		if r := submit(wrong); r.Status != schema.StatusQueued {
			t.Fatalf("wrong hint %x: %+v, want queued (only convergence can read a Welcome's group)", hint, r)
		}
		if o := e.settledOutcome(welcome.ID); o.Category != schema.CategoryWrongRecipient {
			t.Fatalf("wrong hint %x: outcome %+v, want wrong_recipient", hint, o)
		}
	}

	if r := submit(welcome.Transport); r.Status != schema.StatusQueued {
		t.Fatalf("genuine Welcome after wrong-hint copies: %+v, want queued", r)
	}
	evs := e.waitEvents(h.rec.ClientID, 1)
	if j := evs[0].Event.ConversationJoined; j == nil || !bytes.Equal(j.GroupID, g.ID()) {
		t.Fatalf("first event %s, want conversation.joined", describe(evs[0].Event))
	}
	if o := e.settledOutcome(welcome.ID); o.Disposition != schema.DispositionAccepted {
		t.Fatalf("genuine Welcome outcome %+v, want accepted", o)
	}

	m := must[testpeer.Message](t)(g.SendText("after the join"))
	if r := submit(m.Transport); r.Status != schema.StatusQueued {
		t.Fatalf("the group's next message: %+v, want queued", r)
	}
	evs = e.waitEvents(h.rec.ClientID, 2)
	if r := evs[1].Event.MessageReceived; r == nil || !r.MessageID.Equal(m.ID) {
		t.Fatalf("second event %s, want the message", describe(evs[1].Event))
	}

	// Once applied, any copy is a duplicate, whatever its hint.
	wrong := welcome.Transport
	wrong.Group = random
	if r := submit(wrong); r.Status != schema.StatusRejected || r.Category != schema.CategoryDuplicate {
		t.Fatalf("wrong-hint copy after the join: %+v, want duplicate", r)
	}
}

// Issue 28 item 2: a Welcome whose GroupInfo carries no ratchet_tree
// extension cannot be joined (the fabric has no other copy of the tree);
// its outcome record says so beside invalid_encoding, so a foreign peer
// learns what to change. A Welcome for no hosted client says that too.
func TestRejectedWelcomeOutcomeSaysWhy(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	submit := e.startIngest()
	h := e.register(peer(t, "bob").AccountID(), 1)
	e.worker("w1", nil)
	alice := peer(t, "alice")
	g, err := alice.CreateGroup(components.Set{Admins: []components.AccountID{alice.AccountID()}})
	if err != nil {
		t.Fatal(err)
	}
	g.SetTreeInWelcome(false)
	_, welcome, err := g.Invite(h.kps[0])
	if err != nil {
		t.Fatal(err)
	}
	if r := submit(welcome.Transport); r.Status != schema.StatusQueued {
		t.Fatalf("welcome: %+v", r)
	}
	o := e.settledOutcome(welcome.ID)
	if o.Status != schema.StatusRejected || o.Category != schema.CategoryInvalidEncoding || !strings.Contains(o.Reason, "ratchet_tree") {
		t.Fatalf("outcome %+v, want rejected / invalid_encoding with a reason naming ratchet_tree", o)
	}

	carol := peer(t, "carol")
	_, other, err := g.Invite(must[[]byte](t)(carol.KeyPackage()))
	if err != nil {
		t.Fatal(err)
	}
	if r := submit(other.Transport); r.Status != schema.StatusQueued {
		t.Fatalf("welcome for no hosted client: %+v", r)
	}
	if o := e.settledOutcome(other.ID); o.Category != schema.CategoryWrongRecipient || !strings.Contains(o.Reason, "KeyPackage") {
		t.Fatalf("outcome %+v, want wrong_recipient with a reason naming the KeyPackage", o)
	}
}
