package convergence

import (
	"bytes"
	"errors"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/fabric-mls/fabric/internal/engine"
	"github.com/fabric-mls/fabric/internal/testpeer"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// joiners are installations one Welcome adds, by member id, with that
// Welcome parsed once and the commit that adds them.
type joiners struct {
	insts   map[string]*engine.Installation
	commit  testpeer.Message
	welcome testpeer.Message
	parsed  *engine.ParsedWelcome
}

// inviteHosted has g invite new hosted installations, one per id, in one
// Welcome.
func inviteHosted(t testing.TB, g *testpeer.Group, ids ...string) *joiners {
	t.Helper()
	j := &joiners{insts: map[string]*engine.Installation{}}
	insts, kps := hostedKeyPackages(t, len(ids))
	for i, id := range ids {
		j.insts[id] = insts[i]
	}
	j.commit, j.welcome = invite(t, g, kps...)
	j.parsed = must[*engine.ParsedWelcome](t)(engine.ParseWelcome(j.welcome.MLS))
	return j
}

// full is id's full join of the Welcome, as an own state.
func (j *joiners) full(t testing.TB, id string) (*engine.State, *engine.JoinInfo) {
	t.Helper()
	st, info, err := j.insts[id].Join(j.welcome.MLS, nil)
	if err != nil {
		t.Fatal(err)
	}
	return st, info
}

// keysOf returns hosted member id's keys at g's tip.
func keysOf(t testing.TB, g *Group, id string) *engine.MemberKeys {
	t.Helper()
	return must[*engine.MemberKeys](t)(must[*engine.State](t)(g.StateOf(id)).MemberKeys())
}

// joinKeys joins id key-only and wants it done.
func (j *joiners) joinKeys(t testing.TB, g *Group, id string, cache *engine.WelcomeCache) *engine.JoinInfo {
	t.Helper()
	info, ok, err := g.JoinWelcome(id, j.insts[id], j.parsed, cache)
	if err != nil || !ok {
		t.Fatalf("%s: key-only join: ok %v, %v", id, ok, err)
	}
	return info
}

// TestJoinWelcome_AsFullJoin: hosted members joined with only their keys
// from a Welcome into the view's tip hold the keys a full join of the same
// Welcome gives, and what it tells of the group, and keep them through a
// restore; they are recipients of a peer's message and decrypt it, follow
// a later commit as their full join's states do, and commit as the mls-go
// peers accept.
func TestJoinWelcome_AsFullJoin(t *testing.T) {
	w := newWorldOf(t, 2)
	g := w.fresh()
	j := inviteHosted(t, w.alice, "h8", "h9")
	w.deliverPeers(j.commit, w.bob, w.carol)
	admit(t, g, t0, j.commit)
	settle(t, g)
	cache := engine.NewWelcomeCache(0)
	own := map[string]*engine.State{}
	for _, id := range []string{"h8", "h9"} {
		info := j.joinKeys(t, g, id, cache)
		st, want := j.full(t, id)
		own[id] = st
		if !keysOf(t, g, id).Equal(must[*engine.MemberKeys](t)(st.MemberKeys())) {
			t.Fatalf("%s: keys of the key-only join are not those of the full join", id)
		}
		if !reflect.DeepEqual(info, want) {
			t.Fatalf("%s: key-only join tells %+v, the full join %+v", id, info, want)
		}
	}
	if got := g.Hosted(); !slices.Equal(got, []string{"h0", "h1", "h8", "h9"}) {
		t.Fatalf("hosted %v after the joins", got)
	}
	g = restarted(t, g)
	for id, st := range own {
		if !keysOf(t, g, id).Equal(must[*engine.MemberKeys](t)(st.MemberKeys())) {
			t.Fatalf("%s: keys changed by a restore", id)
		}
	}

	m := text(t, w.alice, "to the joined")
	for _, id := range []string{"h8", "h9"} {
		if _, err := must[*engine.State](t)(g.StateOf(id)).Decrypt(m.MLS); err != nil {
			t.Fatalf("%s: cannot decrypt a peer's message: %v", id, err)
		}
	}
	wantRecipients(t, admit(t, g, t0.Add(10*time.Second), m), "h0", "h1", "h8", "h9")

	c := commit(t, w.alice)
	admit(t, g, t0.Add(20*time.Second), c)
	settle(t, g)
	wantTip(t, g, w.alice)
	for id, st := range own {
		next, _, err := st.ProcessHandshake(c.MLS)
		if err != nil {
			t.Fatal(err)
		}
		if !keysOf(t, g, id).Equal(must[*engine.MemberKeys](t)(next.MemberKeys())) {
			t.Fatalf("%s: keys after a later commit are not those its full join's state gets", id)
		}
	}
	for id, inst := range j.insts {
		out := must[*engine.Outgoing](t)(g.Commit(id, inst, engine.CommitRequest{}))
		if _, err := clone(t, w.alice).Process(transport(w.alice.ID(), out.Commit)); err != nil {
			t.Fatalf("%s: a peer refuses its commit: %v", id, err)
		}
	}
}

// TestJoinWelcome_BelowTip_FollowsToTip: a key-only join of a Welcome whose
// epoch is a retained node below the tip hosts the member there and follows
// it down to the tip, with the keys its full join's state gets by
// processing the later commit.
func TestJoinWelcome_BelowTip_FollowsToTip(t *testing.T) {
	w := newWorldOf(t, 2)
	g := w.fresh()
	j := inviteHosted(t, w.alice, "h9")
	x2 := commit(t, w.alice)
	admit(t, g, t0, j.commit, x2)
	settle(t, g)
	j.joinKeys(t, g, "h9", engine.NewWelcomeCache(0))
	st, _ := j.full(t, "h9")
	next, _, err := st.ProcessHandshake(x2.MLS)
	if err != nil {
		t.Fatal(err)
	}
	if !keysOf(t, g, "h9").Equal(must[*engine.MemberKeys](t)(next.MemberKeys())) {
		t.Fatal("the member's keys at the tip are not those its full join's state gets")
	}
	wantRecipients(t, admit(t, g, t0.Add(10*time.Second), text(t, w.alice, "hello")), "h0", "h1", "h9")
}

// TestJoinWelcome_EpochNoNodeHolds_NotOK: a Welcome into an epoch no
// retained node holds (its commit not admitted) is no key-only join, even
// when the cache remembers it from a full join: the view is unchanged and
// the caller joins in full.
func TestJoinWelcome_EpochNoNodeHolds_NotOK(t *testing.T) {
	w := newWorldOf(t, 2)
	g := w.fresh()
	j := inviteHosted(t, w.alice, "h8", "h9")
	cache := engine.NewWelcomeCache(0)
	for _, id := range []string{"h8", "h9"} {
		if _, ok, err := g.JoinWelcome(id, j.insts[id], j.parsed, cache); ok || err != nil {
			t.Fatalf("%s: key-only join into an epoch no node holds: ok %v, %v", id, ok, err)
		}
		if _, _, err := j.insts[id].Join(j.welcome.MLS, nil, engine.WithWelcomeCache(cache)); err != nil {
			t.Fatal(err)
		}
	}
	if got := g.Hosted(); !slices.Equal(got, []string{"h0", "h1"}) {
		t.Fatalf("hosted %v after refused joins", got)
	}
	st, _ := j.full(t, "h9")
	if err := g.Join("h9", st); !errors.Is(err, ErrNoNode) {
		t.Fatalf("the full join's state joins a view without its epoch: %v", err)
	}
}

// TestJoinWelcome_BadWelcome: a Welcome that does not parse, one whose
// GroupInfo is tampered with, and one not addressed to the installation
// give an error or no join, never a panic, and leave the view unchanged;
// the full join of the tampered one fails.
func TestJoinWelcome_BadWelcome(t *testing.T) {
	w := newWorldOf(t, 2)
	g := w.fresh()
	j := inviteHosted(t, w.alice, "h9")
	admit(t, g, t0, j.commit)
	settle(t, g)
	cache := engine.NewWelcomeCache(0)
	inst := j.insts["h9"]

	for n := range len(j.welcome.MLS) {
		if _, err := engine.ParseWelcome(j.welcome.MLS[:n]); err == nil {
			pw := must[*engine.ParsedWelcome](t)(engine.ParseWelcome(j.welcome.MLS[:n]))
			if _, ok, _ := g.JoinWelcome("h9", inst, pw, cache); ok {
				t.Fatalf("a Welcome cut to %d bytes joins", n)
			}
		}
	}
	tampered := bytes.Clone(j.welcome.MLS)
	tampered[len(tampered)-1] ^= 1 // in the encrypted GroupInfo
	pw := must[*engine.ParsedWelcome](t)(engine.ParseWelcome(tampered))
	if _, ok, err := g.JoinWelcome("h9", inst, pw, cache); ok {
		t.Fatalf("a tampered Welcome joins: %v", err)
	}
	if _, _, err := inst.Join(tampered, nil); err == nil {
		t.Fatal("the full join of a tampered Welcome succeeds")
	}
	_, ok, err := g.JoinWelcome("h9", newHostedInstallation(t), j.parsed, cache)
	if ok || engine.CategoryOf(err) != schema.CategoryWrongRecipient {
		t.Fatalf("a Welcome to another installation: ok %v, %v; want wrong_recipient", ok, err)
	}
	if _, ok, err := g.JoinWelcome("h9", inst, nil, cache); ok || err != nil {
		t.Fatalf("no Welcome: ok %v, %v", ok, err)
	}
	if got := g.Hosted(); !slices.Equal(got, []string{"h0", "h1"}) {
		t.Fatalf("hosted %v after bad Welcomes", got)
	}
	j.joinKeys(t, g, "h9", cache)
}
