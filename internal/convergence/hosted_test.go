package convergence

import (
	"bytes"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/fabric-mls/fabric/internal/apppayload"
	"github.com/fabric-mls/fabric/internal/engine"
	"github.com/fabric-mls/fabric/internal/testpeer"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// views is one shared view of a world's hosted members and, beside it,
// each member's own view (New from its own join), fed the same inputs in
// the same order (docs/shared-state.md, Step 1).
type views struct {
	t      testing.TB
	shared *Group
	each   map[string]*Group
}

func (w *world) views() *views {
	w.t.Helper()
	v := &views{t: w.t, shared: w.fresh(), each: map[string]*Group{}}
	for id, st := range w.hosted {
		v.each[id] = must[*Group](w.t)(New(V1, must[*engine.State](w.t)(st.Clone())))
	}
	return v
}

// admit admits messages into every view, checking each result.
func (v *views) admit(at time.Time, ms ...testpeer.Message) Result {
	v.t.Helper()
	var all Result
	for _, m := range ms {
		r, err := v.shared.Admit(input(m), at)
		if err != nil {
			v.t.Fatal(err)
		}
		for id, g := range v.each {
			o, err := g.Admit(input(m), at)
			if err != nil {
				v.t.Fatal(err)
			}
			sameResult(v.t, id, r, o)
		}
		all.merge(r)
	}
	v.check()
	return all
}

// settle applies the open pass of every view at the shared view's
// deadline, which must be every view's.
func (v *views) settle() Result {
	v.t.Helper()
	d, ok := v.shared.Deadline()
	if !ok {
		v.t.Fatal("no open pass")
	}
	r, err := v.shared.Tick(d)
	if err != nil {
		v.t.Fatal(err)
	}
	for id, g := range v.each {
		if e, ok := g.Deadline(); !ok || !e.Equal(d) {
			v.t.Fatalf("%s: deadline %v, shared view's %v", id, e, d)
		}
		o, err := g.Tick(d)
		if err != nil {
			v.t.Fatal(err)
		}
		sameResult(v.t, id, r, o)
	}
	v.check()
	return r
}

// check: every member's own view has the shared view's canonical tip, and
// the member's keys there are those the shared view holds for it.
func (v *views) check() {
	v.t.Helper()
	for id, g := range v.each {
		if g.Lifecycle() != v.shared.Lifecycle() || g.TipEpoch() != v.shared.TipEpoch() ||
			!bytes.Equal(g.Tip().EpochAuthenticator(), v.shared.Tip().EpochAuthenticator()) {
			v.t.Fatalf("%s: its own view's tip is not the shared view's", id)
		}
		want := must[*engine.MemberKeys](v.t)(g.Tip().MemberKeys())
		got := must[*engine.MemberKeys](v.t)(must[*engine.State](v.t)(v.shared.StateOf(id)).MemberKeys())
		if !got.Equal(want) {
			v.t.Fatalf("%s: keys in the shared view are not those of its own view", id)
		}
	}
}

// sameResult: the shared view's result is member id's own view's, and
// what its own view delivers the shared view delivers to it.
func sameResult(t testing.TB, id string, shared, own Result) {
	t.Helper()
	if shared.Duplicate != own.Duplicate || shared.ForkDetected != own.ForkDetected {
		t.Fatalf("%s: duplicate %v/%v, fork detected %v/%v", id, shared.Duplicate, own.Duplicate, shared.ForkDetected, own.ForkDetected)
	}
	wantIDs(t, id+" applied", appliedIDs(shared), appliedIDs(own))
	wantIDs(t, id+" superseded", supersededIDs(shared), supersededIDs(own))
	wantIDs(t, id+" delivered", deliveredIDs(shared), deliveredIDs(own))
	wantIDs(t, id+" withdrawn", shared.Withdrawn, own.Withdrawn)
	if !slices.Equal(shared.Outcomes, own.Outcomes) {
		t.Fatalf("%s: outcomes %v, its own view's %v", id, shared.Outcomes, own.Outcomes)
	}
	for i, d := range shared.Delivered {
		if !slices.Contains(d.Recipients, id) || !bytes.Equal(d.Payload, own.Delivered[i].Payload) {
			t.Fatalf("%s: a payload its own view delivers is not delivered to it", id)
		}
	}
}

func wantRecipients(t testing.TB, r Result, want ...string) {
	t.Helper()
	if len(r.Delivered) == 0 {
		t.Fatal("nothing delivered")
	}
	for _, d := range r.Delivered {
		if !slices.Equal(d.Recipients, want) {
			t.Fatalf("recipients %v, want %v", d.Recipients, want)
		}
	}
}

// TestSharedViewEqualsOwnViews_ForkRaceAndRollback: one view for three
// hosted members selects, applies, supersedes, withdraws and delivers
// exactly what each member's own view does, through a rollback to a
// longer branch and a race of two commits of one epoch, and holds every
// member's keys of the canonical tip.
func TestSharedViewEqualsOwnViews_ForkRaceAndRollback(t *testing.T) {
	w := newWorldOf(t, 3)
	v := w.views()
	a := clone(t, w.alice)
	x1 := commit(t, w.bob)
	w.deliverPeers(x1, w.carol)
	xw := text(t, w.carol, "on x")
	v.admit(t0, x1)
	wantIDs(t, "applied", appliedIDs(v.settle()), ids(x1))
	r := v.admit(t0.Add(10*time.Second), xw)
	wantIDs(t, "delivered", deliveredIDs(r), ids(xw))
	wantRecipients(t, r, "h0", "h1", "h2")

	y1 := commit(t, a)
	y2 := commit(t, a)
	if r := v.admit(t0.Add(20*time.Second), y1); !r.ForkDetected {
		t.Fatal("a divergent edge did not enter Recovering")
	}
	v.admit(t0.Add(20*time.Second), y2)
	r = v.settle()
	wantIDs(t, "applied", appliedIDs(r), ids(y1, y2))
	wantIDs(t, "superseded", supersededIDs(r), ids(x1))
	wantIDs(t, "withdrawn", r.Withdrawn, ids(xw))
	wantOutcome(t, v.shared, xw, schema.DispositionInvalidated, "", "")

	yw := text(t, a, "on y")
	race := must[[]testpeer.Message](t)(a.Fork(2))
	lo, hi := race[0], race[1]
	if d1, d2 := idOf(lo), idOf(hi); bytes.Compare(d1[:], d2[:]) > 0 {
		lo, hi = hi, lo
	}
	if r := v.admit(t0.Add(30*time.Second), hi, lo, yw); !r.ForkDetected {
		t.Fatal("two commits of one epoch did not enter Recovering")
	}
	r = v.settle()
	wantIDs(t, "applied", appliedIDs(r), ids(lo))
	wantIDs(t, "delivered", deliveredIDs(r), ids(yw))
	wantOutcome(t, v.shared, hi, schema.DispositionDeferred, "", "")
	if err := a.Adopt(lo); err != nil {
		t.Fatal(err)
	}
	wantTip(t, v.shared, a)
	wantRecipients(t, v.admit(t0.Add(40*time.Second), text(t, a, "after the race")), "h0", "h1", "h2")
}

// TestMemberAddedOnLosingBranch_NoKeysAfterRollback: a hosted member
// joined by a commit of a branch that a longer one then replaces has no
// keys on the selected branch: it is no hosted member there, and no
// recipient of its messages. The members hosted before see what their own
// views see throughout.
func TestMemberAddedOnLosingBranch_NoKeysAfterRollback(t *testing.T) {
	w := newWorldOf(t, 2)
	v := w.views()
	a := clone(t, w.alice)
	late := newHostedInstallation(t)
	x1, welcome := invite(t, a, must[[][]byte](t)(late.NewKeyPackages(1))[0])
	v.admit(t0, x1)
	v.settle()
	st, _, err := late.Join(welcome.MLS, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := v.shared.Join("h9", st); err != nil {
		t.Fatal(err)
	}
	if got := v.shared.Hosted(); !slices.Equal(got, []string{"h0", "h1", "h9"}) {
		t.Fatalf("hosted %v after the join", got)
	}
	wantRecipients(t, v.admit(t0.Add(10*time.Second), text(t, a, "on x")), "h0", "h1", "h9")

	y1 := commit(t, w.bob)
	y2 := commit(t, w.bob)
	v.admit(t0.Add(20*time.Second), y1, y2)
	r := v.settle()
	wantIDs(t, "superseded", supersededIDs(r), ids(x1))
	if got := v.shared.Hosted(); !slices.Equal(got, []string{"h0", "h1"}) {
		t.Fatalf("hosted %v after the rollback", got)
	}
	if _, err := v.shared.StateOf("h9"); !errors.Is(err, ErrNoMember) {
		t.Fatalf("the member of the losing branch has a state: %v", err)
	}
	wantRecipients(t, v.admit(t0.Add(30*time.Second), text(t, w.bob, "on y")), "h0", "h1")
}

// TestMemberJoinedAfterLaterCommits_FollowsThem: a Welcome that arrives
// after a later commit is retained joins its member at its epoch's node and
// follows it down to the tip, with the keys its own state gets by
// processing that commit.
func TestMemberJoinedAfterLaterCommits_FollowsThem(t *testing.T) {
	w := newWorldOf(t, 2)
	g := w.fresh()
	late := newHostedInstallation(t)
	x1, welcome := invite(t, w.alice, must[[][]byte](t)(late.NewKeyPackages(1))[0])
	x2 := commit(t, w.alice)
	admit(t, g, t0, x1, x2)
	settle(t, g)
	st, _, err := late.Join(welcome.MLS, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Join("h9", must[*engine.State](t)(st.Clone())); err != nil {
		t.Fatal(err)
	}
	own, _, err := st.ProcessHandshake(x2.MLS)
	if err != nil {
		t.Fatal(err)
	}
	want := must[*engine.MemberKeys](t)(own.MemberKeys())
	got := must[*engine.MemberKeys](t)(must[*engine.State](t)(g.StateOf("h9")).MemberKeys())
	if !got.Equal(want) {
		t.Fatal("the late member's keys at the tip are not those its own state gets")
	}
	wantRecipients(t, admit(t, g, t0.Add(10*time.Second), text(t, w.alice, "hello")), "h0", "h1", "h9")
}

// TestMemberRemovedOnSelectedBranch_NoRecipientAfter: a commit that removes
// a hosted member (here the one whose keys the shared state holds) reports
// it removed; after it the member has no state and receives nothing, and
// the others' keys still follow later commits as their own views' do.
func TestMemberRemovedOnSelectedBranch_NoRecipientAfter(t *testing.T) {
	w := newWorldOf(t, 3)
	v := w.views()
	delete(v.each, "h0") // its own view ends at the removal
	rm := must[testpeer.Message](t)(w.alice.RemoveLeaves(w.hosted["h0"].OwnLeaf()))
	w.deliverPeers(rm, w.bob, w.carol)
	v.admit(t0, rm)
	r := v.settle()
	if len(r.Applied) != 1 || !slices.Equal(r.Applied[0].Removed, []string{"h0"}) {
		t.Fatalf("applied %d commits, removing %v", len(r.Applied), r.Applied)
	}
	if got := v.shared.Hosted(); !slices.Equal(got, []string{"h1", "h2"}) {
		t.Fatalf("hosted %v after the removal", got)
	}
	if _, err := v.shared.StateOf("h0"); !errors.Is(err, ErrNoMember) {
		t.Fatalf("the removed member has a state: %v", err)
	}
	v.admit(t0.Add(10*time.Second), commit(t, w.bob))
	v.settle()
	wantRecipients(t, v.admit(t0.Add(20*time.Second), text(t, w.bob, "after")), "h1", "h2")
}

// TestSharedViewRestore_KeepsEveryMembersKeys: Marshal and Unmarshal keep
// every hosted member's keys and a hosted member's own commit in flight:
// after the restore the commit comes back and its committer follows it,
// every member decrypts a peer's message, and every member's commit is
// one the peers accept.
func TestSharedViewRestore_KeepsEveryMembersKeys(t *testing.T) {
	w := newWorldOf(t, 3)
	g := w.fresh()
	c1 := commit(t, w.alice)
	w.deliverPeers(c1, w.bob, w.carol)
	admit(t, g, t0, c1)
	settle(t, g)
	own := must[*engine.Outgoing](t)(g.Commit("h1", w.insts["h1"], engine.CommitRequest{}))
	before := map[string]*engine.MemberKeys{}
	for _, id := range g.Hosted() {
		before[id] = must[*engine.MemberKeys](t)(must[*engine.State](t)(g.StateOf(id)).MemberKeys())
	}
	g = restarted(t, g)
	for id, k := range before {
		if !must[*engine.MemberKeys](t)(must[*engine.State](t)(g.StateOf(id)).MemberKeys()).Equal(k) {
			t.Fatalf("%s: keys changed by the restore", id)
		}
	}

	for _, p := range []*testpeer.Group{w.alice, w.bob, w.carol} {
		if _, err := p.Process(transport(w.alice.ID(), own.Commit)); err != nil {
			t.Fatalf("a peer refuses the hosted member's commit: %v", err)
		}
	}
	if _, err := g.Admit(Input{ID: idFor(own.Commit), Class: schema.ClassCommit, Data: own.Commit}, t0.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	if r := settle(t, g); len(r.Applied) != 1 || len(r.Applied[0].Removed) != 0 {
		t.Fatalf("the own commit: applied %d, removed %v", len(r.Applied), r.Applied)
	}
	wantTip(t, g, w.alice)
	m := text(t, w.alice, "after the restore")
	for _, id := range []string{"h0", "h1", "h2"} {
		st := must[*engine.State](t)(g.StateOf(id))
		if _, err := st.Decrypt(m.MLS); err != nil {
			t.Fatalf("%s: cannot decrypt after the restore: %v", id, err)
		}
		out := must[*engine.Outgoing](t)(g.Commit(id, w.insts[id], engine.CommitRequest{}))
		if _, err := clone(t, w.bob).Process(transport(w.alice.ID(), out.Commit)); err != nil {
			t.Fatalf("%s: a peer refuses its commit after the restore: %v", id, err)
		}
	}
	wantRecipients(t, admit(t, g, t0.Add(time.Minute), m), "h0", "h1", "h2")
}

// TestHostedSend_DeliveredToTheOthers: a hosted member's app message, sent
// through the view on the one secret tree of its hosted members, takes a
// new generation each time (the peers decrypt each), survives a restore,
// and when it comes back is delivered to every other hosted member and
// not to its sender.
func TestHostedSend_DeliveredToTheOthers(t *testing.T) {
	w := newWorldOf(t, 3)
	g := w.fresh()
	payload := must[[]byte](t)(apppayload.Encode(apppayload.NewText("from h1")))
	var sent [][]byte
	for range 2 {
		msg := must[[]byte](t)(g.Encrypt("h1", w.insts["h1"], payload))
		if got, err := w.bob.Process(transport(w.alice.ID(), msg)); err != nil || got.Kind != testpeer.KindApplication {
			t.Fatalf("a peer does not decrypt the hosted member's message: %v", err)
		}
		sent = append(sent, msg)
	}
	g = restarted(t, g)
	for _, msg := range sent {
		r, err := g.Admit(Input{ID: idFor(msg), Class: schema.ClassApplication, Data: msg}, t0)
		if err != nil {
			t.Fatal(err)
		}
		wantRecipients(t, r, "h0", "h2")
		if r.Delivered[0].Sender.Leaf != w.hosted["h1"].OwnLeaf() || !bytes.Equal(r.Delivered[0].Payload, payload) {
			t.Fatal("the delivery is not the hosted member's message")
		}
	}
}

// invite has g invite KeyPackages in one commit.
func invite(t testing.TB, g *testpeer.Group, kps ...[]byte) (commit, welcome testpeer.Message) {
	t.Helper()
	c, w, err := g.Invite(kps...)
	if err != nil {
		t.Fatal(err)
	}
	return c, w
}

func transport(group, mls []byte) schema.TransportMessage {
	return schema.TransportMessage{V: schema.TransportVersion, Group: group, Kind: schema.TransportMLS, Payload: mls}
}

// TestHostedSend_OnlyHostedMemberIsOwnEcho: a message sent by the only
// hosted member comes back as its own echo, as its own view calls it, not
// as a delivery to nobody.
func TestHostedSend_OnlyHostedMemberIsOwnEcho(t *testing.T) {
	w := newWorldOf(t, 1)
	g := must[*Group](t)(NewHosted(V1, map[string]*engine.State{"h0": must[*engine.State](t)(w.hosted["h0"].Clone())}))
	payload := must[[]byte](t)(apppayload.Encode(apppayload.NewText("alone")))
	msg := must[[]byte](t)(g.Encrypt("h0", w.insts["h0"], payload))
	r, err := g.Admit(Input{ID: idFor(msg), Class: schema.ClassApplication, Data: msg}, t0)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Delivered) != 0 || len(r.Outcomes) != 1 || r.Outcomes[0].Category != schema.CategoryOwnEcho {
		t.Fatalf("own message of the only hosted member: delivered %d, outcomes %+v; want own_echo", len(r.Delivered), r.Outcomes)
	}
}
