package convergence

import (
	"bytes"
	"errors"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/fabric-mls/fabric/internal/engine"
	"github.com/fabric-mls/fabric/internal/testpeer"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// solos is a view of a world's hosted members and, beside it, each
// member's standalone engine.State, processing every commit as a member
// on its own does (docs/shared-state.md, A commit, processed once).
type solos struct {
	t    testing.TB
	w    *world
	g    *Group
	solo map[string]*engine.State
	now  time.Time
}

func (w *world) solos() *solos {
	w.t.Helper()
	s := &solos{t: w.t, w: w, g: w.fresh(), solo: map[string]*engine.State{}, now: t0}
	for id, st := range w.hosted {
		s.solo[id] = must[*engine.State](w.t)(st.Clone())
	}
	s.check()
	return s
}

// peers are the world's mls-go peers still in the group.
func (s *solos) peers() []*testpeer.Group {
	var out []*testpeer.Group
	for _, p := range []*testpeer.Group{s.w.alice, s.w.bob, s.w.carol} {
		if !p.Removed() {
			out = append(out, p)
		}
	}
	return out
}

// apply has the peers but from process commit bytes, the view admit and
// apply them, and every standalone member but committer process them;
// it returns what the view applied.
func (s *solos) apply(commit []byte, from *testpeer.Group, committer string) AppliedCommit {
	s.t.Helper()
	for _, p := range s.peers() {
		if p == from {
			continue
		}
		if _, err := p.Process(transport(s.w.alice.ID(), commit)); err != nil {
			s.t.Fatalf("peer process: %v", err)
		}
	}
	s.now = s.now.Add(10 * time.Second)
	if _, err := s.g.Admit(Input{ID: idFor(commit), Class: schema.ClassCommit, Data: commit}, s.now); err != nil {
		s.t.Fatal(err)
	}
	r := settle(s.t, s.g)
	if len(r.Applied) != 1 {
		s.t.Fatalf("applied %d commits, want 1", len(r.Applied))
	}
	for id, st := range s.solo {
		if id == committer {
			continue
		}
		next, res, err := st.ProcessHandshake(commit)
		if err != nil {
			s.t.Fatalf("%s: standalone process: %v", id, err)
		}
		if res.RemovedSelf {
			delete(s.solo, id)
			continue
		}
		s.solo[id] = next
	}
	if committer != "" {
		// Its own commit: the state that made it is the view's; later
		// commits by others check its keys.
		s.solo[committer] = must[*engine.State](s.t)(s.g.StateOf(committer))
	}
	s.check()
	return r.Applied[0]
}

// peer applies a peer's commit.
func (s *solos) peer(from *testpeer.Group, m testpeer.Message) AppliedCommit {
	s.t.Helper()
	return s.apply(m.MLS, from, "")
}

// own applies hosted member id's own commit, made through the view.
func (s *solos) own(id string) AppliedCommit {
	s.t.Helper()
	out := must[*engine.Outgoing](s.t)(s.g.Commit(id, s.w.insts[id], engine.CommitRequest{}))
	a := s.apply(out.Commit, nil, id)
	if len(a.Removed) != 0 {
		s.t.Fatalf("own commit of %s removed %v", id, a.Removed)
	}
	return a
}

// invite has alice add new hosted members in one commit; the first joins
// the view in full (Join), the others key-only (JoinWelcome), and each
// standalone member is its full join.
func (s *solos) invite(ids ...string) {
	s.t.Helper()
	j := inviteHosted(s.t, s.w.alice, ids...)
	s.peer(s.w.alice, j.commit)
	cache := engine.NewWelcomeCache(0)
	for i, id := range ids {
		st, _ := j.full(s.t, id)
		if i == 0 {
			if err := s.g.Join(id, must[*engine.State](s.t)(st.Clone())); err != nil {
				s.t.Fatal(err)
			}
		} else {
			j.joinKeys(s.t, s.g, id, cache)
		}
		s.w.insts[id], s.solo[id] = j.insts[id], st
	}
	s.check()
}

// check: the view's tip is the peers', its hosted members are the
// standalone ones, and each one's keys in the view are its standalone
// state's.
func (s *solos) check() {
	s.t.Helper()
	wantTip(s.t, s.g, s.w.alice)
	if got, want := s.g.Hosted(), slices.Sorted(maps.Keys(s.solo)); !slices.Equal(got, want) {
		s.t.Fatalf("hosted %v, standalone members %v", got, want)
	}
	for id, st := range s.solo {
		if !keysOf(s.t, s.g, id).Equal(must[*engine.MemberKeys](s.t)(st.MemberKeys())) {
			s.t.Fatalf("%s: keys in the view are not its standalone state's", id)
		}
	}
}

// TestHostedKeysEqualStandaloneMembers: through peers' commits, hosted
// members' own commits, invites (joins in full and key-only) and a
// removal of two hosted members (one the carrier), every hosted member's
// keys in the view equal those of a standalone member that processed the
// same commits, and the view's tip is the peers'.
func TestHostedKeysEqualStandaloneMembers(t *testing.T) {
	s := newWorldOf(t, 4).solos()
	s.peer(s.w.bob, commit(t, s.w.bob))
	s.invite("h4", "h5", "h6")
	s.peer(s.w.alice, commit(t, s.w.alice))
	s.own("h2")
	s.peer(s.w.carol, commit(t, s.w.carol))
	gone := []string{"h0", "h5"}
	var leaves []uint32
	for _, id := range gone {
		leaves = append(leaves, keysOf(t, s.g, id).Leaf)
	}
	rm := must[testpeer.Message](t)(s.w.alice.RemoveLeaves(leaves...))
	if a := s.peer(s.w.alice, rm); !slices.Equal(a.Removed, gone) {
		t.Fatalf("removed %v, want %v", a.Removed, gone)
	}
	s.own("h6")
	s.invite("h7", "h8")
	s.peer(s.w.bob, commit(t, s.w.bob))
	s.own("h1")
	s.own("h8")
	s.peer(s.w.alice, commit(t, s.w.alice))
}

// TestOwnCommitWithoutItsState_CommitterDropped: a hosted member's commit
// made outside the view (its standalone state made it) comes back: the
// other hosted members follow it, and its committer, whose new leaf and
// path secrets are not here, is dropped from the view (AppliedCommit
// Removed) rather than kept with stale keys. The rest of the group goes
// on. Once as the carrier, once as another member.
func TestOwnCommitWithoutItsState_CommitterDropped(t *testing.T) {
	for _, committer := range []string{"h0", "h2"} {
		s := newWorldOf(t, 4).solos()
		out := must[*engine.Outgoing](t)(s.solo[committer].Commit(s.w.insts[committer], engine.CommitRequest{}))
		delete(s.solo, committer)
		if a := s.apply(out.Commit, nil, ""); !slices.Equal(a.Removed, []string{committer}) {
			t.Fatalf("%s: the commit left %v without keys", committer, a.Removed)
		}
		if _, err := s.g.StateOf(committer); !errors.Is(err, ErrNoMember) {
			t.Fatalf("%s: the committer has a state in the view: %v", committer, err)
		}
		s.peer(s.w.bob, commit(t, s.w.bob))
		s.own(s.g.Hosted()[0])
		s.now = s.now.Add(10 * time.Second)
		want := slices.DeleteFunc([]string{"h0", "h1", "h2", "h3"}, func(id string) bool { return id == committer })
		wantRecipients(t, admit(t, s.g, s.now, text(t, s.w.carol, "after")), want...)
	}
}

// TestOnlyMemberOwnCommitWithoutItsState_NotFollowed: when the only
// hosted member's own commit comes back without the state that made it,
// nobody here can follow it: the view processes it as the member's own
// state does (hosted.go, follow), which refuses it (mls-go finds no own
// leaf to decrypt the path secret for: invalid_encoding), and the view
// rejects it with that category and stays at its epoch, hosting the
// member; the peers, who processed it, go on.
func TestOnlyMemberOwnCommitWithoutItsState_NotFollowed(t *testing.T) {
	w := newWorldOf(t, 1)
	g := must[*Group](t)(NewHosted(V1, map[string]*engine.State{"h0": must[*engine.State](t)(w.hosted["h0"].Clone())}))
	epoch, auth := g.TipEpoch(), g.Tip().EpochAuthenticator()
	out := must[*engine.Outgoing](t)(must[*engine.State](t)(w.hosted["h0"].Clone()).Commit(w.insts["h0"], engine.CommitRequest{}))
	for _, p := range []*testpeer.Group{w.alice, w.bob, w.carol} {
		if _, err := p.Process(transport(w.alice.ID(), out.Commit)); err != nil {
			t.Fatalf("a peer refuses the commit: %v", err)
		}
	}
	_, _, err := w.hosted["h0"].ProcessHandshake(out.Commit)
	own := engine.CategoryOf(err)
	if own == "" {
		t.Fatal("the member's own state, without the state that made the commit, processes it")
	}
	r, err := g.Admit(Input{ID: idFor(out.Commit), Class: schema.ClassCommit, Data: out.Commit}, t0)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Applied) != 0 || len(r.Outcomes) != 1 || !r.Outcomes[0].Rejected() || r.Outcomes[0].Category != own {
		t.Fatalf("applied %d, outcomes %+v; want one rejection as %s, its own state's", len(r.Applied), r.Outcomes, own)
	}
	if _, ok := g.Deadline(); ok {
		t.Fatal("a pass opened for a commit nobody here can follow")
	}
	if g.TipEpoch() != epoch || !bytes.Equal(g.Tip().EpochAuthenticator(), auth) || !slices.Equal(g.Hosted(), []string{"h0"}) {
		t.Fatal("the view moved")
	}
	c := commit(t, w.bob)
	w.deliverPeers(c, w.alice, w.carol)
	if w.alice.Epoch() != epoch+2 || !bytes.Equal(w.alice.EpochAuthenticator(), w.carol.EpochAuthenticator()) {
		t.Fatal("the peers did not go on")
	}
}

