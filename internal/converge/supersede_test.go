package converge

import (
	"encoding/hex"
	"fmt"
	"testing"
	"time"

	"github.com/fabric-mls/fabric/internal/bus"
	"github.com/fabric-mls/fabric/internal/components"
	"github.com/fabric-mls/fabric/internal/eventually"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// Issue 26 item 5, a rolled-back own commit reads done: a hosted client's
// rename is accepted (its operation done), then a real remote peer's
// branch from the rename's parent epoch wins (two commits, the first of
// the same epoch as the rename: deeper wins), and the rename is superseded
// (fabric.commit_superseded). An operation must not read done while the
// group does not hold its change: the rename is made again on the winning
// branch (a commit operation's retry, as for a commit that lost before it
// was accepted), its record names both commits and is done once the
// second is accepted, and the client's conversation and the peer, applying
// the winning branch and the retried commit, hold the name.
func TestRolledBackOwnCommitDoesNotReadDone(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	h, bg, group, _ := hostWithPeer(t, e, nil)
	name := "renamed"
	rename := e.operate(bus.OperationRequest{Kind: schema.OpUpdateConversation, ClientID: h.rec.ClientID, GroupID: group, Patch: &bus.ComponentsPatch{Name: &name}})
	first := e.operation(rename, schema.OperationDone)
	if len(first.MessageIDs) != 1 {
		t.Fatalf("rename record %+v, want one commit", first)
	}
	// bob never applies the rename: his commits are of its parent epoch.
	e.publishCommits(bg, 2)
	eventually.NoErrorWithin(t, 30*time.Second, func() error {
		for _, d := range e.events(h.rec.ClientID) {
			if s := d.Event.CommitSuperseded; s != nil && s.CommitDigest.Equal(first.MessageIDs[0]) {
				return nil
			}
		}
		return fmt.Errorf("the rename's commit is not superseded yet")
	})
	var rec schema.Operation
	eventually.NoErrorWithin(t, 30*time.Second, func() error {
		rec = e.lastOperation(rename)
		set := e.conversationComponents(group, h.rec.ClientID)
		held := set.Profile != nil && set.Profile.Name == name
		if rec.Status == schema.OperationDone && !held {
			return fmt.Errorf("rename record %+v reads done, the conversation's name is %+v", rec, set.Profile)
		}
		if rec.Status != schema.OperationDone {
			return fmt.Errorf("rename record %+v, want done again once made again on the winning branch", rec)
		}
		return nil
	})
	if len(rec.MessageIDs) != 2 || !rec.MessageIDs[0].Equal(first.MessageIDs[0]) {
		t.Fatalf("rename record %+v, want the superseded commit and the retried one", rec)
	}
	if o := e.settledOutcome(rec.MessageIDs[1]); o.Disposition != schema.DispositionAccepted {
		t.Fatalf("the retried commit's outcome %+v, want accepted", o)
	}
	// bob's branch and the retried commit on top of it: bob reads the name.
	retried := hex.EncodeToString(rec.MessageIDs[1])
	for _, m := range e.outboundMsgs(group, 4) {
		if m.id == retried {
			if _, err := bg.Process(m.transport); err != nil {
				t.Fatalf("bob applies the retried rename: %v", err)
			}
		}
	}
	if set := must[components.Set](t)(bg.Components()); set.Profile == nil || set.Profile.Name != name {
		t.Fatalf("bob's components %+v, want the name", set.Profile)
	}
}
