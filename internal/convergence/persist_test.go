package convergence

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

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

// restarted persists g and restores it, checking that the restored group
// persists to the same bytes and that exactly the settled inputs are held
// in chunks.
func restarted(t testing.TB, g *Group) *Group {
	t.Helper()
	checkSettled(t, g)
	b := must[[]byte](t)(g.Marshal())
	r := must[*Group](t)(Unmarshal(V1, b))
	checkSettled(t, r)
	if !bytes.Equal(must[[]byte](t)(r.Marshal()), b) {
		t.Fatal("a restored group persists to other bytes")
	}
	head, chunks, err := g.MarshalSplit()
	if err != nil {
		t.Fatal(err)
	}
	split := must[*Group](t)(UnmarshalSplit(V1, head, chunks))
	checkSettled(t, split)
	if !bytes.Equal(must[[]byte](t)(split.Marshal()), b) {
		t.Fatal("a group restored from its split form persists to other bytes")
	}
	return r
}

// TestSplitHeadStaysSmall: held apart, the settled inputs leave a head that
// does not grow with them, and admitting one more message changes only the
// newest chunk's bytes.
func TestSplitHeadStaysSmall(t *testing.T) {
	w := newWorld(t)
	g := w.fresh()
	sender := clone(t, w.alice)
	admit(t, g, t0, text(t, sender, "first"))
	head0, _ := must2(t)(g.MarshalSplit())
	for i := range 2*chunkCap + 10 {
		admit(t, g, t0, text(t, sender, fmt.Sprintf("message %d", i)))
	}
	head, before := must2(t)(g.MarshalSplit())
	if len(head) > len(head0)+64 {
		t.Fatalf("head grew from %d to %d bytes with %d settled messages", len(head0), len(head), 2*chunkCap+10)
	}
	if len(before) < 3 {
		t.Fatalf("%d chunks for %d settled messages", len(before), 2*chunkCap+10)
	}
	admit(t, g, t0, text(t, sender, "one more"))
	_, after := must2(t)(g.MarshalSplit())
	if len(after) != len(before) {
		t.Fatalf("chunks %d → %d", len(before), len(after))
	}
	for i := range after {
		if changed := !bytes.Equal(after[i], before[i]); changed != (i == len(after)-1) {
			t.Fatalf("chunk %d of %d changed: %v", i, len(after), changed)
		}
	}
	if _, err := UnmarshalSplit(V1, must[[]byte](t)(g.Marshal()), nil); err == nil {
		t.Fatal("a whole Marshal accepted as a split head")
	}
}

func must2(t testing.TB) func([]byte, [][]byte, error) ([]byte, [][]byte) {
	return func(a []byte, b [][]byte, err error) ([]byte, [][]byte) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return a, b
	}
}

// checkSettled: an input is in a chunk exactly when it has settled, and in
// the live set otherwise.
func checkSettled(t testing.TB, g *Group) {
	t.Helper()
	inChunks := map[ID]bool{}
	for _, c := range g.chunks {
		for _, id := range c.ids {
			inChunks[id] = true
		}
	}
	for id, r := range g.inputs {
		if r.frozen != g.settled(r) || inChunks[id] != r.frozen || (g.live[id] != nil) == r.frozen {
			t.Fatalf("input %x: frozen %v, settled %v, in a chunk %v", id[:4], r.frozen, g.settled(r), inChunks[id])
		}
	}
	if len(inChunks)+len(g.live) != len(g.inputs) {
		t.Fatal("chunks or live set hold inputs the group does not")
	}
}

// TestSettledInputsCompact: app messages delivered at the anchor settle
// into chunks of ids: the persisted state grows by about an id per message,
// not by their bytes and payloads; a restart still knows them as accepted
// duplicates.
func TestSettledInputsCompact(t *testing.T) {
	w := newWorld(t)
	g := w.fresh()
	sender := clone(t, w.alice)
	var sent []testpeer.Message
	size := func() int { return len(must[[]byte](t)(g.Marshal())) }
	admit(t, g, t0, text(t, sender, "first"))
	before := size()
	for range 2 * chunkCap {
		m := text(t, sender, "a payload of some length, repeated in every message")
		sent = append(sent, m)
		if r := admit(t, g, t0, m); len(r.Delivered) != 1 {
			t.Fatal("not delivered")
		}
	}
	if grew := size() - before; grew > len(sent)*(len(ID{})+1) {
		t.Fatalf("persisted state grew %d bytes for %d settled messages", grew, len(sent))
	}
	g = restarted(t, g)
	for _, m := range sent {
		wantOutcome(t, g, m, schema.DispositionAccepted, "", "")
		if r := must[Result](t)(g.Admit(input(m), t0)); !r.Duplicate {
			t.Fatal("a settled message is not a duplicate after a restart")
		}
	}
}

