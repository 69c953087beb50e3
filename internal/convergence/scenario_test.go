package convergence

import (
	"bytes"
	"slices"
	"testing"
	"time"

	"github.com/fabric-mls/fabric/internal/components"
	"github.com/fabric-mls/fabric/internal/testpeer"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// race admits two competing branches into fresh instances in both orders
// and returns the results of the forward run; both runs must select the
// same tip (arrival order never enters selection).
func race(t *testing.T, w *world, x, y []testpeer.Message) (*Group, Result) {
	t.Helper()
	var first *Group
	var firstRes Result
	for i, order := range [][]testpeer.Message{append(slices.Clone(x), y...), append(slices.Clone(y), x...)} {
		g := w.fresh()
		res := admit(t, g, t0, order...)
		if !res.ForkDetected || g.Lifecycle() != Recovering {
			t.Fatalf("order %d: competing commits did not enter Recovering", i)
		}
		res.merge(settle(t, g))
		if g.Lifecycle() != Stable {
			t.Fatalf("order %d: lifecycle %s after apply", i, g.Lifecycle())
		}
		if first == nil {
			first, firstRes = g, res
			continue
		}
		if !bytes.Equal(first.Tip().EpochAuthenticator(), g.Tip().EpochAuthenticator()) {
			t.Fatal("arrival order changed the selected branch")
		}
	}
	return first, firstRes
}

// TestSameEpochRace_Depth: a longer branch beats a privileged, witnessed
// one-commit branch (step 1, effective depth).
func TestSameEpochRace_Depth(t *testing.T) {
	w := newWorld(t)
	x1 := commit(t, w.bob)
	x2 := commit(t, w.bob)
	a := clone(t, w.alice)
	y1 := must[testpeer.Message](t)(a.SetComponents(components.Set{Admins: []components.AccountID{account(0x80)}, Profile: &components.ProfileState{Name: "renamed"}}))
	yw := text(t, a, "on y")
	g, res := race(t, w, []testpeer.Message{x1, x2}, []testpeer.Message{y1, yw})
	wantTip(t, g, w.bob)
	wantIDs(t, "applied", appliedIDs(res), ids(x1, x2))
	wantOutcome(t, g, x1, schema.DispositionAccepted, "", "")
	wantOutcome(t, g, x2, schema.DispositionAccepted, "", "")
	wantOutcome(t, g, y1, schema.DispositionDeferred, "", "") // eligible losing branch
	wantOutcome(t, g, yw, schema.DispositionInvalidated, "", "")
	if len(res.Delivered) != 0 {
		t.Fatal("a losing branch's payload was delivered")
	}
}

// TestSameEpochRace_Quorum: equal effective depth (2 raw vs 1 raw + boost);
// the branch with witness quorum wins (step 2).
func TestSameEpochRace_Quorum(t *testing.T) {
	w := newWorld(t)
	bx := clone(t, w.bob)
	x1 := commit(t, bx)
	x2 := commit(t, bx)
	y1 := commit(t, w.carol)
	a := clone(t, w.alice)
	w.deliverPeers(y1, a)
	yw1 := text(t, a, "alice on y")
	yw2 := text(t, w.carol, "carol on y")
	g, res := race(t, w, []testpeer.Message{x1, x2}, []testpeer.Message{y1, yw1, yw2})
	wantTip(t, g, w.carol)
	wantIDs(t, "applied", appliedIDs(res), ids(y1))
	wantOutcome(t, g, x1, schema.DispositionDeferred, "", "")
	wantOutcome(t, g, x2, schema.DispositionDeferred, "", "")
	wantOutcome(t, g, yw1, schema.DispositionAccepted, "", "")
	// One epoch: the sender's leaf orders the two (alice's before carol's),
	// never the message ids (EVENT-012).
	wantIDs(t, "delivered", deliveredIDs(res), ids(yw1, yw2))
}

// TestSameEpochRace_WitnessScore: equal depth, no quorum; one witness beats
// none even against a privileged tip (step 3).
func TestSameEpochRace_WitnessScore(t *testing.T) {
	w := newWorld(t)
	x1 := commit(t, w.carol)
	b := clone(t, w.bob)
	w.deliverPeers(x1, b)
	xw := text(t, b, "bob on x")
	a := clone(t, w.alice)
	y1 := must[testpeer.Message](t)(a.SetComponents(components.Set{Admins: []components.AccountID{account(0x80)}, Profile: &components.ProfileState{Name: "renamed"}}))
	g, res := race(t, w, []testpeer.Message{x1, xw}, []testpeer.Message{y1})
	wantTip(t, g, w.carol)
	wantIDs(t, "applied", appliedIDs(res), ids(x1))
	wantOutcome(t, g, y1, schema.DispositionDeferred, "", "")
	wantOutcome(t, g, xw, schema.DispositionAccepted, "", "")
}

// TestSameEpochRace_Privileged: tied depth and witnesses; the privileged
// tip wins over an ordinary one with a lower committer (step 4).
func TestSameEpochRace_Privileged(t *testing.T) {
	w := newWorld(t)
	a := clone(t, w.alice)
	x1 := must[testpeer.Message](t)(a.SetComponents(components.Set{Admins: []components.AccountID{account(0x80)}, Profile: &components.ProfileState{Name: "renamed"}}))
	y1 := commit(t, w.bob) // bob 0x20… < alice 0x80…
	g, res := race(t, w, []testpeer.Message{x1}, []testpeer.Message{y1})
	wantTip(t, g, a)
	wantIDs(t, "applied", appliedIDs(res), ids(x1))
	if !res.Applied[0].Result.Privileged {
		t.Fatal("the admin's component change is not privileged")
	}
	wantOutcome(t, g, y1, schema.DispositionDeferred, "", "")
}

// TestSameEpochRace_Committer: two ordinary tips; the lower committer wins
// although its digest is the higher one (step 5).
func TestSameEpochRace_Committer(t *testing.T) {
	w := newWorld(t)
	var x1, y1 testpeer.Message
	for range 64 {
		x1 = commit(t, clone(t, w.bob))
		y1 = commit(t, clone(t, w.carol))
		if d1, d2 := idOf(x1), idOf(y1); bytes.Compare(d1[:], d2[:]) > 0 {
			break
		}
	}
	if d1, d2 := idOf(x1), idOf(y1); bytes.Compare(d1[:], d2[:]) < 0 {
		t.Skip("could not draw a higher digest for the lower committer")
	}
	g, res := race(t, w, []testpeer.Message{x1}, []testpeer.Message{y1})
	wantIDs(t, "applied", appliedIDs(res), ids(x1))
	wantOutcome(t, g, y1, schema.DispositionDeferred, "", "")
	if g.Tip().Epoch() != w.bob.Epoch()+1 {
		t.Fatal("tip epoch")
	}
}

// TestSameEpochRace_Digest: one committer, two ordinary commits from one
// parent; the lower commit_digest wins (step 6).
func TestSameEpochRace_Digest(t *testing.T) {
	w := newWorld(t)
	fork := must[[]testpeer.Message](t)(w.bob.Fork(2))
	lo, hi := fork[0], fork[1]
	if d1, d2 := idOf(lo), idOf(hi); bytes.Compare(d1[:], d2[:]) > 0 {
		lo, hi = hi, lo
	}
	g, res := race(t, w, []testpeer.Message{hi}, []testpeer.Message{lo})
	if err := w.bob.Adopt(lo); err != nil {
		t.Fatal(err)
	}
	wantTip(t, g, w.bob)
	wantIDs(t, "applied", appliedIDs(res), ids(lo))
	wantOutcome(t, g, hi, schema.DispositionDeferred, "", "")
}

// TestLateWinningCommitRollsBack: a delivered branch loses to a longer
// branch that arrives later inside the horizon; its commit is superseded
// and its delivered payload withdrawn (convergence.md, "Applying the
// selected branch").
func TestLateWinningCommitRollsBack(t *testing.T) {
	w := newWorld(t)
	a := clone(t, w.alice)
	x1 := commit(t, w.bob)
	w.deliverPeers(x1, w.carol)
	xw := text(t, w.carol, "on x")
	g := w.fresh()
	r := admit(t, g, t0, x1)
	if r.ForkDetected || g.Lifecycle() != Stable {
		t.Fatal("linear advancement entered Recovering")
	}
	r = settle(t, g)
	wantIDs(t, "applied", appliedIDs(r), ids(x1))
	r = admit(t, g, t0.Add(10*time.Second), xw)
	wantIDs(t, "delivered", deliveredIDs(r), ids(xw))
	wantOutcome(t, g, xw, schema.DispositionAccepted, "", "")

	y1 := commit(t, a)
	y2 := commit(t, a)
	r = admit(t, g, t0.Add(20*time.Second), y1)
	if !r.ForkDetected || g.Lifecycle() != Recovering {
		t.Fatal("a divergent edge inside the horizon did not enter Recovering")
	}
	admit(t, g, t0.Add(20*time.Second), y2)
	r = settle(t, g)
	wantTip(t, g, a)
	wantIDs(t, "applied", appliedIDs(r), ids(y1, y2))
	wantIDs(t, "superseded", supersededIDs(r), ids(x1))
	wantIDs(t, "withdrawn", r.Withdrawn, ids(xw))
	wantOutcome(t, g, x1, schema.DispositionDeferred, "", "")
	wantOutcome(t, g, xw, schema.DispositionInvalidated, "", "")
	wantOutcome(t, g, y2, schema.DispositionAccepted, "", "")
}

// advance has bob commit n times, each applied by its own pass in g, with
// carol following.
func advance(t *testing.T, w *world, g *Group, at *time.Time, n int) {
	t.Helper()
	for range n {
		c := commit(t, w.bob)
		w.deliverPeers(c, w.carol)
		*at = at.Add(10 * time.Second)
		admit(t, g, *at, c)
		settle(t, g)
		wantOutcome(t, g, c, schema.DispositionAccepted, "", "")
	}
}

// TestCommitOlderThanAnchor_BeyondAnchor and a fork outside the horizon:
// a commit whose source epoch is older than the retained anchor is
// stale/BeyondAnchor; its child, whose source epoch is the anchor's but
// whose parent forks below it, is stale/stale_epoch (retained-history.md,
// inbound-processing.md "Stale input").
func TestCommitOlderThanAnchor_BeyondAnchor(t *testing.T) {
	w := newWorld(t)
	old := clone(t, w.alice)
	base := w.bob.Epoch()
	g := w.fresh()
	at := t0
	advance(t, w, g, &at, 6)
	if g.AnchorEpoch() != base+1 {
		t.Fatalf("anchor %d, want %d", g.AnchorEpoch(), base+1)
	}
	z1 := commit(t, old)
	z2 := commit(t, old)
	r := admit(t, g, at.Add(time.Second), z1, z2)
	if r.ForkDetected || g.Lifecycle() != Stable {
		t.Fatal("stale input triggered recovery")
	}
	if _, open := g.Deadline(); open {
		t.Fatal("stale input opened a pass")
	}
	wantOutcome(t, g, z1, schema.DispositionStale, schema.CategoryStaleEpoch, schema.BeyondAnchor)
	wantOutcome(t, g, z2, schema.DispositionStale, schema.CategoryStaleEpoch, "")
	wantTip(t, g, w.bob)
}

// TestForkOutsideHorizon_Stale: a deferred child commit whose parent never
// arrives becomes stale once the canonical tip moves its fork outside the
// rollback horizon; the parent, older than the anchor, is BeyondAnchor
// (convergence.md, "Candidate branches", "Eligibility").
func TestForkOutsideHorizon_Stale(t *testing.T) {
	w := newWorld(t)
	side := clone(t, w.alice)
	y1 := commit(t, side)
	y2 := commit(t, side)
	g := w.fresh()
	at := t0
	r := admit(t, g, at, y2) // parent y1 withheld
	wantOutcome(t, g, y2, schema.DispositionDeferred, "", "")
	if r.ForkDetected {
		t.Fatal("a commit with an unavailable parent triggered recovery")
	}
	advance(t, w, g, &at, 5)
	wantOutcome(t, g, y2, schema.DispositionDeferred, "", "")
	advance(t, w, g, &at, 1)
	// y2's source epoch is now the anchor's, and only a fork from below the
	// anchor can hold its parent: outside the horizon, stale, not BeyondAnchor.
	wantOutcome(t, g, y2, schema.DispositionStale, schema.CategoryStaleEpoch, "")
	admit(t, g, at.Add(time.Second), y1)
	wantOutcome(t, g, y1, schema.DispositionStale, schema.CategoryStaleEpoch, schema.BeyondAnchor)
}

// TestChildBeforeParent: a child commit admitted before its parent is
// deferred, then accepted once the parent arrives (inbound-processing.md,
// "Deferred input").
func TestChildBeforeParent(t *testing.T) {
	w := newWorld(t)
	x1 := commit(t, w.bob)
	x2 := commit(t, w.bob)
	g := w.fresh()
	admit(t, g, t0, x2)
	wantOutcome(t, g, x2, schema.DispositionDeferred, "", "")
	if _, open := g.Deadline(); open {
		t.Fatal("a deferred commit opened a pass")
	}
	admit(t, g, t0.Add(time.Second), x1)
	r := settle(t, g)
	wantIDs(t, "applied", appliedIDs(r), ids(x1, x2))
	wantOutcome(t, g, x1, schema.DispositionAccepted, "", "")
	wantOutcome(t, g, x2, schema.DispositionAccepted, "", "")
	wantTip(t, g, w.bob)
}

// TestFutureEpochAppMessage: an app message of an epoch no retained state
// has yet stays deferred, and is delivered once the branch that decrypts it
// is applied (retained-history.md, "App-payload retention").
func TestFutureEpochAppMessage(t *testing.T) {
	w := newWorld(t)
	x1 := commit(t, w.bob)
	w.deliverPeers(x1, w.carol)
	m := text(t, w.carol, "from the future")
	g := w.fresh()
	r := admit(t, g, t0, m)
	wantOutcome(t, g, m, schema.DispositionDeferred, "", "")
	if len(r.Delivered) != 0 {
		t.Fatal("delivered before its epoch is canonical")
	}
	admit(t, g, t0, x1)
	wantOutcome(t, g, m, schema.DispositionDeferred, "", "") // witness of a pending edge
	r = settle(t, g)
	wantIDs(t, "delivered", deliveredIDs(r), ids(m))
	wantOutcome(t, g, m, schema.DispositionAccepted, "", "")
}

// TestAppPayloadWindowEdge: an app message exactly app_payload_past_epoch_limit
// epochs behind the canonical tip is delivered; one epoch further it is stale.
func TestAppPayloadWindowEdge(t *testing.T) {
	w := newWorld(t)
	inside := text(t, w.carol, "five behind")
	outside := text(t, w.carol, "six behind")
	sent := w.carol.Epoch()
	g := w.fresh()
	at := t0
	advance(t, w, g, &at, 5)
	if g.TipEpoch()-sent != V1.AppPayloadPastEpochLimit {
		t.Fatal("setup: not at the window edge")
	}
	r := admit(t, g, at.Add(time.Second), inside)
	wantIDs(t, "delivered", deliveredIDs(r), ids(inside))
	wantOutcome(t, g, inside, schema.DispositionAccepted, "", "")
	advance(t, w, g, &at, 1)
	r = admit(t, g, at.Add(time.Second), outside)
	if len(r.Delivered) != 0 {
		t.Fatal("delivered outside the window")
	}
	wantOutcome(t, g, outside, schema.DispositionStale, schema.CategoryStaleEpoch, "")
}

// TestProposalsByBranch: a proposal consumed by a selected commit is
// accepted; one consumed only by a losing commit stays deferred while that
// branch is eligible and becomes stale when it leaves the horizon; a commit
// whose referenced proposal has not arrived is deferred.
func TestProposalsByBranch(t *testing.T) {
	w := newWorld(t)
	c := clone(t, w.carol)
	leave := must[testpeer.Message](t)(c.Leave())
	a := clone(t, w.alice)
	w.deliverPeers(leave, a)
	x1 := commit(t, a) // alice commits carol's leave request by reference

	t.Run("selected", func(t *testing.T) {
		g := w.fresh()
		admit(t, g, t0, x1)
		wantOutcome(t, g, x1, schema.DispositionDeferred, "", "") // its proposal is missing
		admit(t, g, t0, leave)
		r := settle(t, g)
		wantIDs(t, "applied", appliedIDs(r), ids(x1))
		wantIDs(t, "consumed", r.Applied[0].Proposals, ids(leave))
		if !slices.Equal(r.Applied[0].Result.RemovedInboxes, []string{w.carol.Peer().InboxID()}) {
			t.Fatal("the applied commit does not remove the leaver")
		}
		wantOutcome(t, g, leave, schema.DispositionAccepted, "", "")
		wantOutcome(t, g, x1, schema.DispositionAccepted, "", "")
	})
	t.Run("losing", func(t *testing.T) {
		b := clone(t, w.bob)
		y1, y2 := commit(t, b), commit(t, b)
		g := w.fresh()
		admit(t, g, t0, leave, x1, y1, y2)
		settle(t, g)
		wantOutcome(t, g, x1, schema.DispositionDeferred, "", "")
		wantOutcome(t, g, leave, schema.DispositionDeferred, "", "")
		at := t0.Add(time.Minute)
		for range 4 {
			m := commit(t, b)
			at = at.Add(10 * time.Second)
			admit(t, g, at, m)
			settle(t, g)
		}
		// Tip is fork + 6: the losing branch forked below the anchor.
		wantOutcome(t, g, leave, schema.DispositionStale, schema.CategoryStaleEpoch, "")
		wantOutcome(t, g, x1, schema.DispositionStale, schema.CategoryStaleEpoch, schema.BeyondAnchor)
	})
}

// TestQuiescence: only selection-relevant input restarts quiescence, and
// the absolute deadline never moves.
func TestQuiescence(t *testing.T) {
	w := newWorld(t)
	x1 := commit(t, w.bob)
	w.deliverPeers(x1, w.carol)
	x2 := commit(t, w.bob)
	w.deliverPeers(x2, w.carol)
	g := w.fresh()
	admit(t, g, t0, x1)
	d, _ := g.Deadline()
	if !d.Equal(t0.Add(V1.SettlementQuiescence)) {
		t.Fatalf("deadline %v after open", d.Sub(t0))
	}
	admit(t, g, t0.Add(900*time.Millisecond), x1) // duplicate: no restart
	if d2, _ := g.Deadline(); !d2.Equal(d) {
		t.Fatal("a duplicate restarted quiescence")
	}
	admit(t, g, t0.Add(900*time.Millisecond), x2) // new edge: restart
	if d2, _ := g.Deadline(); !d2.Equal(t0.Add(1900 * time.Millisecond)) {
		t.Fatalf("a new edge did not restart quiescence: %v", d2.Sub(t0))
	}
	m := text(t, w.alice, "ordinary delivery at the canonical tip")
	r := admit(t, g, t0.Add(1500*time.Millisecond), m)
	wantIDs(t, "delivered", deliveredIDs(r), ids(m))
	if d2, _ := g.Deadline(); !d2.Equal(t0.Add(1900 * time.Millisecond)) {
		t.Fatal("ordinary app-payload delivery restarted quiescence")
	}
	for i := range 8 {
		at := t0.Add(time.Duration(1800+i*500) * time.Millisecond)
		c := commit(t, w.bob)
		admit(t, g, at, c)
		want := at.Add(V1.SettlementQuiescence)
		if abs := t0.Add(V1.MaxConvergencePass); abs.Before(want) {
			want = abs
		}
		if d2, _ := g.Deadline(); !d2.Equal(want) {
			t.Fatalf("deadline %v, want %v", d2.Sub(t0), want.Sub(t0))
		}
	}
	if _, ok := g.Cutoff(t0.Add(4999 * time.Millisecond)); ok {
		t.Fatal("cut off before the deadline")
	}
	cut, ok := g.Cutoff(t0.Add(V1.MaxConvergencePass))
	if !ok {
		t.Fatal("no cutoff at the absolute deadline")
	}
	late := commit(t, w.bob)
	admit(t, g, t0.Add(6*time.Second), late)
	if _, ok := g.Outcome(idOf(late)); ok {
		t.Fatal("input after the cutoff joined the frozen batch")
	}
	r, err := g.Apply(cut, t0.Add(6*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Applied) != 10 {
		t.Fatalf("applied %d commits, want the 10 of the batch", len(r.Applied))
	}
	wantOutcome(t, g, late, schema.DispositionDeferred, "", "")
	if d, ok := g.Deadline(); !ok || !d.Equal(t0.Add(7*time.Second)) {
		t.Fatal("the queued input did not open the next pass")
	}
	settle(t, g)
	wantTip(t, g, w.bob)
}
