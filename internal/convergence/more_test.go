package convergence

import (
	"bytes"
	"testing"
	"time"

	"github.com/fabric-mls/fabric/internal/components"
	"github.com/fabric-mls/fabric/internal/testpeer"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// TestUnauthorizedCommitRejected: once replay identifies the parent, a
// commit its committer may not make there is terminal authorization_failed
// with no disposition, and it creates no candidate edge (errors.md).
func TestUnauthorizedCommitRejected(t *testing.T) {
	w := newWorld(t)
	b := clone(t, w.bob)
	bad := must[testpeer.Message](t)(b.SetComponents(components.Set{Admins: []components.AccountID{account(0x20)}, Profile: &components.ProfileState{Name: "mine"}}))
	g := w.fresh()
	r := admit(t, g, t0, bad)
	wantOutcome(t, g, bad, "", schema.CategoryAuthorizationFailed, "")
	if o, _ := g.Outcome(idOf(bad)); !o.Rejected() {
		t.Fatal("not a terminal rejection")
	}
	if r.ForkDetected || len(g.Branches()) != 0 {
		t.Fatal("an unauthorized commit made a candidate edge")
	}
	if _, open := g.Deadline(); open {
		t.Fatal("an invalid commit opened a pass")
	}
}

// TestWitnessesCountDistinctSenders: many messages of one sender in one
// epoch are one witness, so they cannot buy quorum (convergence.md,
// "App-payload witnesses").
func TestWitnessesCountDistinctSenders(t *testing.T) {
	w := newWorld(t)
	bx := clone(t, w.bob)
	x1, x2 := commit(t, bx), commit(t, bx)
	y1 := commit(t, w.carol)
	yw1, yw2, yw3 := text(t, w.carol, "1"), text(t, w.carol, "2"), text(t, w.carol, "3")
	g, res := race(t, w, []testpeer.Message{x1, x2}, []testpeer.Message{y1, yw1, yw2, yw3})
	wantIDs(t, "applied", appliedIDs(res), ids(x1, x2))
	wantOutcome(t, g, y1, schema.DispositionDeferred, "", "")
	for _, m := range []testpeer.Message{yw1, yw2, yw3} {
		wantOutcome(t, g, m, schema.DispositionInvalidated, "", "")
	}
	for _, s := range g.Branches() {
		if s.Digest == idOf(y1) && (s.Witness != 1 || s.Quorum || s.EffectiveDepth != 1) {
			t.Fatalf("losing branch score %+v", s)
		}
	}
}

// TestRecoveringWithholdsDelivery: while Recovering nothing is delivered,
// even a payload of the canonical tip; it is delivered at apply when its
// branch stays canonical (group-state.md: Recovering is candidate material
// only).
func TestRecoveringWithholdsDelivery(t *testing.T) {
	w := newWorld(t)
	m := text(t, w.alice, "at the tip")
	x := must[[]testpeer.Message](t)(w.bob.Fork(2))
	g := w.fresh()
	if r := admit(t, g, t0, x...); !r.ForkDetected || g.Forked() {
		t.Fatalf("fork detected %v, forked %v: a divergent edge recovers, it is no fork of the conversation", r.ForkDetected, g.Forked())
	}
	r := admit(t, g, t0, m)
	if len(r.Delivered) != 0 {
		t.Fatal("delivered while Recovering")
	}
	wantOutcome(t, g, m, schema.DispositionDeferred, "", "")
	r = settle(t, g)
	// The tip moved on, the message's epoch stays canonical: delivered now.
	wantIDs(t, "delivered", deliveredIDs(r), ids(m))
	wantOutcome(t, g, m, schema.DispositionAccepted, "", "")
}

// TestLostRetainedStateIsUnrecoverable: a retained state that no longer
// restores is storage loss inside the horizon: the group is Unrecoverable,
// the inputs needing it are deferred MissingRetainedAnchor, canonical state
// is not mutated, and new input is only retained (retained-history.md).
func TestLostRetainedStateIsUnrecoverable(t *testing.T) {
	w := newWorld(t)
	x1 := commit(t, w.bob)
	x2 := commit(t, w.bob)
	g := w.fresh()
	admit(t, g, t0, x1)
	b := must[[]byte](t)(g.Marshal())
	// Damage x1's retained snapshot in the persisted bytes: the ratchet
	// tree's declared leaf count (its first base64 digit) becomes absurd.
	snap := must[[]byte](t)(g.nodes[idOf(x1)].state.Snapshot())
	at := bytes.Index(b, snap)
	tree := bytes.Index(snap, []byte(`"ratchet_tree":"A`))
	if at < 0 || tree < 0 {
		t.Fatal("retained snapshot not found in the persisted bytes")
	}
	b[at+tree+len(`"ratchet_tree":"`)] = '/'
	g2, err := Unmarshal(V1, b)
	if err != nil {
		t.Fatal(err)
	}
	if g2.Lifecycle() != Unrecoverable || !g2.Forked() {
		t.Fatalf("lifecycle %s, forked %v", g2.Lifecycle(), g2.Forked())
	}
	wantOutcome(t, g2, x1, schema.DispositionDeferred, schema.CategoryMissingHistory, schema.MissingRetainedAnchor)
	admit(t, g2, t0.Add(time.Second), x2)
	if _, ok := g2.Outcome(idOf(x2)); ok {
		t.Fatal("an Unrecoverable group processed input")
	}
	if _, ok := g2.Cutoff(t0.Add(time.Hour)); ok {
		t.Fatal("an Unrecoverable group cut off a pass")
	}
	if g2.TipEpoch() != w.joined.Epoch() {
		t.Fatal("canonical state changed")
	}
}

// TestCompareOrder pins the branch order on scores that differ in exactly
// one step each.
func TestCompareOrder(t *testing.T) {
	base := Score{EffectiveDepth: 2, Quorum: false, Witness: 1, Privileged: false, Committer: "40", Digest: ID{5}}
	better := []func(*Score){
		func(s *Score) { s.EffectiveDepth = 3; s.Witness = 0; s.Committer = "ff" },
		func(s *Score) { s.Quorum = true; s.Witness = 0 },
		func(s *Score) { s.Witness = 2; s.Committer = "ff" },
		func(s *Score) { s.Privileged = true; s.Committer = "ff"; s.Digest = ID{9} },
		func(s *Score) { s.Committer = "20"; s.Digest = ID{9} },
		func(s *Score) { s.Digest = ID{1} },
	}
	for i, f := range better {
		s := base
		f(&s)
		if Compare(s, base) >= 0 || Compare(base, s) <= 0 {
			t.Fatalf("step %d does not decide", i+1)
		}
	}
	if Compare(base, base) != 0 {
		t.Fatal("a branch beats itself")
	}
}

// TestSettledInputsForgotten: inputs settled far behind the anchor leave
// the state, so a long-lived group's persisted state stays bounded.
func TestSettledInputsForgotten(t *testing.T) {
	w := newWorld(t)
	first := text(t, w.carol, "old")
	g := w.fresh()
	admit(t, g, t0, first)
	at := t0
	advance(t, w, g, &at, 3*int(V1.MaxRewindCommits)+1)
	if _, ok := g.Outcome(idOf(first)); ok {
		t.Fatal("an input settled far behind the anchor is still kept")
	}
	if n := len(g.inputs); n > 3*int(V1.MaxRewindCommits)+1 {
		t.Fatalf("%d inputs kept", n)
	}
}

// TestOwnRemovalSelected: a selected commit that removes the hosted member
// is applied with RemovedSelf and no resulting state; the copy is inactive
// (member-departure.md, "Realizing removal").
func TestOwnRemovalSelected(t *testing.T) {
	w := newWorld(t)
	self, ok := w.joined.Member(w.joined.OwnLeaf())
	if !ok {
		t.Fatal("hosted member has no leaf")
	}
	x1 := must[testpeer.Message](t)(w.alice.Remove(self.InboxID))
	g := w.fresh()
	admit(t, g, t0, x1)
	r := settle(t, g)
	if len(r.Applied) != 1 || !r.Applied[0].Result.RemovedSelf || r.Applied[0].State != nil || g.Tip() != nil {
		t.Fatal("own removal not applied as the end of this copy")
	}
	wantOutcome(t, g, x1, schema.DispositionAccepted, "", "")
	if len(g.Retained()) != 1 {
		t.Fatal("retained states after own removal")
	}
}

// TestWitnessQuiescence: a witness restarts quiescence only while it can
// still change a bounded witness score; a repeated sender or a sender past
// the per-epoch cap does not (convergence.md, "Convergence policy").
func TestWitnessQuiescence(t *testing.T) {
	w := newWorld(t)
	x := must[[]testpeer.Message](t)(w.bob.Fork(2))
	a, c := clone(t, w.alice), clone(t, w.carol)
	w.deliverPeers(x[1], a, c)
	b := w.bob
	if err := b.Adopt(x[1]); err != nil {
		t.Fatal(err)
	}
	g := w.fresh()
	admit(t, g, t0, x...)
	step := func(at time.Duration, m testpeer.Message, restarts bool) {
		t.Helper()
		before, _ := g.Deadline()
		admit(t, g, t0.Add(at), m)
		after, _ := g.Deadline()
		if restarted := !after.Equal(before); restarted != restarts {
			t.Fatalf("at %v: restarted %v, want %v", at, restarted, restarts)
		}
	}
	step(100*time.Millisecond, text(t, a, "first sender"), true)
	step(200*time.Millisecond, text(t, a, "same sender again"), false)
	step(300*time.Millisecond, text(t, c, "second sender"), true)
	step(400*time.Millisecond, text(t, b, "third sender, score capped"), false)
}
