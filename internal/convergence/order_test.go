package convergence

import (
	"bytes"
	"testing"

	"github.com/fabric-mls/fabric/internal/testpeer"
)

// TestPROC037PassDeliversDeletionAfterItsTarget: a message and its
// deletion settled by one pass are delivered target first, whatever their
// ids and arrival (PROC-037: the deletion must find its target; EVENT-012),
// and a reply after its parent (the rest by sender leaf and send order);
// the delivery of an epoch comes before the commit that left that epoch
// (Result.Steps).
func TestPROC037PassDeliversDeletionAfterItsTarget(t *testing.T) {
	w := newWorld(t)
	g := w.fresh()
	c1 := commit(t, w.alice)
	w.deliverPeers(c1, w.bob, w.carol)
	// The deletion's id sorts below its target's, so id order is wrong.
	var target, del, reply testpeer.Message
	for {
		b := clone(t, w.bob)
		target = text(t, b, "oops")
		del = must[testpeer.Message](t)(b.SendDelete(target.ID))
		if bytes.Compare(del.ID, target.ID) < 0 {
			w.bob = b
			break
		}
	}
	for {
		c := clone(t, w.carol)
		reply = must[testpeer.Message](t)(c.SendReply(target.ID, "what?"))
		if bytes.Compare(reply.ID, target.ID) < 0 {
			w.carol = c
			break
		}
	}
	c2 := commit(t, w.alice)
	admit(t, g, t0, reply, del, c2, c1, target)
	r := settle(t, g)
	wantIDs(t, "applied", appliedIDs(r), ids(c1, c2))
	wantIDs(t, "delivered", deliveredIDs(r), ids(target, del, reply))
	var steps []ID
	for _, s := range r.Steps() {
		if s.Commit != nil {
			steps = append(steps, s.Commit.ID)
		} else {
			steps = append(steps, s.Delivery.ID)
		}
	}
	wantIDs(t, "steps", steps, ids(c1, target, del, reply, c2))
}
