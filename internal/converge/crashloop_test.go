package converge

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/fabric-mls/fabric/internal/bus"
	"github.com/fabric-mls/fabric/internal/testpeer"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// Issue 26 item 1, the crash loop: hosted A adds hosted B, sends, removes
// B; the group goes idle and leaves memory; A's next send, on the state
// restored cold, is done. The state of A after the removal of the last
// leaf did not restore, and converge panicked at every start; a worker
// started anew restores it too.
func TestSendAfterRemovedHostedMemberAndIdleIsDone(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	clock := &testClock{}
	w, stop := e.worker("w1", func(c *Config) { c.Metrics, c.Now, c.IdleAfter = NewMetrics(nil), clock.Now, time.Hour })
	e.startIngest()
	a := e.register(sha256.Sum256([]byte("a")), 1)
	b := e.register(sha256.Sum256([]byte("b")), 1)

	create := e.operate(bus.OperationRequest{Kind: schema.OpCreateConversation, ClientID: a.rec.ClientID, KeyPackages: b.kps})
	group := bus.OperationGroupID(create)
	e.operation(create, schema.OperationDone)
	e.waitEvents(b.rec.ClientID, 1)
	send := e.operate(bus.OperationRequest{Kind: schema.OpSendMessage, ClientID: a.rec.ClientID, GroupID: group, Payload: textOf(t, "before")})
	e.operation(send, schema.OperationDone)
	remove := e.operate(bus.OperationRequest{Kind: schema.OpRemoveMember, ClientID: a.rec.ClientID, GroupID: group, InboxID: b.rec.InboxID})
	e.operation(remove, schema.OperationDone)

	e.goIdle(w, clock, 1)
	after := e.operate(bus.OperationRequest{Kind: schema.OpSendMessage, ClientID: a.rec.ClientID, GroupID: group, Payload: textOf(t, "after")})
	e.operation(after, schema.OperationDone)
	if got := testutil.ToFloat64(w.metrics.FailedInputs.WithLabelValues(failPanic)); got != 0 {
		t.Fatalf("%v inputs panicked", got)
	}
	// As after a restart of the process: another worker restores it.
	stop()
	e.worker("w2", nil)
	restarted := e.operate(bus.OperationRequest{Kind: schema.OpSendMessage, ClientID: a.rec.ClientID, GroupID: group, Payload: textOf(t, "after a restart")})
	e.operation(restarted, schema.OperationDone)
}

// Issue 26 item 1: an input whose processing panics does not take the
// worker down, nor stop its group. A send that panics fails terminally
// (record failed / resource_refused, message.status_changed unpublished →
// failed naming the operation), an MLS input that panics is rejected
// resource_refused, each counted and logged, and the group's later input
// is applied: the next send is done and the peer reads it.
func TestPanickingInputFailsAndItsGroupGoesOn(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	// The inputs that panic, once the test knows them.
	var panics atomic.Pointer[[2][]byte]
	e.hooks.input = func(in input) {
		if p := panics.Load(); p != nil && (bytes.Equal(in.MessageID, p[0]) || bytes.Equal(in.MessageID, p[1])) {
			panic("injected by the test")
		}
	}
	w, _ := e.worker("w1", func(c *Config) { c.Metrics = NewMetrics(nil) })
	e.startIngest()
	h, group, bg := e.createdWithPeer()
	evs := len(e.waitEvents(h.rec.ClientID, 2)) // joined, bob added

	bad := bus.OperationID(tenant, h.rec.ClientID, "panics")
	badText := must[testpeer.Message](t)(bg.SendText("panics too"))
	panics.Store(&[2][]byte{bad, badText.ID})

	e.operate(bus.OperationRequest{ID: bad, Kind: schema.OpSendMessage, ClientID: h.rec.ClientID, GroupID: group, Payload: textOf(t, "never")})
	rec := e.operation(bad, schema.OperationFailed)
	if rec.Category != schema.CategoryResourceRefused || len(rec.MessageIDs) != 0 {
		t.Fatalf("panicked send record %+v", rec)
	}
	ev := e.waitEvents(h.rec.ClientID, evs+1)
	if sc := ev[evs].Event.MessageStatusChanged; sc == nil || !sc.MessageID.Equal(bad) || sc.Previous != schema.StatusUnpublished || sc.Current != schema.StatusFailed {
		t.Fatalf("event %s, want message.status_changed unpublished → failed", describe(ev[evs].Event))
	}
	e.publish(badText)
	if o := e.settledOutcome(badText.ID); o.Status != schema.StatusRejected || o.Category != schema.CategoryResourceRefused {
		t.Fatalf("panicked input outcome %+v", o)
	}

	good := e.operate(bus.OperationRequest{Kind: schema.OpSendMessage, ClientID: h.rec.ClientID, GroupID: group, Payload: textOf(t, "after")})
	rec = e.operation(good, schema.OperationDone)
	out := e.outboundMsgs(group, 3)
	if out[2].opID != hex.EncodeToString(good) {
		t.Fatalf("outbound %+v, want the later send", out[2])
	}
	r, err := bg.Process(out[2].transport)
	if txt, _ := r.Payload.Text(); err != nil || txt != "after" || len(rec.MessageIDs) != 1 {
		t.Fatalf("bob reads %q, %v", txt, err)
	}
	if got := testutil.ToFloat64(w.metrics.FailedInputs.WithLabelValues(failPanic)); got < 2 {
		t.Fatalf("%v panicked inputs counted, want 2", got)
	}
}