// TestReadsVersion1: a state persisted before settled inputs were chunked
// (every input in Inputs, with its bytes) restores to the same decisions,
// its settled inputs chunked.
func TestReadsVersion1(t *testing.T) {
	w, x, y := crashWorld(t)
	g := w.fresh()
	sender := clone(t, w.alice)
	early := []testpeer.Message{text(t, sender, "one"), text(t, sender, "two")}
	admit(t, g, t0, early...)
	admit(t, g, t0, x...)
	settle(t, g)
	admit(t, g, t0.Add(10*time.Second), y...)
	var p persisted
	if err := msgpack.Unmarshal(must[[]byte](t)(g.Marshal()), &p); err != nil {
		t.Fatal(err)
	}
	if len(p.Settled) == 0 {
		t.Fatal("no settled inputs to write as version 1")
	}
	for _, raw := range p.Settled {
		var ps pSettled
		if err := msgpack.Unmarshal(raw, &ps); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < len(ps.IDs); i += len(ID{}) {
			p.Inputs = append(p.Inputs, pInput{
				ID: ps.IDs[i : i+len(ID{})], Class: ps.Class, Epoch: ps.Epoch, HasEpoch: ps.HasEpoch, Disposition: ps.Disposition,
				Node: ps.Node, Delivered: ps.Delivered, Terminal: ps.Terminal, Data: []byte("version 1 kept the bytes"),
			})
		}
	}
	p.V, p.Settled = 1, nil
	v1 := must[*Group](t)(Unmarshal(V1, must[[]byte](t)(msgpack.Marshal(&p))))
	checkSettled(t, v1)
	if len(v1.chunks) == 0 {
		t.Fatal("version 1 inputs were not chunked")
	}
	for _, m := range append(early, append(x, y...)...) {
		want, _ := g.Outcome(idOf(m))
		if got, ok := v1.Outcome(idOf(m)); !ok || got != want {
			t.Fatalf("outcome %+v after reading version 1, want %+v", got, want)
		}
	}
	d, _ := g.Deadline()
	r1 := must[Result](t)(g.Tick(d))
	r2 := must[Result](t)(v1.Tick(d))
	wantIDs(t, "withdrawn", r2.Withdrawn, r1.Withdrawn)
	wantIDs(t, "applied", appliedIDs(r2), appliedIDs(r1))
	wantIDs(t, "delivered", deliveredIDs(r2), deliveredIDs(r1))
}

// TestMarshalReusesUnchangedSnapshots: Marshal snapshots again only the
// retained states a message decrypted at since it last ran, and keeps no
// snapshot of the tip, which nearly every input changes: once a commit
// moves the tip, the former tip's is taken and kept.
func TestMarshalReusesUnchangedSnapshots(t *testing.T) {
	w, x, _ := crashWorld(t)
	g := w.fresh()
	admit(t, g, t0, x...)
	settle(t, g)
	must[[]byte](t)(g.Marshal())
	root := g.root.snap
	if root == nil || g.tip == g.root || g.tip.snap != nil {
		t.Fatal("the anchor's snapshot not kept, or the tip's kept")
	}
	if r := admit(t, g, t0.Add(10*time.Second), text(t, w.carol, "at the tip")); len(r.Delivered) != 1 {
		t.Fatal("not delivered")
	}
	must[[]byte](t)(g.Marshal())
	if &g.root.snap[0] != &root[0] {
		t.Fatal("an unchanged state was snapshotted again")
	}
	if g.tip.snap != nil {
		t.Fatal("the tip's snapshot kept")
	}
	former := g.tip
	admit(t, g, t0.Add(20*time.Second), commit(t, w.bob))
	settle(t, g)
	if g.tip == former {
		t.Fatal("the commit did not move the tip")
	}
	b := must[[]byte](t)(g.Marshal())
	if former.snap == nil || !bytes.Equal(former.snap, must[[]byte](t)(former.state.Snapshot())) || !bytes.Contains(b, former.snap) {
		t.Fatal("the former tip's snapshot not kept as its state's")
	}
	if g.tip.snap != nil {
		t.Fatal("the new tip's snapshot kept")
	}
}

// TestSettledMessageWithdrawnAndDeliveredAgain: a message delivered above
// the anchor is settled, yet a later winner withdraws it, and when its
// branch wins again it is delivered again with the same payload and
// sender; a restart at every step changes none of it.
func TestSettledMessageWithdrawnAndDeliveredAgain(t *testing.T) {
	w := newWorld(t)
	a := clone(t, w.alice)
	x1 := commit(t, w.bob)
	w.deliverPeers(x1, w.carol)
	xw := text(t, w.carol, "on x")
	y1, y2 := commit(t, a), commit(t, a)
	x2 := commit(t, w.bob)
	w.deliverPeers(x2, w.carol)
	x3 := commit(t, w.bob)

	g := w.fresh()
	admit(t, g, t0, x1)
	settle(t, g)
	first := admit(t, g, t0.Add(10*time.Second), xw)
	wantIDs(t, "delivered", deliveredIDs(first), ids(xw))
	if r := g.inputs[idOf(xw)]; !r.frozen || r.payload == nil {
		t.Fatal("a message delivered above the anchor is not settled with its payload")
	}
	g = restarted(t, g)

	admit(t, g, t0.Add(20*time.Second), y1, y2)
	r := settle(t, g)
	wantIDs(t, "withdrawn", r.Withdrawn, ids(xw))
	wantOutcome(t, g, xw, schema.DispositionInvalidated, "", "")
	g = restarted(t, g)

	admit(t, g, t0.Add(30*time.Second), x2, x3)
	r = settle(t, g)
	wantIDs(t, "applied", appliedIDs(r), ids(x1, x2, x3))
	wantIDs(t, "delivered again", deliveredIDs(r), ids(xw))
	if d, f := r.Delivered[0], first.Delivered[0]; !bytes.Equal(d.Payload, f.Payload) || d.Sender.InboxID != f.Sender.InboxID || !bytes.Equal(d.Sender.InstallationKey, f.Sender.InstallationKey) {
		t.Fatal("delivered again with another payload or sender")
	}
	g = restarted(t, g)
	wantOutcome(t, g, xw, schema.DispositionAccepted, "", "")
}
