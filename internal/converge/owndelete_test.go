package converge

import (
	"crypto/sha256"
	"fmt"
	"testing"

	"github.com/fabric-mls/fabric/internal/apppayload"
	"github.com/fabric-mls/fabric/internal/bus"
	"github.com/fabric-mls/fabric/internal/eventually"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// deletionOf is the app payload of a deletion of target.
func deletionOf(t testing.TB, target []byte) []byte {
	t.Helper()
	p := must[apppayload.Payload](t)(apppayload.NewDeletion(target))
	return must[[]byte](t)(apppayload.Encode(p))
}

// sendAndWait sends a payload as client and returns the id of the message
// its done operation sent.
func (e *env) sendAndWait(clientID string, group, payload []byte) []byte {
	e.t.Helper()
	op := e.operate(bus.OperationRequest{Kind: schema.OpSendMessage, ClientID: clientID, GroupID: group, Payload: payload})
	rec := e.operation(op, schema.OperationDone)
	if len(rec.MessageIDs) != 1 {
		e.t.Fatalf("send record %+v", rec)
	}
	return rec.MessageIDs[0]
}

// awaitDeleted waits until a client's events hold message.deleted of
// target, and returns its events and that event's index; it fails on a
// second one (EVENT-001).
func (e *env) awaitDeleted(clientID string, group, target []byte) ([]bus.Delivered, int) {
	e.t.Helper()
	var evs []bus.Delivered
	at := -1
	eventually.NoError(e.t, func() error {
		evs, at = e.events(clientID), -1
		for i, d := range evs {
			md := d.Event.MessageDeleted
			if md == nil || !md.MessageID.Equal(target) {
				continue
			}
			if at >= 0 {
				e.t.Fatalf("two message.deleted of one message: %v", kinds(evs))
			}
			if !md.GroupID.Equal(group) || md.Cause != schema.DeletionDeleted {
				e.t.Fatalf("message.deleted %s, want group %x cause deleted", describe(d.Event), group)
			}
			at = i
		}
		if at < 0 {
			return fmt.Errorf("no message.deleted of %x among %v", target[:4], kinds(evs))
		}
		return nil
	})
	return evs, at
}

// Issue 26 item 7: a hosted client that deletes its own message through
// the operations API gets message.deleted for it (the kind table: "the
// client applies a deletion under PROC-037"; its read API shows the target
// deleted), like the group's other members: the group's only hosted
// member at once, in the send's transaction after the deletion's
// message.status_changed (EVENT-012, kind-table order); with another
// hosted member, when the deletion comes back and is delivered.
func TestDeletingClientGetsMessageDeleted(t *testing.T) {
	t.Parallel()
	t.Run("alone", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		e.worker("w1", nil)
		e.startIngest()
		h := e.register(sha256.Sum256([]byte("host")), 1)
		bob := peer(t, "bob")
		create := e.operate(bus.OperationRequest{Kind: schema.OpCreateConversation, ClientID: h.rec.ClientID, KeyPackages: [][]byte{must[[]byte](t)(bob.KeyPackage())}})
		group := bus.OperationGroupID(create)
		e.operation(create, schema.OperationDone)
		target := e.sendAndWait(h.rec.ClientID, group, textOf(t, "oops"))
		del := e.sendAndWait(h.rec.ClientID, group, deletionOf(t, target))
		evs, at := e.awaitDeleted(h.rec.ClientID, group, target)
		prev := evs[at-1].Event.MessageStatusChanged
		if at == 0 || prev == nil || !prev.MessageID.Equal(del) || prev.Current != schema.StatusPublished {
			t.Fatalf("message.deleted at %d of %v, want it right after the deletion's message.status_changed", at, kinds(evs))
		}
		if at != len(evs)-1 {
			t.Fatalf("events after message.deleted: %v", kinds(evs))
		}
		ids := map[string]bool{}
		for _, d := range evs {
			if d.ID == "" || ids[d.ID] {
				t.Fatalf("event %s has id %q, empty or given before", d.Event.Kind, d.ID)
			}
			ids[d.ID] = true
		}
	})
	t.Run("beside another hosted member", func(t *testing.T) {
		t.Parallel()
		e, lo, hi, group := twoAdmins(t)
		target := e.sendAndWait(hi.rec.ClientID, group, textOf(t, "oops"))
		e.sendAndWait(hi.rec.ClientID, group, deletionOf(t, target))
		e.awaitDeleted(lo.rec.ClientID, group, target)
		e.awaitDeleted(hi.rec.ClientID, group, target)
	})
}
