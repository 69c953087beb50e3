package converge

import (
	"encoding/hex"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/fabric-mls/fabric/internal/bus"
	"github.com/fabric-mls/fabric/internal/bus/subject"
	"github.com/fabric-mls/fabric/internal/components"
	"github.com/fabric-mls/fabric/internal/engine"
	"github.com/fabric-mls/fabric/internal/testpeer"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// A second copy of a message id that reaches FABRIC_IN anyway (ingest's
// create-if-absent on the per-message subject normally stops it) is
// answered as a duplicate: the client gets the message once, and the first
// decision stays the input's outcome.
func TestSecondCopyOfMessageIDIsDuplicate(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	h := e.register(peer(t, "bob").AccountID(), 1)
	e.worker("w1", nil)
	g, welcome := e.invited(peer(t, "alice"), h)
	e.publish(welcome)
	e.waitEvents(h.rec.ClientID, 1)

	m := must[testpeer.Message](t)(g.SendText("once"))
	e.publish(m)
	e.waitEvents(h.rec.ClientID, 2)
	first := e.outcome(m.ID)
	if first.Disposition != schema.DispositionAccepted {
		t.Fatalf("first copy: %+v", first)
	}

	// The same input on the same subject again, without the
	// create-if-absent header that keeps ingest from storing it twice.
	c, err := engine.Classify(m.MLS)
	if err != nil {
		t.Fatal(err)
	}
	idHex := hex.EncodeToString(m.ID)
	subj, err := subject.Input(tenant, hex.EncodeToString(m.Transport.Group), idHex)
	if err != nil {
		t.Fatal(err)
	}
	again := nats.NewMsg(subj)
	again.Data = m.MLS
	again.Header.Set(bus.HeaderClass, string(c.Class))
	again.Header.Set(bus.HeaderMessageID, idHex)
	if _, err := e.js.PublishMsg(e.ctx, again); err != nil {
		t.Fatal(err)
	}
	// A later message shows the copy has been processed before it.
	e.barrier(g, h.rec.ClientID, 3)
	e.wantOutcomeKept(m.ID, first)
}

// A wrong-hint copy that converge refuses after the genuine copy was
// applied leaves the applied decision as the message's outcome.
func TestRoutingRefusalKeepsAppliedWelcomeOutcome(t *testing.T) {
	t.Parallel()
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
	e.barrier(g2, h.rec.ClientID, 3)
	e.wantOutcomeKept(welcome1.ID, applied)
}
