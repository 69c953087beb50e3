package converge

import (
	"bytes"
	"slices"
	"testing"

	"github.com/fabric-mls/fabric/internal/bus"
	"github.com/fabric-mls/fabric/internal/components"
	"github.com/fabric-mls/fabric/internal/convergence"
	"github.com/fabric-mls/fabric/internal/testpeer"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// rolledBack hosts bob in alice's group, applies change (alice's commit
// on the branch that will lose), then publishes a deeper branch of two
// empty commits from the same parent, which wins. It returns the env, the
// hosted client, alice's group on the losing branch and change's commit,
// once the commit is deferred.
func rolledBack(t *testing.T, change func(alice *testpeer.Peer, g *testpeer.Group) testpeer.Message) (*env, string, *testpeer.Group, testpeer.Message) {
	t.Helper()
	r := changed(t, change, 1)
	r.compete(2)
	r.e.waitOutcome(r.cA.ID, schema.DispositionDeferred)
	return r.e, r.client, r.g, r.cA
}

// race is a hosted client bob in alice's group after alice's change cA:
// g is alice's group on cA's branch, other hers from cA's parent.
type race struct {
	e      *env
	client string
	g      *testpeer.Group
	other  *testpeer.Group
	cA     testpeer.Message
	stop   func() // stops the worker
}

// changed applies change, which causes caused events for bob.
func changed(t *testing.T, change func(alice *testpeer.Peer, g *testpeer.Group) testpeer.Message, caused int) race {
	t.Helper()
	e, client, stop, alice, g := bobJoined(t)
	other := must[*testpeer.Group](t)(g.Clone())
	cA := change(alice, g)
	e.publish(cA)
	e.waitOutcome(cA.ID, schema.DispositionAccepted)
	e.waitEvents(client, 1+caused)
	return race{e: e, client: client, g: g, other: other, cA: cA, stop: stop}
}

// compete publishes a competing branch of depth empty commits from cA's
// parent; the deeper branch wins.
func (r race) compete(depth int) {
	for range depth {
		r.e.publish(must[testpeer.Message](r.e.t)(r.other.Commit()))
	}
}

// rename is a change that renames the group.
func rename(t *testing.T, name string) func(*testpeer.Peer, *testpeer.Group) testpeer.Message {
	return func(alice *testpeer.Peer, g *testpeer.Group) testpeer.Message {
		return must[testpeer.Message](t)(setProfile(components.ProfileState{Name: name}, alice.AccountID())(g))
	}
}

// wantWithdrawn checks that a commit_superseded names the superseded
// commit and exactly the events it had caused.
func wantWithdrawn(t *testing.T, sup *schema.CommitSuperseded, commit testpeer.Message, caused ...bus.Delivered) {
	t.Helper()
	var ids []string
	for _, d := range caused {
		ids = append(ids, d.ID)
	}
	if !bytes.Equal(sup.CommitDigest, commit.ID) || !slices.Equal(sup.WithdrawnEventIDs, ids) {
		t.Fatalf("commit_superseded %x withdraws %v, want %x withdrawing %v", []byte(sup.CommitDigest), sup.WithdrawnEventIDs, commit.ID, ids)
	}
}

// TestRollbackOfAddReportsTheMemberGone: a member added by a commit that a
// later winner supersedes is reported removed: after the rollback,
// membership is measured against the winning branch (the winner's own
// commits add no one), and fabric.commit_superseded names the commit and
// the membership_changed it withdraws.
func TestRollbackOfAddReportsTheMemberGone(t *testing.T) {
	t.Parallel()
	carol := peer(t, "carol")
	e, client, _, cA := rolledBack(t, func(_ *testpeer.Peer, g *testpeer.Group) testpeer.Message {
		add, _, err := g.Add(carol)
		if err != nil {
			t.Fatal(err)
		}
		return add
	})
	evs := settled(t, e, cA.Transport.Group, client, 4)
	uniqueIDs(t, evs)
	want := []schema.EventKind{schema.KindConversationJoined, schema.KindMembershipChanged, schema.KindCommitSuperseded, schema.KindMembershipChanged}
	if !slices.Equal(kinds(evs), want) {
		t.Fatalf("events %v, want %v", kinds(evs), want)
	}
	if got := evs[1].Event.MembershipChanged; !slices.Equal(got.AddedInboxIDs, []string{carol.InboxID()}) || len(got.RemovedInboxIDs) != 0 {
		t.Fatalf("the add reported %+v", got)
	}
	wantWithdrawn(t, evs[2].Event.CommitSuperseded, cA, evs[1])
	if got := evs[3].Event.MembershipChanged; len(got.AddedInboxIDs) != 0 || !slices.Equal(got.RemovedInboxIDs, []string{carol.InboxID()}) {
		t.Fatalf("after the rollback %+v, want carol removed", got)
	}
}

// TestRollbackOfRenameReportsTheNameBack: a rename superseded by a later
// winner is reported undone (metadata_changed group_name, measured
// against the winning branch), and fabric.commit_superseded names the
// rename and the metadata_changed it withdraws.
func TestRollbackOfRenameReportsTheNameBack(t *testing.T) {
	t.Parallel()
	e, client, _, cA := rolledBack(t, rename(t, "renamed"))
	evs := settled(t, e, cA.Transport.Group, client, 4)
	uniqueIDs(t, evs)
	want := []schema.EventKind{schema.KindConversationJoined, schema.KindMetadataChanged, schema.KindCommitSuperseded, schema.KindMetadataChanged}
	if !slices.Equal(kinds(evs), want) {
		t.Fatalf("events %v, want %v", kinds(evs), want)
	}
	wantWithdrawn(t, evs[2].Event.CommitSuperseded, cA, evs[1])
	if got := evs[3].Event.MetadataChanged.Changed; !slices.Equal(got, []string{components.FieldGroupName}) {
		t.Fatalf("after the rollback %v changed, want the group name", got)
	}
}

// removeBob is a change that removes the hosted client bob (an admin's
// commit: privileged in branch order).
func removeBob(t *testing.T) func(*testpeer.Peer, *testpeer.Group) testpeer.Message {
	return func(_ *testpeer.Peer, g *testpeer.Group) testpeer.Message {
		return must[testpeer.Message](t)(g.Remove(peer(t, "bob").InboxID()))
	}
}

// TestRollbackOfOwnRemovalRejoins: a delivered commit that removed the
// hosted client is superseded by a deeper branch that keeps it. The
// client was told conversation.removed; the removed member's retained
// state follows the group inside the rollback horizon, so the winner
// brings it back: fabric.commit_superseded withdraws the removal, then
// conversation.joined (JOIN-042: the ended group's state replaced;
// EVENT-005/023: welcomed, by the adder it first joined by), and the next
// message of the winning branch reaches it.
func TestRollbackOfOwnRemovalRejoins(t *testing.T) {
	t.Parallel()
	r := changed(t, removeBob(t), 2)
	// The removed member's retained state is stored: a restarted worker
	// brings it back as well.
	r.stop()
	r.e.worker("w2", nil)
	r.compete(2)
	e, client, cA := r.e, r.client, r.cA
	e.waitOutcome(cA.ID, schema.DispositionDeferred)
	msg := must[testpeer.Message](t)(r.other.SendText("after the rollback"))
	e.publish(msg)
	evs := settled(t, e, cA.Transport.Group, client, 6)
	uniqueIDs(t, evs)
	want := []schema.EventKind{
		schema.KindConversationJoined, schema.KindConversationRemoved, schema.KindMembershipChanged,
		schema.KindCommitSuperseded, schema.KindConversationJoined, schema.KindMessageReceived,
	}
	if !slices.Equal(kinds(evs), want) {
		t.Fatalf("events %v, want %v", kinds(evs), want)
	}
	wantWithdrawn(t, evs[3].Event.CommitSuperseded, cA, evs[1], evs[2])
	first, again := evs[0].Event.ConversationJoined, evs[4].Event.ConversationJoined
	if again.Origin != schema.OriginWelcomed || again.AdderInboxID == nil || first.AdderInboxID == nil || *again.AdderInboxID != *first.AdderInboxID || !bytes.Equal(again.GroupID, first.GroupID) {
		t.Fatalf("rejoined %+v, want welcomed by the first adder %+v", again, first)
	}
	if got := evs[5].Event.MessageReceived; !bytes.Equal(got.MessageID, msg.ID) {
		t.Fatalf("received %x, want the winning branch's message %x", got.MessageID, msg.ID)
	}
}

// TestRollbackOfOwnRemovalThatWinsStaysRemoved: the removal (privileged)
// wins over a competing ordinary commit of the same epoch: the client
// stays removed and is told no conversation.joined.
func TestRollbackOfOwnRemovalThatWinsStaysRemoved(t *testing.T) {
	t.Parallel()
	r := changed(t, removeBob(t), 2)
	e, client, g, cA := r.e, r.client, r.g, r.cA
	rival := must[testpeer.Message](t)(r.other.Commit())
	e.publish(rival)
	e.waitOutcome(rival.ID, schema.DispositionDeferred)
	e.publish(must[testpeer.Message](t)(g.SendText("after the removal")))
	if o := e.outcome(cA.ID); o.Disposition != schema.DispositionAccepted {
		t.Fatalf("the removal is %s, want accepted", o.Disposition)
	}
	evs := settled(t, e, cA.Transport.Group, client, 3)
	if want := []schema.EventKind{schema.KindConversationJoined, schema.KindConversationRemoved, schema.KindMembershipChanged}; !slices.Equal(kinds(evs), want) {
		t.Fatalf("events %v, want %v", kinds(evs), want)
	}

	// The removed member's state is retained while a branch forking before
	// the removal may still win, and dropped once input reaches
	// max_rewind_commits epochs past it: the removal is settled. Its keys
	// are retained in the group's one view while the group state says so.
	retained := func() bool {
		w, ck, _ := viewBlob(t, e, cA.Transport.Group)
		b, err := w.getBlob(e.ctx, ck.State)
		if err != nil {
			t.Fatal(err)
		}
		gs, err := decodeGroupState(b)
		if err != nil {
			t.Fatal(err)
		}
		return gs.Members[client].Retained
	}
	for i := range convergence.V1.MaxRewindCommits + 1 {
		c := must[testpeer.Message](t)(g.Commit())
		e.publish(c)
		if i < convergence.V1.MaxRewindCommits {
			e.waitOutcome(c.ID, schema.DispositionDeferred)
			if !retained() {
				t.Fatalf("the removed member's state is dropped %d epochs after the removal", i)
			}
			continue
		}
		if o := e.outcome(c.ID); o.Status != schema.StatusRejected || o.Category != schema.CategoryUnknownGroup {
			t.Fatalf("input past the horizon is %+v, want unknown_group", o)
		}
	}
	if retained() {
		t.Fatal("the removed member's state outlives the rollback horizon")
	}
	if evs := e.waitEvents(client, 3); len(evs) != 3 {
		t.Fatalf("events %v after the removal settled", kinds(evs))
	}
}

// TestFORK040LostRetainedStateIsForked: a hosted member whose retained
// state inside the rollback horizon is lost can follow no branch
// (Unrecoverable, Marmot durability.md): its fork state becomes forked and
// its client gets conversation.fork_detected, once, however much input
// follows, and its readable conversation record says forked.
func TestFORK040LostRetainedStateIsForked(t *testing.T) {
	t.Parallel()
	e, client, stop, _, g := bobJoined(t)
	c := must[testpeer.Message](t)(g.Commit())
	e.publish(c)
	e.waitOutcome(c.ID, schema.DispositionAccepted)
	stop()
	loseRetainedState(t, e, c.Transport.Group)

	e.worker("w2", nil)
	for _, text := range []string{"one", "two"} {
		e.publish(must[testpeer.Message](t)(g.SendText(text)))
	}
	evs := settled(t, e, c.Transport.Group, client, 2)
	if want := []schema.EventKind{schema.KindConversationJoined, schema.KindConversationForkDetected}; !slices.Equal(kinds(evs), want) {
		t.Fatalf("events %v, want %v", kinds(evs), want)
	}
	// EVENT-010: the readable record the read API answers with is stored
	// in the event's batch, so it says forked once the event is out.
	if rec := e.conversationRecord(c.Transport.Group, client); !rec.Forked {
		t.Fatalf("the client's conversation record after fork_detected: %+v, want forked", rec)
	}
}

// loseRetainedState damages the snapshot of the oldest retained state (the
// anchor, below the canonical tip) in the group's stored convergence view,
// as storage loss would: the state no longer restores.
func loseRetainedState(t *testing.T, e *env, groupID []byte) {
	t.Helper()
	w, ck, blob := viewBlob(t, e, groupID)
	key := ck.Members[sharedKey]
	sealed, ok := bytes.CutPrefix(blob, splitPrefix)
	if !ok {
		t.Fatal("the member blob is not a split convergence state")
	}
	raw, err := e.vault.OpenState(sealed)
	if err != nil {
		t.Fatal(err)
	}
	// The ratchet tree's declared leaf count (its first base64 digit)
	// becomes absurd; the anchor's snapshot comes first (by epoch).
	at := bytes.Index(raw, []byte(`"ratchet_tree":"A`))
	if at < 0 || bytes.Count(raw, []byte(`"ratchet_tree":"`)) < 2 {
		t.Fatal("no retained state below the tip in the stored state")
	}
	raw[at+len(`"ratchet_tree":"`)] = '/'
	resealed, err := e.vault.SealState(raw)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := w.putBlobs(e.ctx, map[string][]byte{key: append(slices.Clone(splitPrefix), resealed...)}); err != nil {
		t.Fatal(err)
	}
}
