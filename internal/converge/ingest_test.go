package converge

import (
	"strings"
	"testing"

	"github.com/fabric-mls/fabric/internal/auth"
	"github.com/fabric-mls/fabric/internal/ingest"
	"github.com/fabric-mls/fabric/internal/testpeer"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// TestThroughIngestSealed runs input through the ingest role: ingest admits
// the Welcome, converge joins and publishes the group's record and candidate
// group event keys, and ingest then peels a sealed application message with
// them (DESIGN section 3); the hosted client receives it and its outcome
// moves from queued to accepted.
func TestThroughIngestSealed(t *testing.T) {
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

	alice := peer(t, "alice")
	g, welcome := e.invited(alice, h)
	submit := func(m testpeer.Message) ingest.Result {
		t.Helper()
		res, err := svc.Submit(e.ctx, tenant, "test", []schema.TransportMessage{m.Transport})
		if err != nil {
			t.Fatal(err)
		}
		return res[0]
	}
	if r := submit(welcome); r.Status != schema.StatusQueued {
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
	if r := submit(m); r.Status == schema.StatusRejected {
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
