package convergence

import (
	"bytes"
	"cmp"
	"slices"

	"github.com/fabric-mls/fabric/internal/engine"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// chunkCap bounds the ids of one chunk, so settling one more input
// re-encodes at most this many ids, however many the epoch holds.
const chunkCap = 256

// fixed is everything a settled input's persisted form holds besides its
// id; inputs that settled alike share one chunk.
type fixed struct {
	class     schema.InputClass
	epoch     uint64
	hasEp     bool
	out       Outcome // ID unset
	node      ID
	hasNode   bool
	delivered bool
	terminal  bool
}

// chunk is a run of settled inputs with the same fixed part. enc caches
// its encoding (pSettled) until an input joins it. senders and payloads
// are kept, by index, when the inputs may be delivered again (rewindable).
type chunk struct {
	fixed    fixed
	ids      []ID
	senders  []engine.Member
	gens     []uint32
	payloads [][]byte
	enc      []byte
}

// settled reports whether r can change only when a pass supersedes part of
// the canonical branch or the anchor moves: it is terminal, or it is an app
// message delivered on the canonical branch (it stays accepted and
// delivered while its node stays canonical). A settled input needs no
// bytes again: it is never retried.
func (g *Group) settled(r *record) bool {
	if r.queued {
		return false
	}
	return r.terminal || (r.in.Class == schema.ClassApplication && r.hasNode && r.delivered && g.canonical(g.nodes[r.node]))
}

// rewindable reports whether a settled r may be withdrawn and delivered
// again, so it keeps its sender and payload: it is delivered above the
// anchor. At the anchor no branch supersedes it (a fork at the anchor's
// epoch is stale).
func (g *Group) rewindable(r *record) bool {
	return !r.terminal && r.node != g.root.id
}

func fixedOf(r *record) fixed {
	out := r.out
	out.ID = ID{}
	return fixed{class: r.in.Class, epoch: r.epoch, hasEp: r.hasEp, out: out, node: r.node, hasNode: r.hasNode, delivered: r.delivered, terminal: r.terminal}
}

// freezeIfSettled moves r from the live inputs into the last chunk when it
// has settled, dropping what it no longer needs.
func (g *Group) freezeIfSettled(r *record) {
	if r.frozen || !g.settled(r) {
		return
	}
	r.frozen = true
	r.in.Data = nil
	if !g.rewindable(r) {
		r.payload, r.sender, r.gen = nil, engine.Member{}, 0
	}
	delete(g.live, r.in.ID)
	f := fixedOf(r)
	c := &chunk{fixed: f}
	if n := len(g.chunks); n > 0 && g.chunks[n-1].fixed == f && len(g.chunks[n-1].ids) < chunkCap {
		c = g.chunks[n-1]
		c.enc = nil
	} else {
		g.chunks = append(g.chunks, c)
	}
	c.ids = append(c.ids, r.in.ID)
	if g.rewindable(r) {
		c.senders = append(c.senders, r.sender)
		c.gens = append(c.gens, r.gen)
		c.payloads = append(c.payloads, r.payload)
	}
}

// rechunk rebuilds the live set and the chunks from every input, after a
// pass superseded part of the canonical branch (inputs delivered there are
// live again, to be withdrawn) or the anchor moved (inputs at the old one
// became terminal, old ones were forgotten). The order is canonical (by
// fixed part, then id), so the encoding stays a function of the state.
func (g *Group) rechunk() {
	g.live = map[ID]*record{}
	g.chunks = nil
	var settled []*record
	for _, r := range g.inputs {
		r.frozen = false
		if g.settled(r) {
			settled = append(settled, r)
		} else {
			g.live[r.in.ID] = r
		}
	}
	slices.SortFunc(settled, func(a, b *record) int {
		return cmp.Or(compareFixed(fixedOf(a), fixedOf(b)), bytes.Compare(a.in.ID[:], b.in.ID[:]))
	})
	for _, r := range settled {
		g.freezeIfSettled(r)
	}
}

func compareFixed(a, b fixed) int {
	return cmp.Or(
		cmp.Compare(a.epoch, b.epoch),
		cmp.Compare(a.class, b.class),
		cmpBool(a.hasEp, b.hasEp),
		cmp.Compare(a.out.Disposition, b.out.Disposition),
		cmp.Compare(a.out.Category, b.out.Category),
		cmp.Compare(a.out.NamedOutcome, b.out.NamedOutcome),
		cmpBool(a.hasNode, b.hasNode),
		bytes.Compare(a.node[:], b.node[:]),
		cmpBool(a.delivered, b.delivered),
		cmpBool(a.terminal, b.terminal),
	)
}

func cmpBool(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return 1
	}
	return -1
}
