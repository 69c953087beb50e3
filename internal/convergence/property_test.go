package convergence

import (
	"bytes"
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/fabric-mls/fabric/internal/engine"
	"github.com/fabric-mls/fabric/internal/testpeer"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// histories is 50 by default: each costs about 2 s under -race on a loaded
// 2-core machine, and 50 already fork, roll back, withdraw and commit
// proposals; longer runs pass the flag.
var histories = flag.Int("convergence.histories", 50, "random group histories the permutation property test generates")

// histNode is one state of a generated history: every remote member's
// testpeer state at it.
type histNode struct {
	epoch   uint64
	members []*testpeer.Group // alice, bob, carol, minus any that left
}

// history generates a random tree of competing commits (at most
// max_rewind_commits deep, so every fork stays inside the horizon whatever
// the pass boundaries) with app messages on random nodes.
func history(t testing.TB, w *world, rng *rand.Rand) []testpeer.Message {
	t.Helper()
	out, nodes := historyTree(t, w, rng)
	for range 1 + rng.IntN(5) {
		n := nodes[rng.IntN(len(nodes))]
		out = append(out, text(t, n.members[rng.IntN(len(n.members))], "witness"))
	}
	return out
}

// historyTree generates history's tree of commits and returns its nodes.
func historyTree(t testing.TB, w *world, rng *rand.Rand) ([]testpeer.Message, []*histNode) {
	t.Helper()
	root := &histNode{epoch: w.bob.Epoch(), members: []*testpeer.Group{clone(t, w.alice), clone(t, w.bob), clone(t, w.carol)}}
	nodes := []*histNode{root}
	var out []testpeer.Message
	commits := 2 + rng.IntN(5)
	for range commits {
		var open []*histNode
		for _, n := range nodes {
			if n.epoch-root.epoch < V1.MaxRewindCommits {
				open = append(open, n)
			}
		}
		parent := open[rng.IntN(len(open))]
		members := parent.members
		// Sometimes a member's leave request (a Remove proposal of its own
		// leaf) is committed by reference.
		leaver := -1
		if len(members) == 3 && rng.IntN(4) == 0 {
			leaver = 1 + rng.IntN(2) // bob or carol; alice stays admin
			l := clone(t, members[leaver])
			p := must[testpeer.Message](t)(l.Leave())
			out = append(out, p)
			var next []*testpeer.Group
			for i, m := range members {
				if i == leaver {
					continue
				}
				f := clone(t, m)
				if _, err := f.Process(p.Transport); err != nil {
					t.Fatal(err)
				}
				next = append(next, f)
			}
			members = next
		}
		who := rng.IntN(len(members))
		author := clone(t, members[who])
		c := commit(t, author)
		child := &histNode{epoch: parent.epoch + 1}
		for i, m := range members {
			if i == who {
				child.members = append(child.members, author)
				continue
			}
			f := clone(t, m)
			if _, err := f.Process(c.Transport); err != nil {
				t.Fatal(err)
			}
			child.members = append(child.members, f)
		}
		nodes = append(nodes, child)
		out = append(out, c)
	}
	return out, nodes
}

// outcomeOf is what one run ended with.
type outcomeOf struct {
	authenticator []byte
	accepted      []ID
	delivered     []ID
	// keys are every hosted member's keys at the canonical tip.
	keys []*engine.MemberKeys
	// What the run went through, to show the test reaches forks.
	forks, superseded, withdrawn, proposals int
}

// runPermutation feeds the inputs in a random order with random duplicates
// and random pass boundaries to a fresh instance, and settles it. With
// restart, the instance is persisted and restored after every step, and
// app messages keep their send order among themselves: a restored engine
// state has not kept the keys of skipped ratchet generations, so a message
// older than one decrypted before the restart no longer decrypts
// (engine.Restore, a known limit of the snapshot).
func runPermutation(t testing.TB, w *world, in []testpeer.Message, rng *rand.Rand, restart bool) outcomeOf {
	t.Helper()
	order := slices.Clone(in)
	for range len(in) / 2 {
		order = append(order, in[rng.IntN(len(in))]) // duplicates
	}
	rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
	if restart {
		sendOrder(in, order)
	}
	g := w.fresh()
	delivered := map[ID]bool{}
	var o outcomeOf
	note := func(r Result) {
		if r.ForkDetected {
			o.forks++
		}
		o.superseded += len(r.Superseded)
		o.withdrawn += len(r.Withdrawn)
		for _, d := range r.Delivered {
			delivered[d.ID] = true
		}
		for _, id := range r.Withdrawn {
			if !delivered[id] {
				t.Fatal("withdrew a payload that was not delivered")
			}
			delete(delivered, id)
		}
	}
	now := t0
	for _, m := range order {
		now = now.Add(time.Duration(rng.IntN(700)) * time.Millisecond)
		r, err := g.Tick(now)
		if err != nil {
			t.Fatal(err)
		}
		note(r)
		note(admit(t, g, now, m))
		if restart {
			g = restarted(t, g)
		}
	}
	drain(t, g, note)
	if g.Lifecycle() != Stable {
		t.Fatalf("ended %s", g.Lifecycle())
	}
	o.authenticator = g.Tip().EpochAuthenticator()
	for _, id := range g.Hosted() {
		o.keys = append(o.keys, must[*engine.MemberKeys](t)(must[*engine.State](t)(g.StateOf(id)).MemberKeys()))
	}
	if len(o.keys) != len(w.hosted) {
		t.Fatalf("%d hosted members at the tip, want %d", len(o.keys), len(w.hosted))
	}
	for _, m := range in {
		out, ok := g.Outcome(idOf(m))
		if !ok {
			t.Fatal("an input has no outcome")
		}
		if out.Disposition == schema.DispositionAccepted {
			o.accepted = append(o.accepted, idOf(m))
			if out.Class == schema.ClassProposal {
				o.proposals++
			}
		}
		if (out.Disposition == schema.DispositionAccepted) != delivered[idOf(m)] && out.Class == schema.ClassApplication {
			t.Fatal("delivered set and accepted app messages disagree")
		}
	}
	for id := range delivered {
		o.delivered = append(o.delivered, id)
	}
	o.accepted, o.delivered = sortIDs(o.accepted), sortIDs(o.delivered)
	return o
}

// TestPermutationInvariance: random histories with forks, delivered in
// random permutations with random duplicates and random pass boundaries to
// fresh instances, all end with the same canonical epoch authenticator, the
// same accepted set and the same delivered set (DESIGN §5: the result must
// not depend on stream order). The last run of each history restarts from
// its persisted state after every input (durability.md: a restart changes
// no decision). It holds for a view of one hosted member (New) and for one
// view of three (NewHosted, docs/shared-state.md Step 1), whose members'
// keys at the tip are the same in every run too. -convergence.histories=N
// runs more.
func TestPermutationInvariance(t *testing.T) {
	if testing.Short() {
		*histories = min(*histories, 20)
	}
	for _, h := range []int{1, 3} {
		t.Run(fmt.Sprintf("hosted=%d", h), func(t *testing.T) { permutationInvariance(t, newWorldOf(t, h)) })
	}
}

func permutationInvariance(t *testing.T, w *world) {
	const runs = 3
	var forks, superseded, withdrawn, proposals int
	for h := range *histories {
		rng := rand.New(rand.NewPCG(uint64(h), 0x5eed))
		in := history(t, w, rng)
		var first outcomeOf
		for run := range runs {
			got := runPermutation(t, w, in, rng, run == runs-1)
			forks, superseded, withdrawn, proposals = forks+got.forks, superseded+got.superseded, withdrawn+got.withdrawn, proposals+got.proposals
			if run == 0 {
				first = got
				if len(got.accepted) == 0 {
					t.Fatalf("history %d: nothing accepted", h)
				}
				continue
			}
			if !bytes.Equal(got.authenticator, first.authenticator) || !slices.Equal(got.accepted, first.accepted) || !slices.Equal(got.delivered, first.delivered) ||
				!slices.EqualFunc(got.keys, first.keys, (*engine.MemberKeys).Equal) {
				t.Fatalf("history %d run %d: %s", h, run, diff(first, got))
			}
		}
	}
	t.Logf("%d histories, %d runs: %d forks detected, %d commits superseded, %d payloads withdrawn, %d proposals accepted",
		*histories, *histories*runs, forks, superseded, withdrawn, proposals)
	if *histories >= 20 && (forks == 0 || superseded == 0 || withdrawn == 0 || proposals == 0) {
		t.Fatal("the generated histories never forked, rolled back, withdrew or committed a proposal")
	}
}

// drain applies every pass the group has open, handing each result to
// note.
func drain(t testing.TB, g *Group, note func(Result)) {
	t.Helper()
	for {
		d, ok := g.Deadline()
		if !ok {
			return
		}
		r, err := g.Tick(d)
		if err != nil {
			t.Fatal(err)
		}
		note(r)
	}
}

// sendOrder rearranges the app messages of order, in place, into their
// order in in, leaving every other input where it is.
func sendOrder(in, order []testpeer.Message) {
	var at []int
	var apps []testpeer.Message
	for i, m := range order {
		if input(m).Class == schema.ClassApplication {
			at, apps = append(at, i), append(apps, m)
		}
	}
	index := func(m testpeer.Message) int {
		return slices.IndexFunc(in, func(x testpeer.Message) bool { return bytes.Equal(x.MLS, m.MLS) })
	}
	slices.SortStableFunc(apps, func(a, b testpeer.Message) int { return index(a) - index(b) })
	for i, m := range apps {
		order[at[i]] = m
	}
}

func diff(a, b outcomeOf) string {
	return fmt.Sprintf("authenticator equal %v, accepted %d vs %d, delivered %d vs %d",
		bytes.Equal(a.authenticator, b.authenticator), len(a.accepted), len(b.accepted), len(a.delivered), len(b.delivered))
}
