package converge

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fabric-mls/fabric/internal/bus"
	"github.com/fabric-mls/fabric/internal/bus/readmodel"
	"github.com/fabric-mls/fabric/internal/bus/streams"
	"github.com/fabric-mls/fabric/internal/eventually"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// Issue 26 item 4, hosted-to-hosted sends lost across kill -9: an
// acknowledged send reaches every hosted member of its group exactly once,
// in order, whatever way and in whatever order its outbound copy comes
// back. Here a's three texts come back through ingest newest first, the
// worker restarting in between (a redelivery after AckWait behind newer
// messages, across a crash): b receives each text once, in a's order, the
// returning copies are accepted (no stale_epoch, no own_echo), and the read
// API holds each message once, in that order.
func TestHostedToHostedSendsNotLostAcrossRestart(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	_, stop := e.worker("w1", nil)
	submit := e.startIngest()
	a := e.register(sha256.Sum256([]byte("sender")), 1)
	b := e.register(sha256.Sum256([]byte("receiver")), 1)
	create := e.operate(bus.OperationRequest{Kind: schema.OpCreateConversation, ClientID: a.rec.ClientID, KeyPackages: b.kps})
	group := bus.OperationGroupID(create)
	e.operation(create, schema.OperationDone)
	e.waitEvents(b.rec.ClientID, 1) // joined from a's Welcome
	if _, err := e.js.PauseConsumer(e.ctx, streams.StreamEvents, streams.ConsumerOutbound, time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}

	texts := []string{"one", "two", "three"}
	sends := e.sendTexts(a.rec.ClientID, group, texts)
	for _, op := range sends {
		e.operation(op, schema.OperationDone)
	}
	out := e.outboundMsgs(group, 2+len(texts))[2:] // after the add commit and its Welcome
	back := func(m outboundMsg) {
		t.Helper()
		if r := submit(m.transport); r.Status != schema.StatusQueued {
			t.Fatalf("outbound %s submitted again: %+v", m.id, r)
		}
		id := must[[]byte](t)(hex.DecodeString(m.id))
		if o := e.settledOutcome(id); o.Disposition != schema.DispositionAccepted {
			t.Fatalf("outbound %s came back with outcome %s/%s/%s, want accepted", m.id, o.Status, o.Disposition, o.Category)
		}
	}
	back(out[2])
	stop()
	e.worker("w2", nil)
	back(out[0])
	back(out[1])
	if _, err := e.js.ResumeConsumer(e.ctx, streams.StreamEvents, streams.ConsumerOutbound); err != nil {
		t.Fatal(err)
	}
	// A fourth text behind them all, its copy back through the outbound
	// consumer as usual: once b has it, b has everything before it.
	last := e.sendTexts(a.rec.ClientID, group, []string{"four"})[0]
	want := append(appIDs(out), hex.EncodeToString(e.operation(last, schema.OperationDone).MessageIDs[0]))
	var got []string
	eventually.NoErrorWithin(t, 30*time.Second, func() error {
		got = e.receivedIDs(b.rec.ClientID)
		if len(got) == 0 || got[len(got)-1] != want[len(want)-1] {
			return fmt.Errorf("b received %v, not yet the fourth text %s", got, want[len(want)-1])
		}
		return nil
	})
	if !slices.Equal(got, want) {
		t.Fatalf("b received %v, want each of a's texts once, in order: %v", got, want)
	}
	if got := e.readableIDs(group, len(want)); !slices.Equal(got, want) {
		t.Fatalf("readable messages %v, want %v", got, want)
	}
	s := must[jetstream.Stream](t)(e.js.Stream(e.ctx, streams.StreamEvents))
	subj := must[string](t)(readmodel.MessageSubject(tenant, hex.EncodeToString(group), uint64(len(want)+1)))
	if m, err := s.GetLastMsgForSubject(e.ctx, subj); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Fatalf("a readable message past a's texts: %v %v", m, err)
	}
}

// receivedIDs are the message ids of a client's message.received events,
// in order.
func (e *env) receivedIDs(clientID string) []string {
	e.t.Helper()
	var ids []string
	for _, d := range e.events(clientID) {
		if r := d.Event.MessageReceived; r != nil {
			ids = append(ids, hex.EncodeToString(r.MessageID))
		}
	}
	return ids
}

// Issue 26 chaos: a hosted member's text comes back through ingest only
// after seven commits (an ingest died holding it, and its copy came again
// after the outbound consumer's ack wait). The retained states no longer
// include its epoch, yet ingest still peels its copy with the epoch's group
// event key, and convergence, which remembers it, answers accepted: the
// copy's outcome is written, not left transport_deferred for good.
func TestOwnMessageComingBackAfterCommitsIsPeeledAndDecided(t *testing.T) {
	t.Parallel()
	e, lo, _, group := twoAdmins(t)
	submit := e.startIngest()
	if _, err := e.js.PauseConsumer(e.ctx, streams.StreamEvents, streams.ConsumerOutbound, time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	n := len(e.outboundMsgs(group, 3)) // the add, its Welcome, the admins
	send := e.operate(bus.OperationRequest{Kind: schema.OpSendMessage, ClientID: lo.rec.ClientID, GroupID: group, Payload: textOf(t, "held by a dead ingest")})
	e.operation(send, schema.OperationDone)
	n++
	text := e.outboundMsgs(group, n)[n-1]
	for i := range 7 {
		name := fmt.Sprintf("rename %d", i)
		op := e.operate(bus.OperationRequest{Kind: schema.OpUpdateConversation, ClientID: lo.rec.ClientID, GroupID: group, Patch: &bus.ComponentsPatch{Name: &name}})
		n++
		commit := e.outboundMsgs(group, n)[n-1]
		if r := submit(commit.transport); r.Status != schema.StatusQueued {
			t.Fatalf("rename %d's commit submitted: %+v", i, r)
		}
		e.operation(op, schema.OperationDone)
	}
	r := submit(text.transport)
	if r.Status != schema.StatusQueued || hex.EncodeToString(r.MessageID) != text.id {
		t.Fatalf("the text's late copy: %+v, want queued under %s", r, text.id)
	}
	if o := e.settledOutcome(r.MessageID); o.Disposition != schema.DispositionAccepted {
		t.Fatalf("the text's late copy: outcome %+v, want accepted", o)
	}
}