// Issue 26 item 3: a send whose message is larger than the server takes
// (stored before the API bounded sends, or on a server whose max payload
// is lower) fails terminally, transport_rejected, with
// message.status_changed unpublished → failed, instead of being retried
// without end in front of its group's later input: the next send is done
// and the peer reads it.
func TestUnpublishableSendFailsAndItsGroupGoesOn(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	w, _ := e.worker("w1", func(c *Config) { c.Metrics = NewMetrics(nil) })
	e.startIngest()
	h, group, bg := e.createdWithPeer()
	evs := len(e.waitEvents(h.rec.ClientID, 2)) // joined, bob added

	// As stored on FABRIC_IN it fits the server's max payload; sealed
	// and enveloped on the outbound subject it does not.
	text := strings.Repeat("x", int(e.nc.MaxPayload())-600)
	big := e.operate(bus.OperationRequest{Kind: schema.OpSendMessage, ClientID: h.rec.ClientID, GroupID: group, Payload: textOf(t, text)})
	good := e.operate(bus.OperationRequest{Kind: schema.OpSendMessage, ClientID: h.rec.ClientID, GroupID: group, Payload: textOf(t, "after")})
	rec := e.finalOperation(big)
	if rec.Status != schema.OperationFailed || rec.Category != schema.CategoryTransportRejected || len(rec.MessageIDs) != 0 {
		t.Fatalf("too large a send: record %+v, want failed / transport_rejected", rec)
	}
	ev := e.waitEvents(h.rec.ClientID, evs+2)
	if sc := ev[evs].Event.MessageStatusChanged; sc == nil || !sc.MessageID.Equal(big) || sc.Current != schema.StatusFailed {
		t.Fatalf("event %s, want message.status_changed unpublished → failed", describe(ev[evs].Event))
	}
	e.operation(good, schema.OperationDone)
	out := e.outboundMsgs(group, 3)
	r, err := bg.Process(out[2].transport)
	if txt, _ := r.Payload.Text(); err != nil || txt != "after" {
		t.Fatalf("bob reads %q, %v", txt, err)
	}
	if got := testutil.ToFloat64(w.metrics.FailedInputs.WithLabelValues(failUnpublishable)); got < 1 {
		t.Fatalf("%v unpublishable inputs counted", got)
	}
}

