package converge

import (
	"bytes"
	"crypto/rand"
	"strings"
	"testing"

	"github.com/fabric-mls/fabric/internal/auth"
	"github.com/fabric-mls/fabric/internal/components"
	"github.com/fabric-mls/fabric/internal/ingest"
	"github.com/fabric-mls/fabric/internal/testpeer"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// A Welcome posted with a wrong routing hint (a wildcard, random bytes,
// another group) is refused for its routing, and refusing it never makes
// the genuine copy, the same MLS bytes with the right hint, a duplicate:
// the hosted client joins and the group's next message is delivered, not
// unknown_group. Anyone who may post to a tenant's intake could otherwise
// block any join.
func TestWelcomeWithWrongHintDoesNotBlockJoin(t *testing.T) {
	e := newEnv(t)
	verifier, err := auth.NewVerifier([]byte(strings.Repeat("v", 32)))
	if err != nil {
		t.Fatal(err)
	}
	svc, err := ingest.New(ingest.Config{Conn: e.nc, Verifier: verifier, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	if err := svc.Start(e.ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = svc.Shutdown(e.ctx) })
	h := e.register(peer(t, "bob").AccountID(), 1)
	e.worker("w1", nil)
	submit := func(m schema.TransportMessage) ingest.Result {
		t.Helper()
		res, err := svc.Submit(e.ctx, tenant, "test", []schema.TransportMessage{m})
		if err != nil {
			t.Fatal(err)
		}
		return res[0]
	}

	alice := peer(t, "alice")
	g, welcome := e.invited(alice, h)
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

// A wrong-hint copy that converge refuses after the genuine copy was
// applied leaves the applied decision as the message's outcome.
func TestRoutingRefusalKeepsAppliedWelcomeOutcome(t *testing.T) {
	e := newEnv(t)
	h := e.register(peer(t, "bob").AccountID(), 2)
	e.worker("w1", nil)
	alice := peer(t, "alice")
	_, welcome1 := e.invited(alice, h)
	g2, err := alice.CreateGroup(components.Set{Admins: []components.AccountID{alice.AccountID()}})
	if err != nil {
		t.Fatal(err)
	}
	_, welcome2, err := g2.Invite(h.kps[1])
	if err != nil {
		t.Fatal(err)
	}
	e.publish(welcome1)
	e.publish(welcome2)
	e.waitEvents(h.rec.ClientID, 2)
	applied := e.settledOutcome(welcome1.ID)
	if applied.Disposition != schema.DispositionAccepted {
		t.Fatalf("welcome: %+v", applied)
	}

	// The same Welcome hinted at the other group, then a message of that
	// group: its inputs are in order, so the copy is decided before it.
	copyTo2 := welcome1
	copyTo2.Transport.Group = g2.ID()
	e.publish(copyTo2)
	m := must[testpeer.Message](t)(g2.SendText("after the copy"))
	e.publish(m)
	evs := e.waitEvents(h.rec.ClientID, 3)
	if r := evs[2].Event.MessageReceived; r == nil || !r.MessageID.Equal(m.ID) {
		t.Fatalf("third event %s, want the message", describe(evs[2].Event))
	}
	e.settledOutcome(m.ID)
	if o := e.outcome(welcome1.ID); o.Disposition != applied.Disposition || o.Status != applied.Status || o.Revision != applied.Revision {
		t.Fatalf("applied Welcome's outcome overwritten by a routing refusal: %+v, was %+v", o, applied)
	}
}
