package converge

import (
	"bytes"
	"slices"
	"testing"

	"github.com/fabric-mls/fabric/internal/bus"
	"github.com/fabric-mls/fabric/internal/components"
	"github.com/fabric-mls/fabric/internal/testpeer"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// The cases where the group's one convergence view is not each hosted
// member's own view (docs/shared-state.md, "Where one view is the members'
// own views and where it is not"), through converge with real mls-go peers.

// sharedGroup hosts bob, and dave too when both, in a group of alice's
// (admin) and waits for their conversation.joined. It also registers dave
// when he is not in the group yet, for a later Welcome.
func sharedGroup(t *testing.T, both bool) (e *env, bob, dave hosted, alice *testpeer.Peer, g *testpeer.Group) {
	t.Helper()
	e = newEnv(t)
	bob = e.register(peer(t, "bob").AccountID(), 1)
	dave = e.register(peer(t, "dave").AccountID(), 1)
	e.worker("w1", nil)
	hs := []hosted{bob}
	if both {
		hs = append(hs, dave)
	}
	alice, g = groupWithHosted(t, e, components.Set{}, hs...)
	for _, h := range hs {
		e.waitEvents(h.rec.ClientID, 1)
	}
	return e, bob, dave, alice, g
}

// wantKinds fails unless evs are of the kinds want, in order.
func wantKinds(t *testing.T, who string, evs []bus.Delivered, want ...schema.EventKind) {
	t.Helper()
	if !slices.Equal(kinds(evs), want) {
		t.Fatalf("%s's events %v, want %v", who, kinds(evs), want)
	}
}

// wantReceived fails unless ev is message.received of msg.
func wantReceived(t *testing.T, ev bus.Delivered, msg testpeer.Message) {
	t.Helper()
	if r := ev.Event.MessageReceived; r == nil || !bytes.Equal(r.MessageID, msg.ID) {
		t.Fatalf("%s, want message.received of %x", describe(ev.Event), msg.ID)
	}
}

// wantRemoved fails unless the stored group state has client removed,
// its keys retained while a branch that keeps it may still win.
func wantRemoved(t *testing.T, e *env, group []byte, client string) {
	t.Helper()
	m := e.storedGroup(group).Members[client]
	if m == nil || !m.Removed || !m.Retained {
		t.Fatalf("%s in the stored group state: %+v, want removed and retained", client, m)
	}
}

// wantMember fails unless the stored group state has client an active
// member.
func wantMember(t *testing.T, e *env, group []byte, client string) {
	t.Helper()
	if m := e.storedGroup(group).Members[client]; m == nil || m.Removed {
		t.Fatalf("%s in the stored group state: %+v, want a member", client, m)
	}
}

// TestJOIN042RemovalOnLosingBranchOfASharedView: bob and dave are hosted;
// alice removes bob, and the one view grows that branch past the removal
// for dave (a commit bob's own view could not replay). A branch from before
// the removal then wins. Bob was told conversation.removed; he gets
// fabric.commit_superseded withdrawing exactly the removal's events (none
// for the commit after it, which was never his), conversation.joined with
// origin welcomed (JOIN-042, EVENT-005), the winner's metadata change and
// the winning branch's message (EVENT-012 order). Dave gets the removal
// of bob taken back and the same message.
func TestJOIN042RemovalOnLosingBranchOfASharedView(t *testing.T) {
	t.Parallel()
	e, hb, hd, alice, g := sharedGroup(t, true)
	bob, dave := hb.rec.ClientID, hd.rec.ClientID
	other := must[*testpeer.Group](t)(g.Clone())
	rm := must[testpeer.Message](t)(g.Remove(peer(t, "bob").InboxID()))
	e.publish(rm)
	e.waitOutcome(rm.ID, schema.DispositionAccepted)
	after := must[testpeer.Message](t)(g.Commit())
	e.publish(after)
	e.waitOutcome(after.ID, schema.DispositionAccepted)
	wantKinds(t, "bob", e.waitEvents(bob, 3), schema.KindConversationJoined, schema.KindConversationRemoved, schema.KindMembershipChanged)

	// Depth 2 against 2: the winner's tip is privileged (a rename by the
	// admin), the loser's an empty commit.
	e.publish(must[testpeer.Message](t)(other.Commit()))
	e.publish(must[testpeer.Message](t)(setProfile(components.ProfileState{Name: "b"}, alice.AccountID())(other)))
	e.waitOutcome(rm.ID, schema.DispositionDeferred)
	e.waitOutcome(after.ID, schema.DispositionDeferred)
	onB := must[testpeer.Message](t)(other.SendText("on the winning branch"))
	e.publish(onB)

	evs := settled(t, e, rm.Transport.Group, bob, 7)
	uniqueIDs(t, evs)
	wantKinds(t, "bob", evs,
		schema.KindConversationJoined, schema.KindConversationRemoved, schema.KindMembershipChanged,
		schema.KindCommitSuperseded, schema.KindConversationJoined, schema.KindMetadataChanged, schema.KindMessageReceived)
	wantWithdrawn(t, evs[3].Event.CommitSuperseded, rm, evs[1], evs[2])
	if j := evs[4].Event.ConversationJoined; j.Origin != schema.OriginWelcomed {
		t.Fatalf("bob rejoined %+v, want origin welcomed", j)
	}
	wantReceived(t, evs[6], onB)
	wantMember(t, e, rm.Transport.Group, bob)

	devs := e.waitEvents(dave, 7)
	wantKinds(t, "dave", devs,
		schema.KindConversationJoined, schema.KindMembershipChanged, schema.KindCommitSuperseded, schema.KindCommitSuperseded,
		schema.KindMembershipChanged, schema.KindMetadataChanged, schema.KindMessageReceived)
	var undone [][]byte
	for _, d := range devs[2:4] {
		undone = append(undone, d.Event.CommitSuperseded.CommitDigest)
	}
	if !slices.ContainsFunc(undone, func(id []byte) bool { return bytes.Equal(id, rm.ID) }) || !slices.ContainsFunc(undone, func(id []byte) bool { return bytes.Equal(id, after.ID) }) {
		t.Fatalf("dave's superseded commits %x, want the removal %x and the commit after it %x", undone, rm.ID, after.ID)
	}
	if got := devs[4].Event.MembershipChanged; !slices.Equal(got.AddedInboxIDs, []string{peer(t, "bob").InboxID()}) || len(got.RemovedInboxIDs) != 0 {
		t.Fatalf("dave after the rollback %+v, want bob added back", got)
	}
	wantReceived(t, devs[6], onB)
}

// TestEVENT006RemovalOnlyOnLosingBranchIsNotReported: bob and dave are
// hosted; a branch of two commits is selected, then alice's removal of bob
// from their parent arrives, a shallower branch that loses. Bob is told
// nothing of it (conversation.removed is for a removal delivered, EVENT-006)
// and keeps receiving on the selected branch, as dave does.
func TestEVENT006RemovalOnlyOnLosingBranchIsNotReported(t *testing.T) {
	t.Parallel()
	e, hb, hd, _, g := sharedGroup(t, true)
	bob, dave := hb.rec.ClientID, hd.rec.ClientID
	other := must[*testpeer.Group](t)(g.Clone())
	win := e.publishCommits(g, 2)
	e.waitOutcome(win.ID, schema.DispositionAccepted)
	rm := must[testpeer.Message](t)(other.Remove(peer(t, "bob").InboxID()))
	e.publish(rm)
	e.waitOutcome(rm.ID, schema.DispositionDeferred)
	msg := must[testpeer.Message](t)(g.SendText("on the selected branch"))
	e.publish(msg)

	for _, c := range []string{bob, dave} {
		evs := settled(t, e, rm.Transport.Group, c, 2)
		wantKinds(t, c, evs, schema.KindConversationJoined, schema.KindMessageReceived)
		wantReceived(t, evs[1], msg)
	}
	if o := e.outcome(rm.ID); o.Disposition != schema.DispositionDeferred {
		t.Fatalf("the removal is %s, want deferred", o.Disposition)
	}
	wantMember(t, e, rm.Transport.Group, bob)
}

// TestEVENT006RemovalBranchGrownForTheOthersWins: as above, but alice's
// branch goes on past bob's removal, deeper than the selected one. Bob's
// own view would end that branch at the removal and keep the other; the
// group's one view grows it for dave and selects it for both
// (docs/shared-state.md: the view of the members that stay). Bob gets the
// selected branch's commits superseded, then conversation.removed with
// cause removed (EVENT-006) and the membership change, and is removed
// (retained) in the group state; dave gets the removal and the message on
// the new branch.
func TestEVENT006RemovalBranchGrownForTheOthersWins(t *testing.T) {
	t.Parallel()
	e, hb, hd, _, g := sharedGroup(t, true)
	bob, dave := hb.rec.ClientID, hd.rec.ClientID
	other := must[*testpeer.Group](t)(g.Clone())
	lose := e.publishCommits(g, 2)
	e.waitOutcome(lose.ID, schema.DispositionAccepted)
	rm := must[testpeer.Message](t)(other.Remove(peer(t, "bob").InboxID()))
	e.publish(rm)
	e.publishCommits(other, 2)
	e.waitOutcome(rm.ID, schema.DispositionAccepted)
	msg := must[testpeer.Message](t)(other.SendText("on the removal's branch"))
	e.publish(msg)

	evs := settled(t, e, rm.Transport.Group, bob, 5)
	wantKinds(t, "bob", evs,
		schema.KindConversationJoined, schema.KindCommitSuperseded, schema.KindCommitSuperseded,
		schema.KindConversationRemoved, schema.KindMembershipChanged)
	if r := evs[3].Event.ConversationRemoved; r.Cause != schema.RemovalRemoved {
		t.Fatalf("bob's removal %+v, want cause removed", r)
	}
	wantRemoved(t, e, rm.Transport.Group, bob)
	devs := e.waitEvents(dave, 5)
	wantKinds(t, "dave", devs,
		schema.KindConversationJoined, schema.KindCommitSuperseded, schema.KindCommitSuperseded,
		schema.KindMembershipChanged, schema.KindMessageReceived)
	wantReceived(t, devs[4], msg)
}

// TestEVENT006JoinOnLosingBranchIsReportedRemoved: dave joins by a Welcome
// of alice's commit on a branch that a deeper one from its parent then
// replaces. On the selected branch dave has no keys: the one view drops
// him (his own view would have started at the join and called the winner
// stale). His client, told conversation.joined, learns it by
// conversation.removed with cause removed (EVENT-006; docs/converge.md,
// Effects: a member the losing branch added is reported removed), after
// the message he was delivered on the losing branch is invalidated; he is
// delivered nothing of the winning branch, and the group state holds him
// removed. Bob, hosted throughout, sees the add taken back.
func TestEVENT006JoinOnLosingBranchIsReportedRemoved(t *testing.T) {
	t.Parallel()
	lost := joinLost(t)
	e, bob, dave, add, onA := lost.e, lost.bob, lost.dave, lost.add, lost.onA
	onB := must[testpeer.Message](t)(lost.other.SendText("on the winning branch"))
	e.publish(onB)

	evs := settled(t, e, add.Transport.Group, bob, 7)
	wantKinds(t, "bob", evs,
		schema.KindConversationJoined, schema.KindMembershipChanged, schema.KindMessageReceived,
		schema.KindCommitSuperseded, schema.KindMessageInvalidated, schema.KindMembershipChanged, schema.KindMessageReceived)
	wantReceived(t, evs[6], onB)

	devs := e.waitEvents(dave, 4)
	uniqueIDs(t, devs)
	wantKinds(t, "dave", devs,
		schema.KindConversationJoined, schema.KindMessageReceived, schema.KindMessageInvalidated, schema.KindConversationRemoved)
	if inv := devs[2].Event.MessageInvalidated; !bytes.Equal(inv.MessageID, onA.ID) {
		t.Fatalf("dave's invalidated %x, want %x", []byte(inv.MessageID), onA.ID)
	}
	if r := devs[3].Event.ConversationRemoved; r.Cause != schema.RemovalRemoved || !bytes.Equal(r.GroupID, add.Transport.Group) {
		t.Fatalf("dave's removal %+v, want cause removed of the group", r)
	}
	wantRemoved(t, e, add.Transport.Group, dave)
}

// lostJoin is dave's join by a Welcome on a branch that lost: alice's
// group g on it, other hers on the winning branch of two empty commits.
type lostJoin struct {
	e         *env
	bob, dave string
	g, other  *testpeer.Group
	add, onA  testpeer.Message // dave's add and a message on its branch
}

// joinLost hosts bob, has alice add dave by a Welcome and send a message
// dave receives, then publishes a deeper branch from the add's parent and
// waits until it wins (the add deferred).
func joinLost(t *testing.T) lostJoin {
	t.Helper()
	e, hb, hd, _, g := sharedGroup(t, false)
	other := must[*testpeer.Group](t)(g.Clone())
	add, welcome := mustInvite(t, g, hd)
	e.publish(add)
	e.publish(welcome)
	e.waitOutcome(add.ID, schema.DispositionAccepted)
	onA := must[testpeer.Message](t)(g.SendText("on the losing branch"))
	e.publish(onA)
	wantReceived(t, e.waitEvents(hd.rec.ClientID, 2)[1], onA)
	e.publish(must[testpeer.Message](t)(other.Commit()))
	e.publish(must[testpeer.Message](t)(other.Commit()))
	e.waitOutcome(add.ID, schema.DispositionDeferred)
	return lostJoin{e: e, bob: hb.rec.ClientID, dave: hd.rec.ClientID, g: g, other: other, add: add, onA: onA}
}

// TestJOIN042LostJoinWonAgainRejoins: dave's join lost to a deeper branch
// (conversation.removed, TestEVENT006JoinOnLosingBranchIsReportedRemoved),
// then the branch holding it grows deeper and wins back inside the rollback
// horizon. Dave's keys there are kept, so he is back as a member the
// winner keeps after a removal is (docs/convergence.md, Removal inside the
// rollback horizon): fabric.commit_superseded withdrawing exactly his
// conversation.removed, conversation.joined with origin welcomed (JOIN-042,
// EVENT-005), then the message invalidated before delivered again and the
// next message of his branch (EVENT-012 order).
func TestJOIN042LostJoinWonAgainRejoins(t *testing.T) {
	t.Parallel()
	lost := joinLost(t)
	e, dave, g := lost.e, lost.dave, lost.g
	removed := e.waitEvents(dave, 4)[3]
	e.publishCommits(g, 2)
	e.waitOutcome(lost.add.ID, schema.DispositionAccepted)
	again := must[testpeer.Message](t)(g.SendText("on the branch that won back"))
	e.publish(again)

	devs := settled(t, e, lost.add.Transport.Group, dave, 8)
	uniqueIDs(t, devs)
	wantKinds(t, "dave", devs,
		schema.KindConversationJoined, schema.KindMessageReceived, schema.KindMessageInvalidated, schema.KindConversationRemoved,
		schema.KindCommitSuperseded, schema.KindConversationJoined, schema.KindMessageReceived, schema.KindMessageReceived)
	if sup := devs[4].Event.CommitSuperseded; !slices.Equal(sup.WithdrawnEventIDs, []string{removed.ID}) {
		t.Fatalf("dave's commit_superseded withdraws %v, want his conversation.removed %s", sup.WithdrawnEventIDs, removed.ID)
	}
	if j := devs[5].Event.ConversationJoined; j.Origin != schema.OriginWelcomed {
		t.Fatalf("dave rejoined %+v, want origin welcomed", j)
	}
	wantReceived(t, devs[6], lost.onA)
	wantReceived(t, devs[7], again)
	wantMember(t, e, lost.add.Transport.Group, dave)
}

// TestEVENT006RollbackBelowLaterJoinIsReportedRemoved: dave joins by a
// Welcome one commit after the point a deeper branch then forks from. His
// own view would have started at his join and called that branch stale;
// the one view selects it, where dave's add is not, so dave has no keys
// there: conversation.removed with cause removed (EVENT-006), nothing of
// the winning branch, removed in the group state. Bob, hosted below the
// fork, follows the winner and receives its message.
func TestEVENT006RollbackBelowLaterJoinIsReportedRemoved(t *testing.T) {
	t.Parallel()
	e, hb, hd, _, g := sharedGroup(t, false)
	bob, dave := hb.rec.ClientID, hd.rec.ClientID
	other := must[*testpeer.Group](t)(g.Clone())
	below := must[testpeer.Message](t)(g.Commit())
	e.publish(below)
	e.waitOutcome(below.ID, schema.DispositionAccepted)
	add, welcome := mustInvite(t, g, hd)
	e.publish(add)
	e.publish(welcome)
	e.waitOutcome(add.ID, schema.DispositionAccepted)
	e.waitEvents(dave, 1)

	e.publishCommits(other, 3)
	e.waitOutcome(below.ID, schema.DispositionDeferred)
	e.waitOutcome(add.ID, schema.DispositionDeferred)
	onB := must[testpeer.Message](t)(other.SendText("on the winning branch"))
	e.publish(onB)

	evs := settled(t, e, add.Transport.Group, bob, 6)
	wantKinds(t, "bob", evs,
		schema.KindConversationJoined, schema.KindMembershipChanged,
		schema.KindCommitSuperseded, schema.KindCommitSuperseded, schema.KindMembershipChanged, schema.KindMessageReceived)
	wantReceived(t, evs[5], onB)

	devs := e.waitEvents(dave, 2)
	wantKinds(t, "dave", devs, schema.KindConversationJoined, schema.KindConversationRemoved)
	if r := devs[1].Event.ConversationRemoved; r.Cause != schema.RemovalRemoved {
		t.Fatalf("dave's removal %+v, want cause removed", r)
	}
	wantRemoved(t, e, add.Transport.Group, dave)
}

// mustInvite has g's member add h by its first KeyPackage.
func mustInvite(t *testing.T, g *testpeer.Group, h hosted) (commit, welcome testpeer.Message) {
	t.Helper()
	commit, welcome, err := g.Invite(h.kps[0])
	if err != nil {
		t.Fatal(err)
	}
	return commit, welcome
}