// Issue 26 item 2: an operation id stored on a second group (an
// Idempotency-Key reused before the API scoped operation ids by route and
// group) makes events whose ids are stored already. That is no fence: the
// operation already happened, so the repeat is dropped (its id's record
// stays the first group's), and the second group's later sends are done.
func TestRepeatedOperationIDDoesNotWedgeItsGroup(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.worker("w1", nil)
	h := e.register(sha256.Sum256([]byte("host")), 1)
	var groups [2][]byte
	for i := range groups {
		create := e.operate(bus.OperationRequest{Kind: schema.OpCreateConversation, ClientID: h.rec.ClientID})
		groups[i] = bus.OperationGroupID(create)
		e.operation(create, schema.OperationDone)
	}
	id := bus.OperationID(tenant, h.rec.ClientID, "reused")
	e.operate(bus.OperationRequest{ID: id, Kind: schema.OpSendMessage, ClientID: h.rec.ClientID, GroupID: groups[0], Payload: textOf(t, "first")})
	e.operation(id, schema.OperationDone)
	e.operate(bus.OperationRequest{ID: id, Kind: schema.OpSendMessage, ClientID: h.rec.ClientID, GroupID: groups[1], Payload: textOf(t, "second")})
	later := e.operate(bus.OperationRequest{Kind: schema.OpSendMessage, ClientID: h.rec.ClientID, GroupID: groups[1], Payload: textOf(t, "later")})
	if rec := e.finalOperation(later); rec.Status != schema.OperationDone {
		t.Fatalf("the second group's later send: %+v", rec)
	}
	if rec := e.lastOperation(id); rec.Status != schema.OperationDone || !rec.GroupID.Equal(groups[0]) {
		t.Fatalf("the repeated operation's record %+v, want the first group's, done", rec)
	}
}

// Issue 26 item 3: a send whose app payload is as large as the API takes
// (bus.MaxSendPayload of the server's max_payload) is sent and delivered:
// the peer decrypts it from the outbound subject, and the group's other
// hosted member receives it once the message came back through ingest.
func TestSendAtTheBoundIsDelivered(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.worker("w1", nil)
	e.startIngest()
	a := e.register(sha256.Sum256([]byte("a")), 1)
	b := e.register(sha256.Sum256([]byte("b")), 1)
	bob := peer(t, "bob")
	create := e.operate(bus.OperationRequest{Kind: schema.OpCreateConversation, ClientID: a.rec.ClientID, KeyPackages: [][]byte{b.kps[0], must[[]byte](t)(bob.KeyPackage())}})
	group := bus.OperationGroupID(create)
	e.operation(create, schema.OperationDone)
	out := e.outboundMsgs(group, 3)
	bg := must[*testpeer.Group](t)(bob.Join(out[2].transport))
	e.waitEvents(b.rec.ClientID, 1)

	bound := bus.MaxSendPayload(e.nc.MaxPayload())
	text := strings.Repeat("x", bound)
	for n := len(textOf(t, text)); n > bound; n = len(textOf(t, text)) {
		text = text[:len(text)-(n-bound)]
	}
	payload := textOf(t, text)
	if len(payload) != bound {
		t.Fatalf("payload of %d bytes, want %d", len(payload), bound)
	}
	send := e.operate(bus.OperationRequest{Kind: schema.OpSendMessage, ClientID: a.rec.ClientID, GroupID: group, Payload: payload})
	if rec := e.finalOperation(send); rec.Status != schema.OperationDone {
		t.Fatalf("send at the bound: %+v", rec)
	}
	out = e.outboundMsgs(group, 4)
	r, err := bg.Process(out[3].transport)
	if txt, _ := r.Payload.Text(); err != nil || txt != text {
		t.Fatalf("bob reads %d bytes, %v", len(txt), err)
	}
	evs := e.waitEventsWithin(b.rec.ClientID, 2, time.Minute)
	mr := evs[1].Event.MessageReceived
	if mr == nil || hex.EncodeToString(mr.MessageID) != out[3].id {
		t.Fatalf("b's event %s, want the message at the bound", describe(evs[1].Event))
	}
	sealed := must[[]byte](t)(out[3].transport.MarshalMsgpack())
	t.Logf("app payload %d bytes, outbound message %d bytes (%d more), max_payload %d", bound, len(sealed), len(sealed)-bound, e.nc.MaxPayload())
}
