package converge

import (
	"encoding/hex"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/fabric-mls/fabric/internal/engine"
	"github.com/fabric-mls/fabric/internal/ingest"
	"github.com/fabric-mls/fabric/internal/subject"
	"github.com/fabric-mls/fabric/internal/testpeer"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// A second copy of a message id that reaches FABRIC_IN anyway (ingest's
// create-if-absent on the per-message subject normally stops it) is
// answered as a duplicate: the client gets the message once, and the first
// decision stays the input's outcome.
func TestSecondCopyOfMessageIDIsDuplicate(t *testing.T) {
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
	again.Header.Set(ingest.HeaderClass, string(c.Class))
	again.Header.Set(ingest.HeaderMessageID, idHex)
	if _, err := e.js.PublishMsg(e.ctx, again); err != nil {
		t.Fatal(err)
	}
	// A later message shows the copy has been processed before it.
	later := must[testpeer.Message](t)(g.SendText("after the copy"))
	e.publish(later)
	evs := e.waitEvents(h.rec.ClientID, 3)
	if r := evs[2].Event.MessageReceived; r == nil || !r.MessageID.Equal(later.ID) {
		t.Fatalf("third event %s, want the later message", describe(evs[2].Event))
	}
	e.outcome(later.ID)
	if o := e.outcome(m.ID); o.Disposition != first.Disposition || o.Status != first.Status || o.Revision != first.Revision {
		t.Fatalf("first decision overwritten: %+v, was %+v", o, first)
	}
}
