package convergence

import (
	"bytes"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/fabric-mls/fabric/internal/testpeer"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// crashWorld builds a delivered branch and a late, longer branch, so the
// pass frozen at the cutoff rolls back and withdraws.
func crashWorld(t testing.TB) (*world, []testpeer.Message, []testpeer.Message) {
	w := newWorld(t)
	a := clone(t, w.alice)
	x1 := commit(t, w.bob)
	w.deliverPeers(x1, w.carol)
	xw := text(t, w.carol, "on x")
	y1 := commit(t, a)
	y2 := commit(t, a)
	yw := text(t, a, "on y")
	return w, []testpeer.Message{x1, xw}, []testpeer.Message{y1, y2, yw}
}

// TestRestartBetweenCutoffAndApply: the pass state is serialized after the
// cutoff (a crash before apply), restored into a fresh instance, and the
// restored instance resolves the same frozen batch to the same selection,
// dispositions and effects as an uninterrupted run (Marmot durability.md:
// restart cancels nothing, never apply a subset of a frozen batch).
func TestRestartBetweenCutoffAndApply(t *testing.T) {
	w, x, y := crashWorld(t)
	late := commit(t, clone(t, w.carol)) // arrives after the cutoff: next pass
	run := func(crash bool) (*Group, Result) {
		g := w.fresh()
		admit(t, g, t0, x...)
		settle(t, g)
		at := t0.Add(10 * time.Second)
		admit(t, g, at, y...)
		d, _ := g.Deadline()
		cut, ok := g.Cutoff(d)
		if !ok {
			t.Fatal("no cutoff")
		}
		admit(t, g, d.Add(time.Millisecond), late)
		if crash {
			b, err := g.Marshal()
			if err != nil {
				t.Fatal(err)
			}
			if g, err = Unmarshal(V1, b); err != nil {
				t.Fatal(err)
			}
			restored, ok := g.Frozen()
			if !ok || !restored.Start.Equal(cut.Start) || restored.BaseEpoch != cut.BaseEpoch || !slices.Equal(restored.Batch, cut.Batch) {
				t.Fatal("the frozen batch changed across the restart")
			}
			if _, ok := g.Outcome(idOf(late)); ok {
				t.Fatal("post-cutoff input joined the batch after restart")
			}
		}
		res, err := g.Apply(cut, d.Add(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		return g, res
	}
	g1, r1 := run(false)
	g2, r2 := run(true)
	wantIDs(t, "applied", appliedIDs(r1), ids(y[0], y[1]))
	wantIDs(t, "superseded", supersededIDs(r1), ids(x[0]))
	wantIDs(t, "withdrawn", r1.Withdrawn, ids(x[1]))
	wantIDs(t, "restored applied", appliedIDs(r2), appliedIDs(r1))
	wantIDs(t, "restored superseded", supersededIDs(r2), supersededIDs(r1))
	wantIDs(t, "restored withdrawn", r2.Withdrawn, r1.Withdrawn)
	wantIDs(t, "restored delivered", deliveredIDs(r2), deliveredIDs(r1))
	if !slices.Equal(r1.Outcomes, r2.Outcomes) {
		t.Fatalf("outcomes differ after restart:\n%v\n%v", r1.Outcomes, r2.Outcomes)
	}
	for i := range r1.Applied {
		if !r2.Applied[i].Result.Privileged == r1.Applied[i].Result.Privileged || r2.Applied[i].Result.Sender.InboxID != r1.Applied[i].Result.Sender.InboxID {
			t.Fatal("the rebuilt handshake result differs")
		}
	}
	if !bytes.Equal(g1.Tip().EpochAuthenticator(), g2.Tip().EpochAuthenticator()) {
		t.Fatal("restart changed the canonical state")
	}
	wantOutcome(t, g2, y[2], schema.DispositionAccepted, "", "")
	wantOutcome(t, g2, x[1], schema.DispositionInvalidated, "", "")
}

// TestUnmarshalRejectsDamage: damaged bytes fail with ErrCorrupt, never a
// panic, and a group persisted under another policy is refused.
func TestUnmarshalRejectsDamage(t *testing.T) {
	w := newWorld(t)
	b, err := w.conv.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Unmarshal(V1, b); err != nil {
		t.Fatalf("round trip: %v", err)
	}
	for _, bad := range [][]byte{nil, {0x80}, b[:len(b)/2], append(slices.Clone(b), 0)} {
		if _, err := Unmarshal(V1, bad); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("damaged bytes: %v", err)
		}
	}
	other := V1
	other.MaxRewindCommits = 4
	if _, err := Unmarshal(other, b); !errors.Is(err, ErrCorrupt) {
		t.Fatal("restored under another policy")
	}
}
