package convergence

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/fabric-mls/fabric/internal/components"
	"github.com/fabric-mls/fabric/internal/engine"
	"github.com/fabric-mls/fabric/internal/testpeer"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// t0 is the scenarios' monotonic origin; time is always passed in.
var t0 = time.Unix(1_700_000_000, 0)

// account returns a 32-byte account id starting with b, so tests control
// the committer order (lower committer wins a tie).
func account(b byte) components.AccountID {
	var a components.AccountID
	a[0] = b
	a[31] = 1
	return a
}

// world is a group of remote testpeer members and hosted members whose
// convergence the test drives. alice (0x80…) is the admin; bob (0x20…) and
// carol (0x40…) are ordinary, so bob < carol < alice by committer order.
type world struct {
	t                 testing.TB
	alice, bob, carol *testpeer.Group
	joined            *engine.State // the first hosted member's state at join
	// hosted are the hosted members' states at join, by id (h0, h1, …),
	// insts their installations.
	hosted map[string]*engine.State
	insts  map[string]*engine.Installation
	conv   *Group
}

func must[T any](t testing.TB) func(T, error) T {
	return func(v T, err error) T {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}

// newWorld is a world of one hosted member, whose view New makes.
func newWorld(t testing.TB) *world {
	t.Helper()
	return newWorldOf(t, 1)
}

// newWorldOf is a world of h hosted members, joined by one Welcome; with
// more than one, fresh gives one view for all of them (NewHosted).
func newWorldOf(t testing.TB, h int) *world {
	t.Helper()
	alice := must[*testpeer.Peer](t)(testpeer.NewWithAccount("alice", account(0x80)))
	bob := must[*testpeer.Peer](t)(testpeer.NewWithAccount("bob", account(0x20)))
	carol := must[*testpeer.Peer](t)(testpeer.NewWithAccount("carol", account(0x40)))
	ag := must[*testpeer.Group](t)(alice.CreateGroup(components.Set{
		Admins:  []components.AccountID{alice.AccountID()},
		Profile: &components.ProfileState{Name: "team"},
	}))
	_, joined, err := ag.Add(bob, carol)
	if err != nil {
		t.Fatal(err)
	}
	w := &world{t: t, alice: ag, bob: joined[0], carol: joined[1], hosted: map[string]*engine.State{}, insts: map[string]*engine.Installation{}}
	insts, kps := hostedKeyPackages(t, h)
	for i, inst := range insts {
		w.insts[fmt.Sprintf("h%d", i)] = inst
	}
	commit, welcome, err := ag.Invite(kps...)
	if err != nil {
		t.Fatal(err)
	}
	w.deliverPeers(commit, w.bob, w.carol)
	for id, inst := range w.insts {
		st, _, err := inst.Join(welcome.MLS, nil)
		if err != nil {
			t.Fatal(err)
		}
		w.hosted[id] = st
	}
	w.joined = w.hosted["h0"]
	w.conv = w.fresh()
	return w
}

// newHostedInstallation is a hosted member's installation whose account
// orders last: the hosted members commit nothing here but by Group.Commit.
func newHostedInstallation(t testing.TB) *engine.Installation {
	t.Helper()
	acct := make([]byte, engine.AccountIDLen)
	if _, err := rand.Read(acct); err != nil {
		t.Fatal(err)
	}
	acct[0] = 0xF0
	return must[*engine.Installation](t)(engine.CreateInstallation(acct, 0))
}

// hostedKeyPackages makes n hosted installations and a KeyPackage of each,
// in the same order, for one Invite.
func hostedKeyPackages(t testing.TB, n int) ([]*engine.Installation, [][]byte) {
	t.Helper()
	insts := make([]*engine.Installation, n)
	var kps [][]byte
	for i := range insts {
		insts[i] = newHostedInstallation(t)
		kps = append(kps, must[[][]byte](t)(insts[i].NewKeyPackages(1))...)
	}
	return insts, kps
}

// fresh returns a new convergence instance from the joined states: New
// for one hosted member, NewHosted for several.
func (w *world) fresh() *Group {
	w.t.Helper()
	if len(w.hosted) == 1 {
		return must[*Group](w.t)(New(V1, must[*engine.State](w.t)(w.joined.Clone())))
	}
	states := map[string]*engine.State{}
	for id, st := range w.hosted {
		states[id] = must[*engine.State](w.t)(st.Clone())
	}
	return must[*Group](w.t)(NewHosted(V1, states))
}

// deliverPeers has remote members process a message.
func (w *world) deliverPeers(m testpeer.Message, to ...*testpeer.Group) {
	w.t.Helper()
	for _, g := range to {
		if _, err := g.Process(m.Transport); err != nil {
			w.t.Fatalf("peer process: %v", err)
		}
	}
}

func clone(t testing.TB, g *testpeer.Group) *testpeer.Group {
	t.Helper()
	return must[*testpeer.Group](t)(g.Clone())
}

func input(m testpeer.Message) Input {
	c, _ := engine.Classify(m.MLS)
	return Input{ID: sha256.Sum256(m.MLS), Class: c.Class, Data: m.MLS}
}

func idOf(m testpeer.Message) ID { return sha256.Sum256(m.MLS) }

// admit admits messages at time at into g.
func admit(t testing.TB, g *Group, at time.Time, ms ...testpeer.Message) Result {
	t.Helper()
	var all Result
	for _, m := range ms {
		r, err := g.Admit(input(m), at)
		if err != nil {
			t.Fatalf("admit: %v", err)
		}
		all.merge(r)
	}
	return all
}

// settle runs the pass to its cutoff and applies it.
func settle(t testing.TB, g *Group) Result {
	t.Helper()
	d, ok := g.Deadline()
	if !ok {
		t.Fatal("no open pass")
	}
	r, err := g.Tick(d)
	if err != nil {
		t.Fatalf("apply: %v", err)
	}
	return r
}

func wantOutcome(t testing.TB, g *Group, m testpeer.Message, d schema.Disposition, c schema.Category, n schema.NamedOutcome) {
	t.Helper()
	o, ok := g.Outcome(idOf(m))
	if !ok {
		t.Fatalf("no outcome for input")
	}
	if o.Disposition != d || o.Category != c || o.NamedOutcome != n {
		t.Fatalf("outcome = %q/%q/%q, want %q/%q/%q", o.Disposition, o.Category, o.NamedOutcome, d, c, n)
	}
}

func appliedIDs(r Result) []ID {
	var out []ID
	for _, a := range r.Applied {
		out = append(out, a.ID)
	}
	return out
}

func ids(ms ...testpeer.Message) []ID {
	var out []ID
	for _, m := range ms {
		out = append(out, idOf(m))
	}
	return out
}

func deliveredIDs(r Result) []ID {
	var out []ID
	for _, d := range r.Delivered {
		out = append(out, d.ID)
	}
	return out
}

func supersededIDs(r Result) []ID {
	var out []ID
	for _, s := range r.Superseded {
		out = append(out, s.ID)
	}
	return out
}

func wantIDs(t testing.TB, what string, got, want []ID) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Fatalf("%s: got %d ids %x, want %d ids %x", what, len(got), got, len(want), want)
	}
}

// wantTip checks the canonical state is the remote member's.
func wantTip(t testing.TB, g *Group, on *testpeer.Group) {
	t.Helper()
	if g.TipEpoch() != on.Epoch() || !bytes.Equal(g.Tip().EpochAuthenticator(), on.EpochAuthenticator()) {
		t.Fatalf("canonical tip epoch %d is not the expected branch (epoch %d)", g.TipEpoch(), on.Epoch())
	}
}

func text(t testing.TB, g *testpeer.Group, s string) testpeer.Message {
	t.Helper()
	return must[testpeer.Message](t)(g.SendText(s))
}

func commit(t testing.TB, g *testpeer.Group) testpeer.Message {
	t.Helper()
	return must[testpeer.Message](t)(g.Commit())
}

func sortIDs(in []ID) []ID {
	out := slices.Clone(in)
	slices.SortFunc(out, func(a, b ID) int { return bytes.Compare(a[:], b[:]) })
	return out
}

func idFor(b []byte) ID { return sha256.Sum256(b) }
