package convergence

import (
	"bytes"
	"slices"
	"time"

	"github.com/fabric-mls/fabric/internal/engine"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// Cutoff closes the open pass when its deadline has passed at now and
// freezes its batch: every input admitted so far. Input admitted later
// waits for the next pass. It returns false when no pass is due.
func (g *Group) Cutoff(now time.Time) (Cutoff, bool) {
	d, ok := g.Deadline()
	if !ok || now.Before(d) || g.lifecycle == Unrecoverable {
		return Cutoff{}, false
	}
	g.pass.frozen = true
	g.pass.batch = g.pass.batch[:0]
	for _, r := range g.sortedRecords() {
		if !r.queued {
			g.pass.batch = append(g.pass.batch, r.in.ID)
		}
	}
	return g.cutoff(), true
}

// Tick closes and applies the pass when it is due; the caller calls it at
// Deadline.
func (g *Group) Tick(now time.Time) (Result, error) {
	c, ok := g.Cutoff(now)
	if !ok {
		return Result{}, nil
	}
	return g.Apply(c, now)
}

// Apply resolves the frozen pass: it reaches a fixed point over the batch,
// selects the canonical branch, applies it, assigns dispositions, prunes to
// the new anchor and returns the lifecycle to Stable. Then the input queued
// after the cutoff is processed (it may open the next pass). now is only
// scheduling for that next pass.
func (g *Group) Apply(c Cutoff, now time.Time) (Result, error) {
	var res Result
	if g.lifecycle == Unrecoverable {
		return res, ErrUnrecoverable
	}
	p := g.pass
	if p == nil || !p.frozen || !p.start.Equal(c.Start) || p.base != c.BaseEpoch || !slices.EqualFunc(p.batch, c.Batch, func(a, b ID) bool { return a == b }) {
		return res, ErrNoCutoff
	}
	g.retry(p.last, &res)
	best := g.best(g.root, p.base)
	oldPath, newPath := g.path(g.tip), g.path(best)
	for _, n := range oldPath {
		if !slices.Contains(newPath, n) {
			res.Superseded = append(res.Superseded, Superseded{ID: n.id, Epoch: n.epoch})
		}
	}
	for _, n := range newPath {
		if slices.Contains(oldPath, n) {
			continue
		}
		if n.result == nil {
			if err := g.rebuildResult(n); err != nil {
				return Result{}, err
			}
		}
		res.Applied = append(res.Applied, AppliedCommit{
			ID: n.id, SourceEpoch: n.epoch - 1, Result: n.result, State: n.state, Proposals: slices.Clone(n.consumed),
			Removed: left(n), Hosted: n.roster,
		})
	}
	g.tip = best
	if len(res.Superseded) > 0 {
		g.rechunk()
	}
	g.pass = nil
	if g.lifecycle == Recovering {
		g.lifecycle = Stable
	}
	g.redecide(&res)
	g.prune(&res)
	g.retry(now, &res)
	canonicalOrder(res.Delivered)
	// Input admitted after the cutoff follows, in admission order: each is
	// processed as it would have been on arrival.
	queued := g.queue
	g.queue = nil
	for _, id := range queued {
		r := g.inputs[id]
		r.queued = false
		g.process(r, now, &res)
	}
	slices.SortFunc(res.Outcomes, func(a, b Outcome) int { return bytes.Compare(a.ID[:], b.ID[:]) })
	res.Outcomes = compactOutcomes(res.Outcomes)
	return res, nil
}

// compactOutcomes keeps the last outcome of each input (sorted by id,
// stable, so the last of a run is the newest).
func compactOutcomes(in []Outcome) []Outcome {
	out := in[:0]
	for i, o := range in {
		if i+1 < len(in) && in[i+1].ID == o.ID {
			continue
		}
		out = append(out, o)
	}
	return out
}

// path returns the nodes from the anchor's child to n, oldest first.
func (g *Group) path(n *node) []*node {
	var out []*node
	for x := n; x != nil && x != g.root; x = x.parent {
		out = append(out, x)
	}
	slices.Reverse(out)
	return out
}

// rebuildResult replays a node's commit against its parent again, after a
// restore dropped the in-memory handshake result.
func (g *Group) rebuildResult(n *node) error {
	r := g.inputs[n.id]
	refs, err := engine.ConsumedProposalRefs(r.in.Data)
	if err != nil {
		return err
	}
	c, err := g.replay(n.parent, r.in.Data, refs, true)
	if err != nil {
		return err
	}
	n.result = c.result
	return nil
}

// redecide gives every input attached to a retained node its disposition
// against the applied canonical branch (convergence.md, "Applying the
// selected branch").
func (g *Group) redecide(res *Result) {
	consumed := map[ID]bool{}
	for _, n := range g.path(g.tip) {
		for _, id := range n.consumed {
			consumed[id] = true
		}
	}
	for _, r := range g.sortedLive() {
		if r.terminal || r.queued || !r.hasNode {
			continue
		}
		n := g.nodes[r.node]
		switch r.in.Class {
		case schema.ClassCommit:
			if g.canonical(n) {
				g.set(r, schema.DispositionAccepted, "", "", res)
			} else {
				// Valid on an eligible losing branch: deferred until it
				// wins a later pass or becomes permanently ineligible.
				g.set(r, schema.DispositionDeferred, "", "", res)
			}
		case schema.ClassProposal:
			if consumed[r.in.ID] {
				g.set(r, schema.DispositionAccepted, "", "", res)
			} else {
				g.set(r, schema.DispositionDeferred, "", "", res)
			}
		case schema.ClassApplication:
			g.decideApp(r, res)
		}
	}
}

// prune releases what the new anchor (tip − max_rewind_commits) leaves
// outside the rollback horizon: canonical states below the anchor and every
// branch forking below it, whose retained-only inputs become stale.
func (g *Group) prune(res *Result) {
	anchor := uint64(0)
	if g.tip.epoch > g.policy.MaxRewindCommits {
		anchor = g.tip.epoch - g.policy.MaxRewindCommits
	}
	if anchor <= g.root.epoch {
		return
	}
	path := g.path(g.tip)
	newRoot := g.root
	for _, n := range path {
		if n.epoch == anchor {
			newRoot = n
		}
	}
	keep := map[*node]bool{}
	var mark func(*node)
	mark = func(n *node) {
		keep[n] = true
		for _, c := range n.children {
			mark(c)
		}
	}
	mark(newRoot)
	for _, r := range g.sortedRecords() {
		if r.terminal || r.queued || !r.hasNode {
			continue
		}
		n := g.nodes[r.node]
		if keep[n] {
			continue
		}
		r.hasNode = false
		switch {
		case r.out.Disposition == schema.DispositionAccepted:
			// Stays accepted; its state is simply no longer retained.
			r.terminal = true
			r.in.Data, r.payload = nil, nil
		case r.in.Class == schema.ClassCommit && r.epoch < anchor:
			g.stale(r, schema.BeyondAnchor, res)
		default:
			g.stale(r, "", res)
		}
	}
	for id, n := range g.nodes {
		if !keep[n] {
			delete(g.nodes, id)
		}
	}
	newRoot.parent = nil
	g.root = newRoot
	// Forget settled inputs well behind the anchor, so a long-lived group's
	// state stays bounded. A duplicate that old is the caller's durable
	// dedup's to catch (ingest, by its first outcome record), before it reaches Admit.
	for id, r := range g.inputs {
		if r.terminal && !r.queued && (!r.hasEp || r.epoch+2*g.policy.MaxRewindCommits < g.root.epoch) {
			delete(g.inputs, id)
		}
	}
	g.rechunk()
}