// TestCommitReplacesHostedPathKeys: RFC 9420 §9.2 (forward secrecy).
// After a commit, a peer's and a hosted member's own, no hosted member's
// keys at the view's tip hold a path key the commit replaced: at every
// node of the committer's direct path a hosted member held a key at, the
// key is new.
func TestCommitReplacesHostedPathKeys(t *testing.T) {
	w := newWorldOf(t, 4)
	g := w.fresh()
	now := t0
	apply := func(msg []byte) AppliedCommit {
		now = now.Add(10 * time.Second)
		if _, err := g.Admit(Input{ID: idFor(msg), Class: schema.ClassCommit, Data: msg}, now); err != nil {
			t.Fatal(err)
		}
		r := settle(t, g)
		if len(r.Applied) != 1 {
			t.Fatalf("applied %d commits, want 1", len(r.Applied))
		}
		return r.Applied[0]
	}
	c := commit(t, w.bob)
	w.deliverPeers(c, w.alice, w.carol)
	apply(c.MLS)
	for _, next := range []func() []byte{
		func() []byte { return commit(t, w.carol).MLS },
		func() []byte {
			return must[*engine.Outgoing](t)(g.Commit("h2", w.insts["h2"], engine.CommitRequest{})).Commit
		},
	} {
		old := map[uint32][]byte{}
		for _, id := range g.Hosted() {
			maps.Copy(old, keysOf(t, g, id).Path)
		}
		a := apply(next())
		replaced := 0
		for _, id := range g.Hosted() {
			for n, v := range keysOf(t, g, id).Path {
				if !holds(n, a.Result.Sender.Leaf) || old[n] == nil {
					continue
				}
				replaced++
				if bytes.Equal(v, old[n]) {
					t.Fatalf("%s: node %d keeps the path key the commit of leaf %d replaced", id, n, a.Result.Sender.Leaf)
				}
			}
		}
		if replaced == 0 {
			t.Fatal("no path key held before is on the committer's path")
		}
	}
}

// holds reports whether tree node n (RFC 9420 Appendix C, array
// representation) is a parent node over leaf.
func holds(n, leaf uint32) bool {
	level := uint32(0)
	for n>>level&1 == 1 {
		level++
	}
	if level == 0 {
		return false
	}
	lo := (n + 1 - 1<<level) / 2
	return leaf >= lo && leaf < lo+1<<level
}
